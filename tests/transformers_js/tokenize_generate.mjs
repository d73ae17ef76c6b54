// Tokenize a text with the folder's own tokenizer and generate greedily, in transformers.js, from an exported folder
// (the "transformers.js" layout):
//   node tokenize_generate.mjs <exports root> <target name> '<text>' <max new tokens>
// Prints {"ids": the prompt's ids, "out": prompt and generated ids, "decoded": the prompt decoded} as one JSON object.
// Run from a folder whose node_modules holds @huggingface/transformers.
import { env, AutoTokenizer, AutoModelForCausalLM } from '@huggingface/transformers';

const [root, name, text, maxNewTokens] = process.argv.slice(2);
env.allowRemoteModels = false;
env.localModelPath = root;
const tokenizer = await AutoTokenizer.from_pretrained(name);
const model = await AutoModelForCausalLM.from_pretrained(name, { device: 'cpu' });
const inputs = tokenizer(text);
const n = Number(maxNewTokens);
const out = await model.generate({ ...inputs, max_new_tokens: n, min_new_tokens: n, do_sample: false });
const ids = Array.from(inputs.input_ids.data, Number);
console.log(JSON.stringify({ ids, out: Array.from(out.data, Number),
                             decoded: tokenizer.decode(ids, { skip_special_tokens: true }) }));
