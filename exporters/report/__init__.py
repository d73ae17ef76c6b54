"""What a run produces, from the verdicts validation computed.

```
results.py ──► build.py (report.json: the contract) ──► markdown.py (report.md: what reviewers read)
                                    aggregate.py: the reports of a split (matrix) run merged into one
```

Imports the recipe and the foundation only: a report never reaches back into the run that made it.
"""
