"""The Hub webhook bot: receive Hub webhooks, queue export jobs, run them, open/update the Hub PR.

```
POST /webhooks/hub ──► intake (secret, size, payload, filters) ──► job store (SQLite, WAL)
                                                                        │
        worker threads / `hf-export-bot worker` ◄── claim with a lease ─┘
              │
              ├─ Hub check: recipe at the new head? same recipe + weights already exported?
              └─ backend: `local` (hf-export run --push in a subprocess) | `github` (workflow_dispatch) | `dry`
```

Modules: `settings` (configuration), `intake` (which webhooks become jobs), `store` (the job queue),
`hubcheck` (the Hub calls a worker makes before running a job), `backends` (registry), `worker`, `app` (FastAPI),
`cli` (`hf-export-bot serve|worker|jobs`). See `docs/bot.md`.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
