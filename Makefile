# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONSTRAINTS := constraints.txt
DEMO_OUT ?= demo-out

.PHONY: venv demo test lock clean

$(BIN)/hf-export: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c $(CONSTRAINTS) -e ".[test]"
	touch $(BIN)/hf-export

venv: $(BIN)/hf-export

demo: venv
	$(BIN)/python examples/build_demo_model.py examples/demo-model
	$(BIN)/hf-export run examples/demo-model --out $(DEMO_OUT)

test: venv
	$(BIN)/python -m pytest -q

lock: venv
	$(BIN)/python -m pip freeze --exclude-editable | sed 's/+cpu//' > $(CONSTRAINTS).new
	@echo "review $(CONSTRAINTS).new and move it over $(CONSTRAINTS)"

clean:
	rm -rf $(VENV) $(DEMO_OUT)
