// Greedy generation with an encoder-decoder model in transformers.js from an exported folder (the "transformers.js"
// layout: onnx/encoder_model.onnx + onnx/decoder_model_merged.onnx):
//   node seq2seq.mjs <exports root> <target name> speech <inputs.json: the waveform> <max new tokens>
//       the folder's own preprocessor_config.json makes the log-mel features (AutoFeatureExtractor), then
//       AutoModelForSpeechSeq2Seq (Whisper) generates
//   node seq2seq.mjs <exports root> <target name> text <inputs.json: the token ids> <max new tokens>
//       AutoModelForSeq2SeqLM (T5, BART, Marian) generates from the ids
// Prints the generated ids (decoder start included) as one JSON list. Run from a folder whose node_modules holds
// @huggingface/transformers (tests/test_seq2seq_onnx.py copies it there).
import { readFileSync } from 'node:fs';
import { env, AutoFeatureExtractor, AutoModelForSeq2SeqLM, AutoModelForSpeechSeq2Seq, Tensor }
    from '@huggingface/transformers';

const [root, name, kind, inputsFile, maxNewTokens] = process.argv.slice(2);
env.allowRemoteModels = false;
env.localModelPath = root;
const data = JSON.parse(readFileSync(inputsFile, 'utf-8'));
const n = Number(maxNewTokens);
const options = { max_new_tokens: n, min_new_tokens: n, do_sample: false, num_beams: 1 };
let out;
if (kind === 'speech') {
    const extractor = await AutoFeatureExtractor.from_pretrained(name);
    const { input_features } = await extractor(Float32Array.from(data));
    const model = await AutoModelForSpeechSeq2Seq.from_pretrained(name, { device: 'cpu' });
    out = await model.generate({ inputs: input_features, ...options });
} else {
    const model = await AutoModelForSeq2SeqLM.from_pretrained(name, { device: 'cpu' });
    const input_ids = new Tensor('int64', BigInt64Array.from(data.map(BigInt)), [1, data.length]);
    const attention_mask = new Tensor('int64', BigInt64Array.from(data.map(() => 1n)), [1, data.length]);
    out = await model.generate({ input_ids, attention_mask, ...options });
}
console.log(JSON.stringify(Array.from(out.data, Number)));
