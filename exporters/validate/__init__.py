"""Every artifact from disk against the eager model, then measured in its own runtime.

```
checks.py (each component at traced and unseen shapes; the verdicts)
   ├─► parity.py / greedy.py     generation parity through the exported graphs, eager's token-selection rules
   ├─► vision_language.py        the model's own forward with its stages replaced by their graphs
   ├─► sliding.py                sliding-window caches as exported
   ├─► quality.py                task metrics of quantized and half-precision variants
   │      └─► judged_rows.py     a decoder fed an image's (audio's) features: its text rows judged, not the image's
   ├─► dtype_files.py            each dtype file of a transformers.js folder, judged with its variant's budget
   ├─► native_log.py             a runtime's own words (its stderr) joined to the error
   └─► benchmark.py              size, load time, latency, tokens/s
```

Beside them:

- `eager_side.py`: everything a target's checks take from the eager model, computed while the target exports;
- `subject.py`: what validation is handed, as two objects: the eager model's side and the saved target's folder;
- `multimodal_runner.py`: generation parity of a MultimodalRunner program, fed as that runner feeds its methods;
- `tolerances.py`: the atol/rtol an artifact is held to (the format's default, then the recipe's overrides);
- `arbitration.py`: a failed float32 check judged again against eager in float64 (eager float32 rounds too);
- `ort_schemas.py`: `onnx.checker` on graphs fused for ONNX Runtime (its own ops registered first);
- `runtimes.py`: each target folder loaded, alone, by the runtime its layout is for (the "runs in" column; the
  proofs themselves live in `exporters.layouts`); `folder_trust.py` (a runtime proof reads only what this run wrote).

A sibling of `export/`: neither imports the other.
"""
