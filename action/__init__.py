"""The GitHub Action (`uses: hf/export-action@v1`): a thin shell around `exporters`.

Run as `python -m action` inside the Action's container; see `action.yml` and `docs/action.md`.

The modules: `main` (the entrypoint: settings in, library calls, runner-facing output out), `settings` (the inputs
and the runner's context), `commands` (workflow commands, step outputs, the job summary), `summary` (the job summary
and the sticky comment's text), `outcome` (exit codes, the sticky comment, a failure told once), `github` (a thin
PyGithub client), `init_mode` (the `init` mode), `visibility` (the `model-visibility` output), `privileges` (the
work run as an unprivileged user).
"""
