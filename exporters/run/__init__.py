"""The story of `run` and `validate`: prepare, reuse, export each target in a child, validate, report.

```
context.py (RunOptions -> prepare_run: source, recipe, targets, tool versions, weights fingerprint)
   └─► reuse.py (signed, unchanged targets of an earlier run)
   └─► handover.py (an export `init` checked, taken instead of exporting it again; init's rounds keep theirs)
         └─► workbench.py (the model loaded once, captures fitted to each target)
               └─► pipeline.py: each target exported in a forked child (isolation.py; resources.py for --jobs;
                   progress.py), staging renamed into place, validated, benchmarked, reported
revalidate.py: `validate`, the checks again on saved target folders (the pipeline's validation and report)
memory_plan.py: memory planned before the model loads (a run that cannot fit stops at once)
outcomes.py: what a run makes of its targets' outcomes (a result per target, the command that reproduces it)
twins.py: ONNX targets of a run whose exports read the same modules, inputs and settings: traced once, copied after
```
"""
