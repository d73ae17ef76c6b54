"""What a newcomer meets before any export: `hf-export check` and every `--help` answer without loading the stack,
each subcommand's help has an example, and its flags read as flags."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

HEAVY = ("torch", "transformers", "onnx", "onnxruntime", "executorch")
COMMANDS = ("run", "check", "init", "validate")


def _imports(*args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """The real CLI under `-X importtime`: the finished process and the top-level modules it imported."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "exporters.cli", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=120, env={**os.environ, "COLUMNS": "120"})
    modules = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in done.stderr.splitlines()
               if line.startswith("import time:") and "|" in line}
    return done, modules


def test_check_loads_no_part_of_the_stack(tmp_path) -> None:
    recipe = tmp_path / "export_config.json"
    recipe.write_text('{"exports": [{"export_format": "executorch", "mode": "generation"}], '
                      '"generation": {"max_cache_len": 64}}')
    (tmp_path / "config.json").write_text('{"model_type": "llama", "max_position_embeddings": 128}')
    done, modules = _imports("check", str(recipe))
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert "valid (1 target(s))" in done.stdout + done.stderr
    assert "typer" in modules  # the measurement sees the CLI's own imports
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))
    # what depends on the model is still checked, from its config.json as read
    (tmp_path / "config.json").write_text('{"model_type": "llama", "max_position_embeddings": 32}')
    done, modules = _imports("check", str(recipe))
    assert done.returncode == 2 and "max_cache_len 64 is longer than the 32 positions" in done.stdout + done.stderr
    assert not modules & set(HEAVY)


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_loads_no_part_of_the_stack_and_shows_an_example(command: str | None) -> None:
    done, modules = _imports(*([command] if command else []), "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))
    text = done.stdout
    if command is None:
        assert all(name in text for name in COMMANDS)
        return
    assert re.search(r"Examples?:", text) and f"hf-export {command} " in text, text
    # flags read as flags: `--print-report`, never `--print-report <bool>`
    flags = [line for line in text.splitlines() if re.search(r"--(print-report|trust-remote-code|push|quiet)\b", line)]
    assert bool(flags) == (command != "check") and not [line for line in flags if "<bool>" in line], flags


def test_a_dry_run_without_a_token_shows_the_plan_and_the_card(tmp_path) -> None:
    from tests.conftest import run_cli
    from tests.models import tiny_llama

    model = tiny_llama(tmp_path / "model")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    # a fresh HF_HOME holds no login; nothing answers at the endpoint (a dry run without a token asks nothing)
    env.update(HF_HOME=str(tmp_path / "hf-home"), HF_ENDPOINT="http://127.0.0.1:9", PYTHONUNBUFFERED="1")
    done = subprocess.run([sys.executable, "-m", "exporters.cli", "run", str(model), "--out", str(tmp_path / "out"),
                           "--no-bench", "--quiet", "--dry-run", "--repo-id", "acme/tiny"], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=600)
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-3000:]
    assert "Publish plan for acme/tiny" in text and "no Hub token here" in text
    assert "----- model card (README.md, Exports section) -----" in text and "## Exports" in text
    assert "LocalTokenNotFoundError" not in text and "Traceback" not in text
