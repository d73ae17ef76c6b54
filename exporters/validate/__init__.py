"""Every artifact from disk against the eager model, then measured in its own runtime.

```
checks.py (each component at traced and unseen shapes; the verdicts)
   ├─► parity.py / greedy.py     generation parity through the exported graphs, eager's token-selection rules
   ├─► vision_language.py        the model's own forward with its stages replaced by their graphs
   ├─► sliding.py                sliding-window caches as exported
   ├─► quality.py                task metrics of quantized and half-precision variants
   ├─► native_log.py             a runtime's own words (its stderr) joined to the error
   └─► benchmark.py              size, load time, latency, tokens/s
```

A sibling of `export/`: neither imports the other.
"""
