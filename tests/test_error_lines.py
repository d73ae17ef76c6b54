"""A failed target's error in one whole line that says what to change (report.md's table, the CLI, the Hub
discussion, the bot's status page), its whole message and traceback in `logs/<target>.log`, which the report names.

The failure is a real one: a recipe that declares ViT's image side dynamic, which the model's code fixes at 16;
torch.export's message spans several lines, ours ends with a `hint:` line.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from exporters.errors import error_line, first_line
from tests.conftest import run_cli
from tests.test_bot import REPO, bot_settings, main_update, start_bot, upload_model  # noqa: F401  (a fixture)
from tests.test_bot_outcomes import description, run_job
from tests.test_verdicts import tiny_vit

SIDE = [{"name": "image-size", "export_format": "dynamo",
         "dynamic_shapes": {"pixel_values": {"2": {"name": "side", "min": 16, "max": 64}}}}]
HINT = "declare it 'static' (or the model's fixed size) in the recipe"


def test_first_line_is_whole():
    config = ("GenerationConfig is invalid: \n- `temperature`: `do_sample` is not set to `True`. You should set "
              "`do_sample=True` or unset `temperature`.\nIf you're using a pretrained model, ...")
    assert first_line(config) == ("GenerationConfig is invalid: `temperature`: `do_sample` is not set to `True`. You "
                                  "should set `do_sample=True` or unset `temperature`.")
    assert first_line("short and whole", 20) == "short and whole"  # no ellipsis when nothing was cut
    cut = first_line("You should set `do_sample=True` or unset `temperature` in the file", 40)
    assert cut == "You should set `do_sample=True` or …" and len(cut) <= 40
    long = "The first sentence is long enough to keep. " + "word " * 100
    assert first_line(long, 80) == "The first sentence is long enough to keep. …"  # at a sentence end when there is one
    assert first_line("x" * 50, 20).endswith(" …")  # one long word: cut, but said


def test_error_line_says_a_wrapper_and_its_cause_once():
    message = "GenerationConfig is invalid: \n- bad `top_p`\n\nFix these issues to save the configuration."
    same = {"type": "ValueError", "message": message,
            "root_cause": {"type": "ValueError", "message": "GenerationConfig is invalid: \n- bad `top_p`"}}
    assert error_line(same) == "ValueError: GenerationConfig is invalid: bad `top_p`"
    hidden = {"type": "RuntimeError", "message": "Make sure the inputs are compatible with model.generate()",
              "root_cause": {"type": "ValueError", "message": "decoder_start_token_id has to be defined\nmore"}}
    assert error_line(hidden) == ("RuntimeError: Make sure the inputs are compatible with model.generate() — root "
                                  "cause: ValueError: decoder_start_token_id has to be defined")
    hinted = {"type": "RuntimeError", "message": "Constraints violated (side)!\n  - You marked side as dynamic\n"
                                                 "hint: declare it 'static'", "root_cause": {"type": "E", "message": "x"}}
    assert error_line(hinted) == "RuntimeError: Constraints violated (side)! — hint: declare it 'static'"
    assert len(error_line({"type": "E", "message": "word " * 500}, 120)) <= 125


@pytest.fixture(scope="module")
def side_failure(tmp_path_factory):
    root = tmp_path_factory.mktemp("side")
    model_dir = tiny_vit(root / "model", SIDE)
    out = root / "out"
    return model_dir, out, run_cli("run", "--no-bench", str(model_dir), "--out", str(out))


def test_a_failed_target_says_what_to_change_in_one_line_and_names_its_log(side_failure):
    _, out, result = side_failure
    assert result.returncode == 1
    report = json.loads((out / "report.json").read_text())
    [target] = report["targets"]
    assert target["status"] == "failed" and target["log"] == "logs/image-size.log"
    markdown = (out / "report.md").read_text()
    row = next(line for line in markdown.splitlines() if line.startswith("| `image-size`"))
    assert HINT in row and "Constraints violated (side)!" in row and "\\[root cause" not in row, row
    assert "full message and traceback: `logs/image-size.log`" in markdown
    assert "> **RuntimeError**: exporting component" in markdown
    log = (out / "logs" / "image-size.log").read_text()
    assert "Traceback (most recent call last)" in log and "Suggested fixes" in log
    cli = " ".join((result.stdout + result.stderr).split())  # the terminal may wrap
    line = next(line for line in (result.stdout + result.stderr).splitlines() if "image-size" in line and "—" in line)
    assert HINT in line and f"(log: {out / 'logs' / 'image-size.log'})" in cli, line
    assert not re.search(r"\w…", line), line  # never cut mid-word


def test_the_discussion_and_the_status_page_say_which_target_failed_and_why(hf_env, tmp_path, start_bot):
    hub = hf_env
    upload_model(hub, tiny_vit(tmp_path / "model", SIDE))
    bot = start_bot(bot_settings(hub, tmp_path))
    job = run_job(bot, main_update(hub), timeout=240)
    assert job.status == "failed", (job.reason, job.error)
    assert job.error.startswith("image-size: RuntimeError: ") and HINT in job.error, job.error
    assert "it/s" not in job.error and str(tmp_path) not in job.error
    [thread] = hub.discussions(REPO)
    text = description(thread)
    assert "- `image-size` (dynamo) failed: RuntimeError:" in text and HINT in text, text[:3000]
    assert "reproduce it: `hf-export run " in text and "`logs/image-size.log`" in text
    assert "Next: change what the line says and push again" in text
    import urllib.request

    page = urllib.request.urlopen(f"{bot.url}/", timeout=30).read().decode()
    row = re.search(rf'<tr class="job" data-job-id="{job.id}".*?</tr>', page, re.S).group(0)
    assert "image-size: RuntimeError:" in row and "declare it &#x27;static&#x27;" in row, row
    assert "it/s" not in row and str(tmp_path) not in row


def test_a_corrupt_checkpoint_is_one_line_that_says_what_to_fix(tmp_path):
    """A truncated or corrupt safetensors file (an interrupted download) is the input's fault: one line naming the
    folder, safetensors' own reason and what to do, exit 2, nothing presented as an artifact; never a traceback."""
    model_dir = tiny_vit(tmp_path / "model", [{"export_format": "dynamo"}])
    weights = model_dir / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:8] + b'{"x": garbage' + data[21:len(data) // 2])
    out = tmp_path / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out))
    said = " ".join((result.stdout + result.stderr).split())  # the terminal may wrap
    assert result.returncode == 2, said
    assert "Traceback" not in said and "╭" not in said, said
    assert f"cannot load the model from {model_dir}: SafetensorError: Error while deserializing header" in said
    assert "check that its weight files are complete" in said
    assert not (out / "report.json").exists() and json.loads((out / "problem.json").read_text())


