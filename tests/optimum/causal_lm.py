"""Run in the optimum test venv (tests/optimum/constraints.txt): `ORTModelForCausalLM.from_pretrained(folder)` from
the folder alone, greedy over a left-padded batch; prints the new tokens of each row as JSON on the last line.

    python causal_lm.py FOLDER '[[5, 6, 7], [5]]' PAD EOS NEW_TOKENS
    python causal_lm.py --runs RUNS.json PAD EOS NEW_TOKENS

`--runs`: RUNS.json is a list of `{"folder": FOLDER, "prompts": [[...], ...]}`, every folder in this one process
(#48: optimum's imports paid once), each loaded alone; the last line is the list of their results, a folder that
fails giving `{"error": traceback}` in place of its result so the other folders' still come back.
"""

import json
import sys
import traceback

import torch
from ending import end_without_teardown  # tests/optimum/ending.py
from optimum.onnxruntime import ORTModelForCausalLM


def greedy(folder: str, prompts: list[list[int]], pad: int, eos: int, steps: int) -> dict:
    """The graph's input names and each row's new tokens."""
    model = ORTModelForCausalLM.from_pretrained(folder, use_cache=True, use_io_binding=False)
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=steps, do_sample=False, pad_token_id=pad,
                         eos_token_id=eos)
    return {"inputs": list(model.input_names), "new": out[:, width:].tolist()}


def guarded(run: dict, pad: int, eos: int, steps: int) -> dict:
    try:
        return greedy(run["folder"], run["prompts"], pad, eos, steps)
    except Exception:  # noqa: BLE001 - reported per folder, as the test's failure message
        return {"error": traceback.format_exc()}


if sys.argv[1] == "--runs":
    with open(sys.argv[2], encoding="utf-8") as handle:
        runs = json.load(handle)
    pad, eos, steps = map(int, sys.argv[3:6])
    print(json.dumps([guarded(run, pad, eos, steps) for run in runs]))
else:
    folder, prompts, pad, eos, steps = sys.argv[1], json.loads(sys.argv[2]), *map(int, sys.argv[3:6])
    print(json.dumps(greedy(folder, prompts, pad, eos, steps)))

end_without_teardown()  # the answer is printed: no interpreter teardown (#48)
