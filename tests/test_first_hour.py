"""What a newcomer meets in the first hour: README's quick start runs as written on a folder shaped like the instruct
repos on the Hub; `hf-export check` and every `--help` answer without loading the stack; each subcommand's help has
an example and its flags read as flags; a dry run without a token shows the plan and the card."""

from __future__ import annotations

import json
import os
import re
import shlex
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


def _quick_start_lines() -> list[list[str]]:
    """README's quick start, as written: the fenced block after its `quick-start` marker, one command a line."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- quick-start:", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line.split("#", 1)[0]) for line in block.splitlines() if line.strip()]


def test_readmes_quick_start_runs_as_written_on_an_instruct_checkpoint(tmp_path) -> None:
    """A folder like the instruct repos on the Hub (bfloat16 shards, tied embeddings, a byte-level BPE with a chat
    template, a generation_config.json that samples with two eos ids): init proposes a recipe, check takes it, run
    passes it, the dry run shows the PR, each exactly as README's quick start says, from the folder it names."""
    from tests.test_shipped_checkpoints import instruct_checkpoint

    # one decoder layer: no check here reads the depth, and init and run lower ExecuTorch programs five times (#48)
    instruct_checkpoint(tmp_path / "my-model", vocab_size=0, recipe=None, layers=1)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    env.update(HF_HOME=str(tmp_path / "hf-home"), HF_ENDPOINT="http://127.0.0.1:9", PYTHONUNBUFFERED="1",
               EXPORT_ACTION_STATE_DIR=str(tmp_path / "state"))  # where init hands its checked exports to run
    lines = _quick_start_lines()
    assert [line[:2] for line in lines] == [["hf-export", "init"], ["hf-export", "check"], ["hf-export", "run"],
                                            ["hf-export", "run"]], lines
    done = []
    for line in lines:
        done.append(subprocess.run([sys.executable, "-m", "exporters.cli", *line[1:]], capture_output=True, text=True,
                                   cwd=tmp_path, env=env, timeout=1800))
        text = done[-1].stdout + done[-1].stderr
        assert done[-1].returncode == 0, f"{shlex.join(line)}:\n{text[-4000:]}"
        assert "Traceback" not in text, text[-4000:]
    recipe = json.loads((tmp_path / "my-model" / "export_config.json").read_text())
    assert {t["export_format"] for t in recipe["exports"]} == {"dynamo", "onnx", "executorch"}, recipe
    # init tried the 4-bit variants LLMs are deployed in, each proposed or left out saying why (tests/test_init.py's
    # Llama passes --fp32-only; tests/test_init_variants.py proposes int4 on a model on the 4-bit grid)
    said = " ".join((done[0].stdout + done[0].stderr).split())
    assert "variants: exporting and validating onnx-int4" in said, said[-3000:]
    assert re.search(r"the int4 variant \(onnx-int4\) (is proposed beside fp32|was tried and left out)", said), said
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["status"] == "passed" and report["checkpoint_dtype"] == "bfloat16", report["findings"]
    # run took each export init checked (README: "the run takes the exports init checked") instead of exporting again
    assert all((t["handed_over"] or {}).get("from") == "hf-export init" for t in report["targets"]), \
        [(t["name"], t["findings"]) for t in report["targets"]]
    assert any("validation generates greedily" in f for f in report["findings"])
    assert "Publish plan for me/my-model" in done[3].stdout and "## Exports" in done[3].stdout
