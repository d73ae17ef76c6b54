"""Native code and runtime children are held short: a tokenizer that panics fails its target, not the run; a runtime
proof's child holds no secret, has a memory limit from its folder and the target's timeout; the ExecuTorch runner's
proof compares token ids and never passes on an empty eager reference.

Two runs of the real CLI (module-scoped): a runner target whose tokenizer panics beside an ONNX GenAI target, and a
runner target whose eager greedy generation ends at once.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from exporters.recipe.load import parse_recipe_data
from exporters.layouts import RuntimeContext, memory_limit, run_in_child
from exporters.layouts.child import PROOF_PYTHON_SETTING
from tests.conftest import ROOT, process_alive, run_cli
from tests.models import runner_model, write_recipe

RUNNER = "ExecuTorch LLM runner"
PROMPT = "the quick brown fox jumps over the lazy dog"
HUB_TOKEN = "hf_proofchildsecret0123456789"
# onig gives up on this pattern past its retry limit ("retry-limit-in-match over") on any 45 characters without a
# digit: tokenizers raises pyo3's PanicException, a BaseException
PANICKING_SPLIT = {"type": "Split", "pattern": {"Regex": r"((\S|\s)+)+\d"}, "behavior": "Isolated", "invert": False}
ENV_DUMPER = """import json, os, sys
if sys.argv[:1] == ["-c"]:  # a runtime proof's child (the CLI and its forked exports are not started with -c)
    with open(os.path.join({folder!r}, f"{{os.getpid()}}.json"), "w") as handle:
        json.dump({{"argv": sys.argv[1:], "env": dict(os.environ)}}, handle)
