"""Run in the optimum test venv (tests/optimum/constraints.txt): for each folder, `ORTModelForSeq2SeqLM` (text) or
`ORTModelForSpeechSeq2Seq` (speech) `.from_pretrained(folder)` from the folder alone, once, then greedy on each of
its jobs; prints, per folder and job, the input names and file of each graph it loaded, whether its decoder is the
merged one (`use_cache_branch`), and the generated tokens, as a JSON list (one list per folder) on the last line.

    python seq2seq.py RUNS.json NEW_TOKENS

RUNS.json is a list of `{"folder": FOLDER, "kind": "text" | "speech", "jobs": [...]}`: one process for every folder
(#48: optimum's imports once), each folder loaded once for all its jobs. A job is

    [[5, 6, 7]]          text: token ids, one row per text; rows of other lengths are right-padded with
                         pad_token_id, their attention mask 0 there
    [0.1, -0.2, ...]     speech: raw audio, or [[...], [...]]: a batch of waveforms, through the folder's feature
                         extractor (which pads them)

or `{"inputs": ..., "decoder_input_ids": [[...], ...]}`: a decoder prompt of several tokens per row, which the first
(no-past) decoder call runs at once. A folder that fails gives `{"error": traceback}` in place of its list, so the
other folders' results still come back.
"""

import json
import sys
import traceback

import torch
from ending import end_without_teardown  # tests/optimum/ending.py
from optimum.onnxruntime import ORTModelForSeq2SeqLM, ORTModelForSpeechSeq2Seq
from transformers import AutoFeatureExtractor


def generate(folder: str, kind: str, jobs: list, steps: int) -> list[dict]:
    """Each job's result on the folder, loaded once."""
    if kind == "speech":
        model = ORTModelForSpeechSeq2Seq.from_pretrained(folder, use_cache=True, use_io_binding=False)
        extractor = AutoFeatureExtractor.from_pretrained(folder)
    else:
        model = ORTModelForSeq2SeqLM.from_pretrained(folder, use_cache=True, use_io_binding=False)
    graphs = {"encoder": model.encoder, "decoder": model.decoder}
    if getattr(model, "decoder_with_past", None) is not None:  # two decoder files, not decoder_model_merged.onnx
        graphs["decoder_with_past"] = model.decoder_with_past
    results = []
    for data in jobs:
        prompt = None
        if isinstance(data, dict):
            prompt = data.get("decoder_input_ids")
            data = data["inputs"]
        if kind == "speech":
            features = extractor(data, sampling_rate=extractor.sampling_rate, return_tensors="pt").input_features
            inputs = {"input_features": features}
        else:
            width = max(len(row) for row in data)
            pad = model.config.pad_token_id
            ids = torch.tensor([row + [pad] * (width - len(row)) for row in data])
            mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in data])
            inputs = {"input_ids": ids, "attention_mask": mask}
        if prompt is not None:
            inputs["decoder_input_ids"] = torch.tensor(prompt)
        out = model.generate(**inputs, max_new_tokens=steps, min_new_tokens=steps, do_sample=False, num_beams=1)
        results.append({"inputs": {name: list(part.input_names) for name, part in graphs.items()},
                        "files": {name: part.path.name for name, part in graphs.items()},
                        "merged": model.decoder.is_merged, "batch": int(out.shape[0]), "tokens": out.tolist()})
    return results


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as handle:
        runs = json.load(handle)
    steps = int(sys.argv[2])
    done = []
    for run in runs:
        try:
            done.append(generate(run["folder"], run["kind"], run["jobs"], steps))
        except Exception:  # noqa: BLE001 - said for this folder; the others still run
            done.append({"error": traceback.format_exc()})
    print(json.dumps(done))


main()
end_without_teardown()  # the answer is printed: no interpreter teardown (#48)
