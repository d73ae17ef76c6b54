// An image pipeline with transformers.js from an exported folder (the "transformers.js" layout): the folder's own
// preprocessor_config.json prepares the image.
//   node image.mjs <exports root> <target name> <task> <width> <height> '<RGB bytes as JSON>'
// Prints the output tensor's dims and data as one JSON object. Run from a folder whose node_modules holds
// @huggingface/transformers (tests/test_folder_files.py copies it there).
import { env, pipeline, RawImage } from '@huggingface/transformers';

const [root, name, task, width, height, bytesJson] = process.argv.slice(2);
env.allowRemoteModels = false;
env.localModelPath = root;
const pipe = await pipeline(task, name, { device: 'cpu' });
const image = new RawImage(Uint8ClampedArray.from(JSON.parse(bytesJson)), Number(width), Number(height), 3);
const out = await pipe(image);
const tensor = Array.isArray(out) ? out[0] : out;
console.log(JSON.stringify(tensor.dims ? { dims: tensor.dims, data: Array.from(tensor.data, Number) } : { result: out }));
