"""Hybrid state-space models (#30): Falcon-H1's cache holds its attention layers' keys and values (growing) and its
Mamba2 mixers' conv and recurrent states (fixed), and the chunked scan of a prefill or merged graph is traced with
the number of chunks fixed (docs/upstream-gaps.md #27). The plainest recipes pass in every format, chosen from the
capture and said in the report: a `dynamic: true` target exports the decode alone, its key-value axis dynamic from
0, and the prompt is stepped through it from zeroed states and an empty key-value cache; the plainest ExecuTorch
target gets the methods layout, since the LLM runner's program runs the prompt through the scan in one call, and
the prompt of any length the runner's would take (#50): the decode alone with its static cache, the prompt stepped
through it as above (the MoE hybrids too: Jamba, Granite-4 hybrid, Nemotron-H, Qwen3-Next). Parity runs through the
exported graphs. `merged: true` gets a clear error, not a trace failure."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import PLAINEST_EXECUTORCH, assert_greedy_parity, run_cli
from tests.export_store import stored_run
from tests.models import family_model, tiny_falcon_h1

STEPPED = ["dynamo", "onnx"]
RECIPE = {"schema_version": 1, "generation": {"max_new_tokens": 8}, "exports": [
    *({"name": f, "export_format": f, "mode": "generation", "dynamic": True} for f in STEPPED),
    {"name": "executorch", "export_format": "executorch", "mode": "generation"},
    {"name": "onnx-merged", "export_format": "onnx", "mode": "generation", "dynamic": True, "merged": True},
]}
FILES = {"dynamo": "decode.pt2", "onnx": "decode.onnx"}


@pytest.fixture(scope="module")
def hybrid_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("falcon-h1")
    model_dir = tiny_falcon_h1(root / "model", RECIPE, layers=1)  # every layer is both kinds: one is the hybrid
    out = root / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    report = json.loads((out / "report.json").read_text())
    return {t["name"]: t for t in report["targets"]}, out, result


@pytest.mark.parametrize("name", STEPPED)
def test_a_dynamic_prompt_is_stepped_through_the_hybrid_decode_and_said(hybrid_run, name):
    targets, out, _ = hybrid_run
    target = targets[name]
    assert target["status"] == "passed", (name, target["error"])
    assert target["expected_components"] == ["decode"]
    assert [c["name"] for c in target["components"]] == ["decode"]
    assert (out / name / FILES[name]).is_file(), sorted(p.name for p in (out / name).iterdir())
    assert not list((out / name).glob("prefill*")) and not list((out / name).glob("model.*"))
    said = [f for f in target["findings"] if "one token at a time from zeroed states and an empty key-value cache"
            in f]
    assert said, target["findings"]
    for kind in ("conv_states", "recurrent_states", "keys", "values", "a hybrid", "dynamic from 0"):
        assert kind in said[0], (kind, said[0])
    assert not [f for f in target["findings"] if "exported as separate graphs" in f], target["findings"]  # one note


def test_the_plainest_executorch_target_gets_the_methods_layout_and_says_why(hybrid_run):
    """The methods layout (the runner's one-call prompt runs the scan), its prompt of any length stepped through
    `decode` (#50: it was a prefill fixed at the traced 8 tokens)."""
    targets, out, _ = hybrid_run
    target = targets["executorch"]
    assert target["status"] == "passed", target["error"]
    assert [c["name"] for c in target["components"]] == ["decode"]
    said = [f for f in target["findings"] if "not the LLM runner's layout" in f]
    assert said and "state-space layers (LinearAttentionAndFullAttentionLayer)" in said[0], target["findings"]
    assert list((out / "executorch").glob("*.pte"))


# The MoE hybrids (#50): MoE layers beside state-space or linear-attention ones. Their two kinds of layer are the
# point, so two layers (three for Nemotron-H, whose MoE is a layer of its own; the matrix's has none)
MOE_HYBRIDS = {"jamba": {}, "granitemoehybrid": {}, "qwen3_next": {},
               "nemotron_h": {"layer_types": ["linear_attention", "moe", "full_attention"], "n_routed_experts": 4,
                              "moe_intermediate_size": 32, "moe_shared_expert_intermediate_size": 32}}


@pytest.fixture(scope="module", params=list(MOE_HYBRIDS))
def moe_hybrid(request, tmp_path_factory):
    """A MoE hybrid's plainest ExecuTorch recipe through the store."""
    recipe = {"schema_version": 1, "exports": [PLAINEST_EXECUTORCH], "generation": {"max_new_tokens": 8}}
    root = tmp_path_factory.mktemp(f"moe-hybrid-{request.param}")
    return stored_run(family_model(request.param, root / "model", recipe, never_eos=True,
                                   **MOE_HYBRIDS[request.param]))


def test_a_moe_hybrids_plainest_executorch_program_takes_prompts_of_any_length(moe_hybrid):
    """Issue #50: the plainest ExecuTorch program of a MoE hybrid (Jamba, Granite-4 hybrid, Nemotron-H, Qwen3-Next)
    took only prompts of the traced length (its prefill runs the state-space scan, which torch.export fixes:
    docs/upstream-gaps.md #27). It is now the decode alone, the prompt of any length fed one token at a time from
    zeroed states into its static key-value cache, the prompt and the reply matching eager `generate()`."""
    out = moe_hybrid[0]
    target = assert_a_passed_stepped_decode(moe_hybrid)
    said = [f for f in target["findings"] if "one token at a time from zeroed states" in f]
    assert said and "its static key-value cache filled from position 0" in said[0], target["findings"]
    assert not [f for f in target["findings"] if "keeps the prompt axis dynamic" in f]  # the stepped note says it
    assert_greedy_parity(target["generation"], prompt_length=8, new_tokens=8)
    assert_checked_at_other_prompt_lengths(target["generation"])  # and at a 4- and a 19-token prompt
    [program] = (out / target["name"]).glob("*.pte")
    assert b"grouped_mm" not in program.read_bytes()


def assert_a_passed_stepped_decode(run: tuple) -> dict:
    """The run's one target passed as the decode alone with a dynamic prompt (no runner layout): its report entry."""
    out, report, log = run
    target = report["targets"][0] if report else {}
    assert target.get("status") == "passed", (log[-3000:], json.dumps(target, indent=1)[:4000])
    assert target["expected_components"] == ["decode"] and [c["name"] for c in target["components"]] == ["decode"]
    manifest = json.loads((out / target["name"] / "export.json").read_text())
    assert manifest.get("layout") != "runner" and manifest["dynamic_prompt"] is True, manifest
    return target


def assert_checked_at_other_prompt_lengths(generation: dict) -> None:
    """A stepped prompt's parity ran at a shorter (4) and a longer (19) prompt than the sample's 8 tokens too, each
    the exported graphs' 8 greedy tokens equal to eager's (#50: a program that works at one length cannot pass)."""
    others = generation.get("other_prompts") or []
    assert [o["prompt_length"] for o in others] == [4, 19], generation
    for other in others:
        assert other["status"] == "passed", other
        tokens = other["eager_tokens"][0]
        assert len(tokens) == 8 and tokens == other["exported_tokens"][0][:8], other
        assert len(set(tokens)) > 1, tokens  # greedy decoding varies: the check can fail


@pytest.fixture(scope="module")
def lfm2_run(tmp_path_factory):
    """LFM2's plainest ExecuTorch recipe through the store: a short convolution layer and an attention layer."""
    recipe = {"schema_version": 1, "exports": [PLAINEST_EXECUTORCH], "generation": {"max_new_tokens": 8}}
    return stored_run(family_model("lfm2", tmp_path_factory.mktemp("lfm2") / "model", recipe, never_eos=True))


def test_lfm2s_plainest_executorch_program_takes_prompts_of_any_length(lfm2_run):
    """#50: LFM2's plainest ExecuTorch program had a prefill fixed at the traced 8 tokens (a dynamic one failed:
    'Attempted to resize a static tensor' at a 2-token prompt, its conv states sliced from the prompt). It is now
    the decode alone, the prompt stepped through it from zeroed conv states into its static key-value cache, as the
    other hybrids', checked at 8 tokens and at 4 and 19."""
    target = assert_a_passed_stepped_decode(lfm2_run)
    said = [f for f in target["findings"] if "one token at a time from zeroed conv states" in f]
    assert said and "short convolutions" in said[0] and "its static key-value cache filled from position 0" in \
        said[0], target["findings"]
    assert not [f for f in target["findings"] if "state-space scan" in f], target["findings"]  # LFM2 has none
    assert_greedy_parity(target["generation"], prompt_length=8, new_tokens=8)
    assert_checked_at_other_prompt_lengths(target["generation"])


@pytest.mark.parametrize("name", [*STEPPED, "executorch"])
def test_parity_runs_the_prompt_and_the_reply_through_the_exported_graphs(hybrid_run, name):
    targets, _, _ = hybrid_run
    assert_greedy_parity(targets[name]["generation"], prompt_length=8, new_tokens=8)


@pytest.mark.parametrize("name", [*STEPPED, "executorch"])
def test_the_stepped_prompt_is_checked_at_a_shorter_and_a_longer_prompt(hybrid_run, name):
    """#50: the stepped decode was checked at the sample's prompt length alone; parity now steps a 4- and a 19-token
    prompt through it too, and the report says so."""
    targets, out, _ = hybrid_run
    assert_checked_at_other_prompt_lengths(targets[name]["generation"])
    assert "the prompt stepped at other lengths too: 4 tokens passed, 19 tokens passed" in \
        (out / "report.md").read_text()


def _logits_negated_at(graph_path, op: str, position: int) -> None:
    """Rewrite the saved ONNX decode so its logits are negated (the argmax becomes eager's last choice) wherever
    `position_ids <op> position` holds, and exact elsewhere: a program that works at some prompt lengths only."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(graph_path, load_external_data=False)  # the weights stay in decode.onnx.data
    for node in model.graph.node:
        node.output[:] = ["logits.exact" if name == "logits" else name for name in node.output]
        node.input[:] = ["logits.exact" if name == "logits" else name for name in node.input]

    def constant(name: str, kind: int, dims: list[int], values: list) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, kind, dims, values))

    model.graph.node.extend([
        constant("at", TensorProto.INT64, [], [position]), constant("axis", TensorProto.INT64, [1], [2]),
        constant("minus_two", TensorProto.FLOAT, [], [-2.0]), constant("one", TensorProto.FLOAT, [], [1.0]),
        helper.make_node(op, ["position_ids", "at"], ["hit"]),
        helper.make_node("Cast", ["hit"], ["hit.float"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["hit.float", "axis"], ["hit.3d"]),
        helper.make_node("Mul", ["hit.3d", "minus_two"], ["hit.scaled"]),
        helper.make_node("Add", ["hit.scaled", "one"], ["sign"]),
        helper.make_node("Mul", ["logits.exact", "sign"], ["logits"])])
    onnx.save(model, graph_path)


# where a decode that works at the sample's 8-token prompt fails: the 4-token prompt's last token (position 3, whose
# logits the 8-token prompt never reads), or any position the 8-token prompt and its 8 new tokens never reach
ONE_LENGTH_ONLY = {"shorter": ("Equal", 3, 4), "longer": ("GreaterOrEqual", 16, 19)}


@pytest.mark.parametrize("case", list(ONE_LENGTH_ONLY))
def test_a_stepped_decode_that_works_at_the_samples_prompt_only_fails(hybrid_run, tmp_path, case):
    """#50: the stepped decode was checked at the recipe's prompt length alone, so a program that only works there
    passed. The saved ONNX decode, rewritten to go wrong only at the shorter (or the longer) prompt, still passes
    every probe and the 8-token parity, and now fails the target, naming the prompt length that diverged."""
    _, out, _ = hybrid_run
    op, position, length = ONE_LENGTH_ONLY[case]
    copy = tmp_path / "out"
    shutil.copytree(out / "onnx", copy / "onnx")
    _logits_negated_at(copy / "onnx" / "decode.onnx", op, position)
    result = run_cli("validate", str(out.parent / "model"), str(copy), "--target", "onnx")
    assert result.returncode == 1, result.stderr[-2000:]
    target = json.loads((copy / "report.json").read_text())["targets"][0]
    assert target["status"] == "failed"
    assert all(check["passed"] for component in target["components"] for check in component["checks"]), target
    generation = target["generation"]
    assert generation["status"] == "failed" and generation["prompt_length"] == 8
    assert generation["eager_tokens"] == [tokens[:8] for tokens in generation["exported_tokens"]]  # 8 tokens: fine
    assert generation["first_divergence"]["prompt_length"] == length, generation["first_divergence"]
    verdicts = {other["prompt_length"]: other["status"] for other in generation["other_prompts"]}
    assert verdicts == {4: "failed" if case == "shorter" else "passed", 19: "failed" if case == "longer" else "passed"}
    assert f"of a {length}-token prompt" in (copy / "report.md").read_text()


def test_an_explicit_merged_true_says_why_the_hybrid_cannot_have_it(hybrid_run):
    targets, _, result = hybrid_run
    target = targets["onnx-merged"]
    assert target["status"] == "failed"
    message = target["error"]["message"]
    assert "state-space scan, which torch.export fixes at the traced length" in message, message
    assert "set `merged` to false" in message and "recurrent_states" in message
    assert result.returncode == 1  # that target failed; the others passed


def test_falcon_h1_with_its_own_mamba_sizes_is_verified_by_probes_sized_from_the_model(tmp_path):
    """Falcon-H1 at its config's own Mamba sizes (128 heads, state 256): the stepped decode's states alone pass the
    default max_probe_elements, which skipped its larger batch probe and left the plainest recipe `unverified`
    (#50 item 7). Probes are sized from the model: within twice the traced inputs, a dim with no declared maximum at
    the sizes that fit; every check runs."""
    import dataclasses

    from matrix.families import FAMILIES, build

    spec = dataclasses.replace(FAMILIES["falcon_h1"], overrides={"projectors_bias": False, "mamba_chunk_size": 16})
    recipe = {"schema_version": 1, "exports": [{"name": "dynamo", "export_format": "dynamo", "dynamic": True}]}
    model_dir = build(spec, tmp_path / "model", recipe=recipe)
    out = tmp_path / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    target = json.loads((out / "report.json").read_text())["targets"][0]
    assert target["status"] == "passed", (target["unverified"], target["error"])
    assert result.returncode == 0
    checks = [check for component in target["components"] for check in component["checks"]]
    assert not [c for c in checks if c["skipped"]], checks
    assert any(c["probe"].startswith("batch_size=") and c["probe"] != "batch_size=1" for c in checks), checks


def test_a_probe_limit_that_bites_names_the_setting_and_the_value_that_admits_it():
    import torch

    from exporters.capture.probes import DimBinding, make_probes

    inputs = {"input_ids": torch.zeros(1, 8, dtype=torch.long)}
    binding = DimBinding("sequence", 2, 64, [("input_ids", 1)], 8)
    skipped = [skip for _, probe, skip in make_probes(inputs, [binding], None, 16, None) if probe is None]
    assert len(skipped) == 2 and skipped[-1] == ("inputs of 64 elements exceed max_probe_elements (16): set "
                                                 "`validation.max_probe_elements` to 64 or more (now 16) to probe it")


def test_a_probe_whose_attention_outgrows_validation_is_skipped_and_a_joint_one_split():
    """#51 item 5: a long prompt is a small input (3 x 8192 elements here, within max_probe_elements) but its
    attention grows with the square (4 heads x 8192 x 8192 = 2^28 elements, 1 GiB a copy in float32; a 131072-token
    prompt's took init and validation past 23 GB): the probe is skipped with the reason. Jointly with a batch of 64
    the prompt's top would exceed it too: the joint probe is split, and each dimension's top runs on its own."""
    from types import SimpleNamespace

    import torch

    from exporters.capture.probes import DimBinding, make_probes

    config = SimpleNamespace(num_attention_heads=4)
    inputs = {"input_ids": torch.zeros(1, 8, dtype=torch.long), "attention_mask": torch.ones(1, 8, dtype=torch.long)}
    tokens = [("input_ids", 1), ("attention_mask", 1)]
    probes = make_probes(inputs, [DimBinding("sequence", 2, 8192, tokens, 8)], config, 10**6, None)
    assert [(probe_id, skip) for probe_id, probe, skip in probes if probe is None] == [
        ("sequence=4097", "its attention (67141636 elements: batch x heads x query x key) exceeds what validation "
                          "computes (67108864, 256 MiB in float32)"),
        ("sequence=8192", "its attention (268435456 elements: batch x heads x query x key) exceeds what validation "
                          "computes (67108864, 256 MiB in float32)")]
    batch = DimBinding("batch", 1, 64, [("input_ids", 0), ("attention_mask", 0)], 1)
    joint = make_probes(inputs, [batch, DimBinding("sequence", 2, 4096, tokens, 8)], config, 10**6, None)
    assert [(probe_id, tuple(probe["input_ids"].shape)) for probe_id, probe, skip in joint] == [
        ("traced", (1, 8)), ("batch=1, sequence=2", (1, 2)), ("batch=32", (32, 8)), ("sequence=2049", (1, 2049)),
        ("batch=64", (64, 8)), ("sequence=4096", (1, 4096))]
