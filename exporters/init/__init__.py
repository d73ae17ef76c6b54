"""`hf-export init`: propose a recipe for a model that has none, prove it, and push it.

```
propose.py ──► axes.py (which axes can be dynamic, measured) ──► decide.py (the recipe to propose)
                                                                   ├─◄ classify.py (a failure's class: what to change)
                                                                   ├─► summary.py (init-summary.md)
                                                                   ├─► variants.py (an LLM's int4 beside fp32)
                                                                   └─► push.py (the Hub PR of the recipe)
```
"""