def test_terminal_colour_codes_reach_no_report_and_upstream_causes_are_said(tmp_path):
    """Runtimes colour some errors (ExecuTorch's native log, onnxruntime's): report.md and report.json carry none of
    their escape codes, and a failure whose cause is upstream says "upstream" with the operator and the upstream
    issue (#50 item 9)."""
    from exporters.errors import error_record
    from exporters.report.build import write_report

    try:
        try:
            raise RuntimeError("\x1b[1;31mUnsupportedOperatorError\x1b[0m: Exporting the operator "
                               "'aten::view_as_complex' to ONNX is not supported")
        except RuntimeError as inner:
            raise RuntimeError("exporting component 'model' failed: \x1b[33mwarning\x1b[0m") from inner
    except RuntimeError as err:
        record = error_record(err)
    assert "\x1b" not in json.dumps(record)
    assert record["upstream"].startswith("upstream: complex-number RoPE") and "pytorch/pytorch#126972" in \
        record["upstream"], record
    assert record["message"].endswith(f"[{record['upstream']}]")
    gemma3n = error_record(RuntimeError("KernelCall failed: aten::erfinv.out has no kernel"))
    assert "`aten::erfinv` has no ONNX operator" in gemma3n["upstream"]
    # torch.onnx decomposes erfinv into prims.erf_inv, which has no ONNX function (Gemma 3n's ONNX target, #50)
    onnx_erfinv = error_record(RuntimeError("No ONNX function found for <OpOverload(op='prims.erf_inv')>"))
    assert "`aten::erfinv` has no ONNX operator" in onnx_erfinv["upstream"]
    assert "upstream" not in error_record(RuntimeError("outputs differ from the eager model"))

    report = {"status": "failed", "source": {"model": "acme/tiny", "revision": "a" * 40},
              "recipe": {"file": "export_config.json", "sha256": "f" * 64}, "versions": {"torch": "2.13"},
              "findings": ["\x1b[32mgreen\x1b[0m note"],
              "targets": [{"name": "onnx", "export_format": "onnx", "mode": "model", "status": "failed",
                           "error": {"type": "RuntimeError", "message": "\x1b[31mred\x1b[0m failure"},
                           "components": [{"name": "model", "checks": [
                               {"probe": "seq=9", "verdict": "failed", "error": "\x1b[31mbad\x1b[0m", "outputs": []}]}]}]}
    write_report(report, tmp_path)
    for name in ("report.md", "report.json"):
        text = (tmp_path / name).read_text()
        assert "\x1b" not in text and "\\u001b" not in text, name
    assert "red failure" in (tmp_path / "report.json").read_text()


def test_an_upstream_failure_is_said_upstream_by_the_cli(tmp_path):
    """#50 item 9 through the real CLI: Gemma 3n's activation sparsity calls `erfinv`, which torch.onnx has no
    function for. The failed target's record names the operator and the upstream gap, and report.md, report.json and
    the terminal all say "upstream"; exit 1 (a failed target), no traceback, no ANSI codes."""
    from tests.models import family_model

    model_dir = family_model("gemma3n_text", tmp_path / "model", [{"export_format": "onnx", "mode": "model"}],
                             tokenizer=False)
    out = tmp_path / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out))
    said = " ".join((result.stdout + result.stderr).split())  # the terminal may wrap
    assert result.returncode == 1, said
    assert "Traceback" not in said and "\x1b" not in said, said
    assert "upstream: `aten::erfinv` has no ONNX operator" in said, said
    report = json.loads((out / "report.json").read_text())
    (target,) = report["targets"]
    assert target["status"] == "failed", target
    assert target["error"]["upstream"] == ("upstream: `aten::erfinv` has no ONNX operator and no ExecuTorch kernel "
                                           "(docs/upstream-gaps.md #45)"), target["error"]
    assert target["error"]["message"].endswith(f"[{target['error']['upstream']}]"), target["error"]
    report_md = (out / "report.md").read_text()
    assert target["error"]["upstream"] in report_md and "\x1b" not in report_md
    assert not list(out.glob(f"{target['name']}/*.onnx")), "a failed target's graph is not presented"
