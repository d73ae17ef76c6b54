"""What the bot adds to the library's texts on the Hub: how to stop it for a repo, and how it words options.

The PR, failure-discussion and problem-discussion texts are the library's (`exporters.publish`); the bot only adds
`OPT_OUT_NOTE` to them and spells the library's options (`` `trust_remote_code` ``) the way its operator sets them.

Example:
    >>> OPT_OUT_FILE
    '.no-export-bot'
    >>> from exporters.errors import ExportActionError
    >>> ExportActionError("allow it with `trust_remote_code`").worded(OPTION_NAMES)
    "allow it with the bot's `trust_remote_code_repos` setting (ask the bot's operator)"
"""

from __future__ import annotations

# An empty file of this name at a repo's root: the bot leaves the repo alone (no export, no PR, no discussion).
OPT_OUT_FILE = ".no-export-bot"
OPT_OUT_NOTE = (f"To stop the export bot for this repo, add an empty file `{OPT_OUT_FILE}` at its root (or remove the "
                "recipe).")
# How the bot spells the library's options for the people reading its discussions.
OPTION_NAMES = {
    "trust_remote_code": "the bot's `trust_remote_code_repos` setting (ask the bot's operator)",
    "token": "the bot's Hub token (ask the bot's operator)",
    "device": "`device`",
    "max_upload_size": "the bot's `max_upload_size` setting",
}
