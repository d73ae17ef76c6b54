"""The eager model in memory, captured for export: where it comes from, its sample inputs, its components.

```
source.py (folder or Hub repo, the remote-code rule)
   └─► families.py / inputs.py / multimodal.py   the sample inputs of the model's kind (its processor, or a layout)
         └─► components.py (decompose: prefill/decode, vision parts; cache_settings.py: the cache a target asks for)
               └─► shapes.py / probes.py   traced shapes fitted to the target's contract; unseen shapes to probe
                     merged.py: the merged generation graph;  steps.py: feeding one generation step
```

Imports the recipe, the upstream adapter and the foundation only.
"""
