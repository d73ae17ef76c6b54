"""#46 §5: a checkpoint shaped like openai/whisper-tiny (its full depth of 4 + 4 layers, its 51865-token vocabulary
with the output projection tied to the token embedding, 80 mel bins, 1500 source and 448 target positions, the
repo's own `generation_config.json` with `lang_to_id`, `task_to_id`, `forced_decoder_ids`, suppressed tokens and
alignment heads) through the plainest recipe in every format. Before, every format failed with
`KeyError: 'encoder_outputs'`: a multilingual config with no language makes `generate()` detect it first with a
forward pass of its own, which was captured as the prefill. One export (module fixture) through the real CLI.
"""

from __future__ import annotations

import json

import pytest

from exporters.export.footprint import weights_stored_bytes
from tests.conftest import run_and_read
from tests.models import whisper_tiny_shaped

PLAINEST = [{"export_format": "dynamo", "mode": "generation", "dynamic": True},
            {"export_format": "onnx", "mode": "generation", "dynamic": True},
            {"export_format": "executorch", "mode": "generation"}]


@pytest.fixture(scope="module")
def whisper_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("whisper-tiny-shaped")
    return run_and_read(root, whisper_tiny_shaped(root / "model", PLAINEST))


def test_a_whisper_tiny_shaped_checkpoint_passes_every_format(whisper_run):
    out, report, log = whisper_run
    targets = {t["export_format"]: t for t in report["targets"]}
    assert sorted(targets) == ["dynamo", "executorch", "onnx"], log[-3000:]
    for name, target in targets.items():
        assert target["status"] == "passed", (name, log[-3000:], json.dumps(target, indent=1)[:5000])
        generation = target["generation"]
        assert generation["status"] == "passed", (name, generation)
        assert generation["exported_tokens"] == generation["eager_tokens"] and len(generation["eager_tokens"][0]) == 8
    # #52 §2: ExecuTorch's default for Whisper is the ASR runner's program, proven in ExecuTorch's runtime
    executorch = targets["executorch"]
    assert executorch["expected_components"] == ["encoder", "text_decoder"], executorch["expected_components"]
    proofs = {proof["runtime"]: proof for proof in executorch["runtimes"]}
    assert proofs["ExecuTorch ASR runner layout"]["status"] == "passed", proofs
    assert proofs["ExecuTorch ASR runner layout"]["detail"].startswith("8/8 tokens"), proofs
    # the repo's config kept in every folder; validation pinned the language and the report says so
    shipped = json.loads((out.parent / "model" / "generation_config.json").read_text())
    for name in targets:
        written = json.loads((out / name / "generation_config.json").read_text())
        assert "language" not in written and written["lang_to_id"] == shipped["lang_to_id"], name
    assert any("language <|en|> pinned" in f for f in report["findings"]), report["findings"]


def test_the_whisper_shaped_targets_report_the_weights_their_files_store(whisper_run):
    """The stored-weights ratio is the one read from the files: the ExecuTorch program (its tied table in model.ptd)
    and the ONNX graphs store the weights once; the dynamo target's three .pt2 files a copy each, said so."""
    out, report, _ = whisper_run
    targets = {t["export_format"]: t for t in report["targets"]}
    for name, target in targets.items():
        assert target["weights_stored_bytes"] == weights_stored_bytes(out / name, name), name
    executorch = targets["executorch"]
    assert executorch["weights_stored_bytes"] / executorch["parameter_bytes"] < 1.05, executorch
    assert (out / "executorch" / "model.ptd").is_file()
    assert targets["onnx"]["weights_stored_bytes"] / targets["onnx"]["parameter_bytes"] < 1.05
    dynamo = targets["dynamo"]
    assert dynamo["weights_stored_bytes"] / dynamo["parameter_bytes"] > 1.9
    assert any("separate .pt2" in f for f in dynamo["findings"]), dynamo["findings"]
