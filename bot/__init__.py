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
`cli` (`hf-export-bot serve|worker|jobs`). Beside them: `job` (a row of the store),
`members` (who may ask for an export), `page` (the public view of a job and the status page), `export_run` (the
`local` backend's run of `hf-export`), `reaper` (an export's process tree tied to its worker), `secrecy` (secrets out
of reach of the processes the bot starts), `texts` (what the bot adds to the library's texts on the Hub). See `docs/bot.md`.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
