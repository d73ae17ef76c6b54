"""Run in the optimum test venv (tests/optimum/constraints.txt): `ORTModelForCausalLM.from_pretrained(folder)` from
the folder alone, greedy over a left-padded batch; prints the new tokens of each row as JSON on the last line.

    python causal_lm.py FOLDER '[[5, 6, 7], [5]]' PAD EOS NEW_TOKENS
"""

import json
import sys

import torch
from optimum.onnxruntime import ORTModelForCausalLM

folder, prompts, pad, eos, steps = sys.argv[1], json.loads(sys.argv[2]), *map(int, sys.argv[3:6])
model = ORTModelForCausalLM.from_pretrained(folder, use_cache=True, use_io_binding=False)
width = max(map(len, prompts))
ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=steps, do_sample=False, pad_token_id=pad,
                     eos_token_id=eos)
print(json.dumps({"inputs": list(model.input_names), "new": out[:, width:].tolist()}))
