"""What an owner declares, with no torch: the recipe model and its JSON Schema, dimensions, layout rules, variants.

Modules, in the order a recipe is read:

```
load.py ──► model.py (Recipe, Target, Inputs, Generation, Validation)
 (the three forms, JSON     ├── dims.py      named dimensions and per-input axis specs
  paths and lines:           ├── layout.py    rules between a target's fields (merged, layout, formats)
  jsonpos.py)                ├── variants.py  quantized/half variants of a target
                             └── budgets.py   the quality budget of a quantized/half target, defaults per kind
```

Beside them: `_base.py` (the strict pydantic base the recipe's models share), `model_limits.py` (what a recipe may
ask of a model, checked from its `config.json`), `runner_layout.py` (an ExecuTorch target's program layout:
`layout`, `custom_ops`, `external_weights`).

`python -m exporters.recipe` rewrites `export_config.schema.json` from the models.
"""
