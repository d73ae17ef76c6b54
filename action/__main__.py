"""`python -m action`: the Docker action's entrypoint."""

import sys

from .main import main

if __name__ == "__main__":
    sys.exit(main())
