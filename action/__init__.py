"""The GitHub Action (`uses: hf/export-action@v1`): a thin shell around `exporters`.

Run as `python -m action` inside the Action's container; see `action.yml` and `docs/action.md`.
"""
