"""Run in the optimum test venv (tests/optimum/constraints.txt): several of this folder's scripts in one process
(#48: each start of the venv imports torch, transformers and optimum again, ~5.5 CPU s), in the order given, each
with its own arguments. A JSON list on stdin, `[[SCRIPT, ARG, ...], ...]`; before each script's own output a line
`{"script": SCRIPT}`. A script that raises ends the process with its traceback and exit code 1.

    echo '[["feature_extraction.py", FOLDER, TEXTS], ["image_classification.py", FOLDER, IMAGES]]' | python several.py
"""

import json
import runpy
import sys
from pathlib import Path

from ending import end_without_teardown  # tests/optimum/ending.py

HERE = Path(__file__).resolve().parent

for script, *args in json.loads(sys.stdin.read()):
    print(json.dumps({"script": script}), flush=True)
    sys.argv = [str(HERE / script), *args]
    runpy.run_path(str(HERE / script), run_name="several")  # not "__main__": the script leaves the ending to us
    sys.stdout.flush()

end_without_teardown()  # the answers are printed: no interpreter teardown (#48)
