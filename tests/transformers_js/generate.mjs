// Greedy generation with transformers.js from an exported folder (the "transformers.js" layout):
//   node generate.mjs <exports root> <target name> '<prompt ids as JSON>' <max new tokens>
// Prints the prompt and the generated ids as one JSON list. Run from a folder whose node_modules holds
// @huggingface/transformers (tests/test_weights_once.py copies it there).
import { env, AutoModelForCausalLM, Tensor } from '@huggingface/transformers';

const [root, name, promptJson, maxNewTokens] = process.argv.slice(2);
env.allowRemoteModels = false;
env.localModelPath = root;
const model = await AutoModelForCausalLM.from_pretrained(name, { device: 'cpu' });
const ids = JSON.parse(promptJson);
const input_ids = new Tensor('int64', BigInt64Array.from(ids.map(BigInt)), [1, ids.length]);
const attention_mask = new Tensor('int64', BigInt64Array.from(ids.map(() => 1n)), [1, ids.length]);
const n = Number(maxNewTokens);
const out = await model.generate({ input_ids, attention_mask, max_new_tokens: n, min_new_tokens: n, do_sample: false });
console.log(JSON.stringify(Array.from(out.data, Number)));
