// A text pipeline with transformers.js from an exported folder (the "transformers.js" layout): the folder's own
// tokenizer.json and tokenizer_config.json tokenize the text in transformers.js itself.
//   node text.mjs <exports root> <target name> <task> '<texts as JSON>'
// Prints {"dims", "data"} of the output tensor. Run from a folder whose node_modules holds @huggingface/transformers.
import { env, pipeline } from '@huggingface/transformers';

const [root, name, task, textsJson] = process.argv.slice(2);
env.allowRemoteModels = false;
env.localModelPath = root;
const pipe = await pipeline(task, name, { device: 'cpu' });
const out = await pipe(JSON.parse(textsJson));
console.log(JSON.stringify({ dims: out.dims, data: Array.from(out.data, Number) }));
