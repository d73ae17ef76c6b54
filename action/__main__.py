"""`python -m action`: the Docker action's entrypoint.

Started as root in the image, it runs the Action again as an unprivileged user (`action/privileges.py`) and exits
with that run's code; otherwise it runs the Action here.
"""

import os
import sys

from .main import main
from .privileges import run_unprivileged

if __name__ == "__main__":
    code = run_unprivileged(os.environ)
    sys.exit(main() if code is None else code)