"""


def _panicking_tokenizer(folder: Path) -> None:
    path = folder / "tokenizer.json"
    tokenizer = json.loads(path.read_text())
    tokenizer["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [PANICKING_SPLIT, tokenizer["pre_tokenizer"]]}
    path.write_text(json.dumps(tokenizer))


@pytest.fixture(scope="module")
def panicking_run(tmp_path_factory):
    """A runner target and an ONNX GenAI target of a model whose tokenizer panics on the runner's prompt (the sample's
    text: the recipe has no prompt, so the sample inputs are not tokenized), run with `HF_TOKEN` set and a
    `sitecustomize` that records each runtime child's environment."""
    root = tmp_path_factory.mktemp("panicking")
    recipe = {"exports": [{"name": "runner", "export_format": "executorch", "mode": "generation"},
                          {"name": "genai", "export_format": "onnx", "mode": "generation", "merged": True}],
              "inputs": {"sequence_length": 32}, "generation": {"max_new_tokens": 4}}
    model = runner_model(root / "model", "llama", recipe, layers=1)  # no check reads the depth (#48)
    _panicking_tokenizer(model)
    site, dumps = root / "site", root / "child-env"
    site.mkdir()
    dumps.mkdir()
    (site / "sitecustomize.py").write_text(ENV_DUMPER.format(folder=str(dumps)))
    out = root / "out"
    done = run_cli("run", "--no-bench", str(model), "--out", str(out), "--quiet",
                   env={"HF_TOKEN": HUB_TOKEN, "GITHUB_TOKEN": "ghs_proofchild0123456789", "MY_API_KEY": "k3y",
                        "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])})
    return out, done, dumps


def test_a_panicking_tokenizer_fails_its_target_and_the_run_goes_on(panicking_run):
    out, done, _ = panicking_run
    log = done.stdout + done.stderr
    assert (out / "report.json").is_file(), log[-4000:]
    targets = {t["name"]: t for t in json.loads((out / "report.json").read_text())["targets"]}
    runner = targets["runner"]
    assert runner["status"] == "failed"
    [proof] = [p for p in runner["runtimes"] if p["runtime"] == RUNNER]
    assert proof["status"] == "failed", proof
    assert "PanicException" in proof["detail"] and "retry-limit-in-match over" in proof["detail"], proof
    genai = targets["genai"]  # its own verdict: its proof reads ids, no tokenizer
    assert genai["status"] == "passed", json.dumps(genai)[:3000]
    # GenAI and optimum (in its side environment) both prove the merged decoder
    assert {p["runtime"]: p["status"] for p in genai["runtimes"]} == {"ONNX Runtime GenAI": "passed",
                                                                      "optimum": "passed"}, genai["runtimes"]


def test_a_runtime_proofs_child_holds_no_secret(panicking_run):
    """The CLI ran with HF_TOKEN, GITHUB_TOKEN and MY_API_KEY set; ONNX Runtime GenAI's child saw none of them."""
    _, _, dumps = panicking_run
    children = [json.loads(p.read_text()) for p in dumps.iterdir()]
    genai = [c for c in children if "batches" in c["argv"][0]]
    assert genai, [c["argv"][:1] for c in children]
    for child in children:
        assert not {"HF_TOKEN", "GITHUB_TOKEN", "MY_API_KEY"} & set(child["env"]), sorted(child["env"])
        assert HUB_TOKEN not in json.dumps(child)
        assert child["env"].get("PATH")


def test_a_runtime_child_sees_only_the_allowed_environment(monkeypatch):
    for name, value in {"HF_TOKEN": "hf_x1234567890", "WEBHOOK_SECRET": "whsec", "AWS_SECRET_ACCESS_KEY": "aws",
                        "DB_PASSWORD": "pw", "SOMETHING_ELSE": "x", "OMP_NUM_THREADS": "3"}.items():
        monkeypatch.setenv(name, value)
    code = "import json, os, sys; json.dump(dict(os.environ), open(json.loads(sys.argv[1])['result'], 'w'))"
    env, why = run_in_child(code, {})
    assert why == "" and env["OMP_NUM_THREADS"] == "3" and env["PATH"] == os.environ["PATH"]
    assert not {"HF_TOKEN", "WEBHOOK_SECRET", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "SOMETHING_ELSE"} & set(env)


def test_a_runtime_child_over_its_memory_limit_fails_with_a_clear_message(tmp_path):
    (tmp_path / "model.bin").write_bytes(b"\0" * (1 << 20))
    limit = memory_limit(tmp_path)
    code = f"block = bytearray({limit + (1 << 30)})\nopen(__import__('json').loads(__import__('sys').argv[1])['result'], 'w').write('1')"
    started = time.monotonic()
    answer, why = run_in_child(code, {}, folder=tmp_path)
    assert answer is None and time.monotonic() - started < 60
    assert "ran out of memory" in why and f"{limit >> 20} MiB" in why and "the folder's 1 MiB" in why, why
    assert "MemoryError" in why


def test_a_proof_interpreter_setting_that_names_no_program_fails_the_proof_saying_so(tmp_path, monkeypatch):
    """`HF_EXPORT_PROOF_PYTHON` (an operator's: the interpreter this environment's proofs run under) naming a file
    that is not there, or a folder: the proof fails with the setting's name and what to do, no child started."""
    for value in (tmp_path / "missing-python", tmp_path):
        monkeypatch.setenv(PROOF_PYTHON_SETTING, str(value))
        answer, why = run_in_child("raise SystemExit('never run')", {})
        assert answer is None and str(value) in why and "set HF_EXPORT_PROOF_PYTHON" in why, why


GRANDPARENT = """import json, os, subprocess, sys, time
spec = json.loads(sys.argv[1])
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(spec["pids"], "w").write(f"{os.getpid()} {grandchild.pid}")
time.sleep(600)
"""


def test_a_runtime_child_past_the_targets_timeout_is_killed_with_what_it_started(tmp_path):
    recipe = parse_recipe_data({"exports": [{"name": "slow", "export_format": "onnx", "timeout": 3}]})
    context = RuntimeContext(recipe.exports[0], recipe, "text", {})
    assert context.timeout_s == 3
    started = time.monotonic()
    answer, why = run_in_child(GRANDPARENT, {"pids": str(tmp_path / "pids")}, timeout_s=context.timeout_s)
    assert answer is None and time.monotonic() - started < 30
    assert "did not finish in 3 s" in why, why
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    try:
        deadline = time.monotonic() + 10
        while any(process_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(process_alive(p) for p in pids), "the child and its own child were killed"
    finally:
        for pid in pids:
            if process_alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def eos_first_run(tmp_path_factory):
    """A runner target of a model whose eos is the first token eager greedy generation picks for the prompt."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("eos-first")
    recipe = {"exports": [{"export_format": "executorch", "mode": "generation"}], "inputs": {"prompt": PROMPT},
              "generation": {"max_new_tokens": 4}}
    folder = runner_model(root / "model", "llama", recipe, layers=1)  # no check reads the depth (#48)
    ids = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(PROMPT, add_special_tokens=False).ids
    model = AutoModelForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        first = int(model(torch.tensor([ids])).logits[0, -1].argmax())
    model.config.eos_token_id = model.generation_config.eos_token_id = first
    model.save_pretrained(folder)
    write_recipe(folder, recipe)
    out = root / "out"
    done = run_cli("run", "--no-bench", str(folder), "--out", str(out), "--quiet")
    return out, done


def test_an_eager_reference_that_generates_nothing_never_passes(eos_first_run):
    out, done = eos_first_run
    assert (out / "report.json").is_file(), (done.stdout + done.stderr)[-4000:]
    [target] = json.loads((out / "report.json").read_text())["targets"]
    [proof] = [p for p in target.get("runtimes") or [] if p["runtime"] == RUNNER] or [None]
    assert proof is not None and proof["status"] == "unverified", (proof, target["status"])
    assert "eos first" in proof["detail"] and PROMPT in proof["detail"], proof
    assert target["status"] != "passed"


def test_genai_and_optimum_share_one_eager_batch_reference(tmp_path, monkeypatch):
    """GenAI's and optimum's proofs ask eager for the same left-padded batch: it is generated once per target and
    each proof gets its own copy; the context holds the model weakly (a kept context keeps no weights)."""
    import gc
    import weakref

    import torch
    from transformers import AutoModelForCausalLM

    from exporters.layouts import LAYOUTS
    from exporters.validate.runtimes import references_for

    data = {"exports": [{"export_format": "onnx", "mode": "generation"}], "generation": {"max_new_tokens": 4}}
    folder = runner_model(tmp_path / "model", "llama", data)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    batches = []
    generate = type(model).generate
    monkeypatch.setattr(type(model), "generate",
                        lambda self, *args, **kwargs: batches.append(kwargs["input_ids"].shape[0])
                        or generate(self, *args, **kwargs))
    recipe = parse_recipe_data(data)
    context = RuntimeContext(recipe.exports[0], recipe, "text", {"input_ids": torch.tensor([[5, 6, 7, 8, 9, 10]])},
                             model.generation_config, folder)
    checks = [layout for layout in LAYOUTS if layout.runtime in ("ONNX Runtime GenAI", "optimum")]
    pairs = references_for(checks, model, context)
    assert [check.runtime for check, _ in pairs] == ["ONNX Runtime GenAI", "optimum"]
    (_, genai), (_, optimum) = pairs
    assert batches == [2], batches  # one eager batch of two prompts for both runtimes
    assert genai == optimum and genai is not optimum and genai.new_tokens is not optimum.new_tokens
    assert len(genai.new_tokens) == 2 and all(genai.new_tokens)
    other = RuntimeContext(recipe.exports[0], recipe, "text", context.generate_inputs, model.generation_config, folder)
    assert references_for(checks[:1], model, other)[0][1] == genai and batches == [2, 2]  # another target: its own
    held = weakref.ref(model)
    del model, pairs
    gc.collect()
    assert held() is None, "the context kept the eager model alive"
