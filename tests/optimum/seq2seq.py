"""Run in the optimum test venv (tests/optimum/constraints.txt): `ORTModelForSeq2SeqLM` (text) or
`ORTModelForSpeechSeq2Seq` (speech) `.from_pretrained(folder)` from the folder alone, greedy; prints the input names
and file of each graph it loaded, whether its decoder is the merged one (`use_cache_branch`), and the generated tokens
as JSON on the last line.

    python seq2seq.py FOLDER text INPUTS.json NEW_TOKENS     # [[5, 6, 7]]: token ids
    python seq2seq.py FOLDER speech INPUTS.json NEW_TOKENS   # [0.1, -0.2, ...]: raw audio, through the folder's
                                                             # feature extractor
"""

import json
import sys

import torch
from optimum.onnxruntime import ORTModelForSeq2SeqLM, ORTModelForSpeechSeq2Seq
from transformers import AutoFeatureExtractor

folder, kind, steps = sys.argv[1], sys.argv[2], int(sys.argv[4])
with open(sys.argv[3], encoding="utf-8") as handle:
    data = json.load(handle)
if kind == "speech":
    model = ORTModelForSpeechSeq2Seq.from_pretrained(folder, use_cache=True, use_io_binding=False)
    extractor = AutoFeatureExtractor.from_pretrained(folder)
    features = extractor(data, sampling_rate=extractor.sampling_rate, return_tensors="pt").input_features
    inputs = {"input_features": features}
else:
    model = ORTModelForSeq2SeqLM.from_pretrained(folder, use_cache=True, use_io_binding=False)
    ids = torch.tensor(data)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
out = model.generate(**inputs, max_new_tokens=steps, min_new_tokens=steps, do_sample=False, num_beams=1)
graphs = {"encoder": model.encoder, "decoder": model.decoder}
if getattr(model, "decoder_with_past", None) is not None:  # two decoder files, not decoder_model_merged.onnx
    graphs["decoder_with_past"] = model.decoder_with_past
print(json.dumps({"inputs": {name: list(part.input_names) for name, part in graphs.items()},
                  "files": {name: part.path.name for name, part in graphs.items()},
                  "merged": model.decoder.is_merged, "tokens": out.tolist()}))
