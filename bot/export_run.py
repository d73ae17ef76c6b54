"""The `local` backend's export run: `hf-export` itself, with the bot's note (how to stop it for a repo) added to
every PR and discussion text it publishes (`exporters.publish.texts.NOTES`).

    python -m bot.export_run run REPO --revision SHA --out DIR --push ...   # same arguments as `hf-export`

Example:
    >>> import subprocess, sys
    >>> subprocess.run([sys.executable, "-m", "bot.export_run", "--help"], capture_output=True).returncode
    0
"""

from __future__ import annotations

from exporters.cli import main as hf_export
from exporters.publish import texts

from .texts import OPT_OUT_NOTE


def main() -> None:
    """Run `hf-export` with the bot's note in the texts it publishes."""
    if OPT_OUT_NOTE not in texts.NOTES:
        texts.NOTES.append(OPT_OUT_NOTE)
    hf_export()


if __name__ == "__main__":
    main()
