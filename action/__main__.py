"""`python -m action`: the Docker action's entrypoint.

Started as root in the image, it runs the Action again as an unprivileged user (`action/privileges.py`) and exits
with that run's code; otherwise it runs the Action here. Either way it ends as `hf-export` does: exit handlers run,
output flushed, the interpreter's teardown of the loaded stack skipped (`exporters.quiet.exit_without_teardown`).
"""

import os

from exporters.quiet import exit_without_teardown

from .main import main
from .privileges import run_unprivileged

if __name__ == "__main__":
    code = run_unprivileged(os.environ)
    exit_without_teardown(SystemExit(main() if code is None else code))
