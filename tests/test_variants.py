"""Quantized variants, end to end through the real CLI (issue #14).

A tiny Llama recipe with an fp32 ONNX target and its dynamic-int8 variant (the `variants` shorthand), an ExecuTorch
8da4w (PT2E, XNNPACK) target, and a deliberately broken 4-bit variant (`min_top1_agreement: 1.0`, with `atol: 1000`
to show atol never passes a quantized artifact) is run once with `--push --publish-failed` against the Hub emulator:
every target exported, validated with its kind of check, loaded back, benchmarked, and the broken one failed and
left out of the PR. A tiny BERT recipe (model mode, `--no-bench`) covers calibration (ONNX Runtime static, PT2E x86)
and encoder quality by cosine similarity.
"""

from __future__ import annotations

import copy
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from exporters.publish import CARD_END, CARD_START
from exporters.recipe.load import parse_recipe
from exporters.recipe.model import Recipe
from exporters.report.build import MARKDOWN_LIMIT, render_markdown, variants_table
from exporters.validate.benchmark import TIMED_RUNS
from tests.conftest import run_cli
from tests.models import tiny_bert, tiny_llama
from tests.test_publish import HubEnv, description, env  # noqa: F401  (the module's Hub emulator fixture)

PROMPT = {"1": {"name": "prompt", "min": 2, "max": 64}}
PREFILL = {"dynamic_shapes": {"input_ids": PROMPT, "position_ids": PROMPT},
           "prefer_deferred_runtime_asserts_over_guards": True}
PAST = {"2": {"name": "past", "min": 2, "max": 128}}
DECODE_NAMED = {"dynamic_shapes": {"cache.layers.*.keys": PAST, "cache.layers.*.values": PAST},
                "prefer_deferred_runtime_asserts_over_guards": True}
DECODE_AUTO = {"dynamic_shapes": {"cache.layers.*.keys": {"2": "auto"}, "cache.layers.*.values": {"2": "auto"}}}
INT4_BUDGET = {"min_top1_agreement": 0.6, "max_kl": 0.01, "min_greedy_match": 2}
RECIPE = {
    "schema_version": 1,
    "exports": [
        {"name": "onnx", "export_format": "onnx", "mode": "generation", "opset_version": 18,
         "variants": ["fp32", "int8-dynamic"], "components": {"prefill": PREFILL, "decode": DECODE_NAMED}},
        {"name": "et-8da4w", "export_format": "executorch", "mode": "generation",
         "quantize": {"method": "pt2e-xnnpack", "scheme": "8da4w"}, "validation": INT4_BUDGET,
         "components": {"prefill": PREFILL, "decode": DECODE_AUTO}},
        {"name": "et-strict", "export_format": "executorch", "mode": "model",
         "quantize": {"method": "pt2e-xnnpack", "scheme": "8da4w"},
         "validation": {"min_top1_agreement": 1.0, "atol": 1000},
         "dynamic_shapes": {"input_ids": PROMPT, "attention_mask": PROMPT},
         "prefer_deferred_runtime_asserts_over_guards": True},
    ],
    "inputs": {"sequence_length": 6},
    "generation": {"max_new_tokens": 6},
}
PASSING = ["onnx", "onnx-int8", "et-8da4w"]
REPO = "alice/tiny-variants"


@dataclass
class Run:
    out: Path
    result: subprocess.CompletedProcess
    report: dict
    hub_files: dict[str, bytes]
    pr_text: str
    pr_title: str


@pytest.fixture(scope="module")
def run(env: HubEnv, tmp_path_factory) -> Run:  # noqa: F811
    # one layer, seed 1 (#48: 56 CPU s, not 82): the budgets hold with a margin (int4 6/6 greedy tokens, top-1 86%;
    # int8 98%) and the broken variant still fails (86% < 100%); seed 0 at one layer matched one int4 token of two
    folder = tiny_llama(tmp_path_factory.mktemp("tiny-variants"), RECIPE, seed=1, layers=1)
    env.upload_model(REPO, folder)
    out = tmp_path_factory.mktemp("out-variants")
    result = env.cli("run", REPO, "--push", "--publish-failed", "--out", str(out))
    report = json.loads((out / "report.json").read_text())
    [pr] = [d for d in env.hub.discussions(REPO) if d["isPullRequest"]]
    return Run(out, result, report, env.hub.files(REPO, f"refs/pr/{pr['num']}"), description(env.hub, REPO, pr["num"]),
               pr["title"])


def target(run: Run, name: str) -> dict:
    return next(t for t in run.report["targets"] if t["name"] == name)


def test_variants_expand_and_the_broken_one_fails(run: Run):
    assert run.result.returncode == 1, run.result.stderr[-3000:]  # one target failed: the exit code says so
    assert [t["name"] for t in run.report["targets"]] == [*PASSING, "et-strict"]
    statuses = {t["name"]: t["status"] for t in run.report["targets"]}
    assert statuses == {"onnx": "passed", "onnx-int8": "passed", "et-8da4w": "passed", "et-strict": "failed"}, \
        {t["name"]: t.get("error") for t in run.report["targets"]}


def test_each_variant_is_validated_with_its_kind_of_check(run: Run):
    fp32 = target(run, "onnx")
    assert fp32["quality"]["judged_by"] == "tolerance" and fp32["quality"]["kind"] == "fp32"
    for component in fp32["components"]:
        for check in component["checks"]:
            assert check["outputs"] and check["quality"] is None
            assert all(o["passed"] and o["atol"] == 1e-4 for o in check["outputs"])
    assert fp32["generation"]["eager_tokens"] == fp32["generation"]["exported_tokens"]  # fp32: token for token
    for name, kind in (("onnx-int8", "int8"), ("et-8da4w", "int4")):
        quantized = target(run, name)
        quality = quantized["quality"]
        assert (quality["judged_by"], quality["kind"], quality["passed"]) == ("metrics", kind, True)
        for component in quantized["components"]:
            for check in component["checks"]:  # task metrics on every probe, never an atol comparison
                assert not check["outputs"] and check["quality"]["positions"] >= 1, check
        metrics, budget = quality["metrics"], quality["budget"]
        assert metrics["probes"] >= 5 and metrics["positions"] > 50
        assert metrics["top1_agreement"] >= budget["min_top1_agreement"]
        assert 0 <= metrics["kl"] <= budget["max_kl"]
        generation = quantized["generation"]
        assert generation["status"] == "passed"
        assert generation["matched_tokens"] == metrics["greedy_match"] >= generation["required_tokens"] >= 1
    assert target(run, "et-8da4w")["quality"]["budget"] == {**INT4_BUDGET, "min_cosine": 0.95}  # recipe over default
    assert target(run, "onnx-int8")["quality"]["budget"]["min_top1_agreement"] == 0.90  # the int8 default


def test_the_model_is_not_degenerate(run: Run):
    eager = target(run, "onnx")["generation"]["eager_tokens"][0]
    assert len(set(eager)) == len(eager) == 6  # greedy tokens vary: top-1 agreement can fail


def test_broken_variant_fails_on_its_metric_not_on_atol_and_is_not_published(run: Run):
    broken = target(run, "et-strict")
    quality = broken["quality"]
    assert quality["passed"] is False and quality["kind"] == "int4"
    assert quality["decided_by"].startswith("top-1 agreement") and "< 100.0% (min_top1_agreement)" in \
        quality["decided_by"]
    assert quality["metrics"]["top1_agreement"] < 1.0 and quality["metrics"]["positions"] > 50
    assert "quality outside its budget: top-1 agreement" in broken["error"]["message"]
    assert (run.out / "et-strict" / "model.pte").is_file()  # exported, validated, kept in OUT for inspection
    assert "failed: et-strict" in run.pr_title
    assert not any(path.startswith("exports/et-strict/") for path in run.hub_files)
    for name in PASSING:
        assert f"exports/{name}/export.json" in run.hub_files


def test_each_published_folder_loads_back_and_runs(run: Run):
    from transformers import AutoModelForCausalLM, DynamicCache
    from transformers.exporters import ExportedModel

    from exporters.upstream import load_exported

    eager = AutoModelForCausalLM.from_pretrained(REPO).eval()  # from the Hub emulator
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    positions = torch.arange(ids.shape[1])[None]
    with torch.no_grad():
        reference = eager(input_ids=ids, position_ids=positions).logits
    for name in PASSING:
        # an ExecuTorch target is one program with a method per component, which upstream's loader cannot run
        # (docs/upstream-gaps.md #11): the documented loader is the adapter's
        executorch = target(run, name)["export_format"] == "executorch"
        exported = (load_exported(run.out / name, allow_pickles=False) if executorch
                    else ExportedModel.from_pretrained(run.out / name))
        assert set(exported.runners) == {"prefill", "decode"}
        out = exported.runners["prefill"](input_ids=ids, position_ids=positions,
                                          cache=DynamicCache(config=eager.config))
        assert out["logits"].shape == reference.shape and torch.isfinite(out["logits"]).all()
        assert (out["logits"].argmax(-1) == reference.argmax(-1)).float().mean() >= 0.6, name


def test_int8_is_smaller_than_fp32(run: Run):
    fp32, int8 = (sum((run.out / name / f"{c}.onnx.data").stat().st_size for c in ("prefill", "decode"))
                  for name in ("onnx", "onnx-int8"))
    assert int8 < fp32 / 2, (int8, fp32)
    assert target(run, "onnx-int8")["bench"]["size_bytes"] < target(run, "onnx")["bench"]["size_bytes"]


def test_export_json_records_what_was_quantized_and_how(run: Run):
    def manifest(name: str) -> dict:
        return json.loads((run.out / name / "export.json").read_text())

    assert "quantization" not in manifest("onnx")
    onnx = manifest("onnx-int8")["quantization"]
    assert onnx["method"] == "onnxruntime-dynamic" and onnx["kind"] == "int8"
    assert onnx["quantizer"] == "transformers.exporters.OnnxRuntimeQuantizer(OnnxRuntimeDynamicConfig)"
    assert onnx["quantized_ops"]["prefill"]["MatMulInteger"] > 0 and "onnxruntime" in onnx["packages"]
    et = manifest("et-8da4w")["quantization"]
    assert (et["method"], et["options"], et["kind"]) == ("pt2e-xnnpack", {"scheme": "8da4w"}, "int4")
    assert et["weights"].startswith("int4 per-channel") and "dynamic" in et["activations"]
    assert json.loads(run.hub_files["exports/et-8da4w/export.json"])["quantization"] == et  # published as is


def test_every_passing_artifact_is_benchmarked_on_this_machine(run: Run):
    machine = run.report["machine"]
    assert machine["cpu"] and machine["cores"] >= 1 and "gpu" in machine
    for name in PASSING:
        bench = target(run, name)["bench"]
        assert "error" not in bench, bench
        assert bench["size_bytes"] > 0 and bench["load_s"] > 0 and bench["peak_rss_mb"] > bench["runtime_peak_mb"] > 0
        for component in ("prefill", "decode"):
            latency = bench["latency"][component]
            assert latency["runs"] == TIMED_RUNS and 0 < latency["median_ms"] <= latency["p90_ms"]
        generation = bench["generation"]
        assert generation["prompt_length"] == 6 and generation["new_tokens"] == 6
        assert generation["prefill_ms"] > 0 and generation["decode_tokens_per_s"] > 0
    assert "bench" not in target(run, "et-strict") or target(run, "et-strict")["bench"] is None


def test_report_pr_and_card_hold_the_variants_table(run: Run):
    report_md = (run.out / "report.md").read_text()
    header = "| variant | format | size | latency / tokens per second | quality | runs in | verdict |"
    assert report_md.index(header) < report_md.index("### ")  # the table comes before the per-target sections
    rows = [line for line in report_md.splitlines() if line.startswith("| `")]
    table = rows[:4]
    assert [row.split("`")[1] for row in table] == ["et-strict", *PASSING]  # the failed one first
    assert sum("🪶 smallest" in row for row in table) == 1 and sum("⚡ fastest" in row for row in table) == 1
    assert "❌ failed: ValidationError: quality outside its budget" in table[0]
    assert "tok/s" in table[1] and "✅ 6/6 tokens" in table[1] and "top-1" in table[2]
    for name in [*PASSING, "et-strict"]:  # one line per variant naming the metric that decided
        assert sum(line.startswith(f"- `{name}` (") for line in report_md.splitlines()) == 1
    assert "cores" in report_md and f"median (p90) of {TIMED_RUNS} runs" in report_md
    assert header in run.pr_text and "| `et-strict`" in run.pr_text
    card = run.hub_files["README.md"].decode()
    section = card[card.index(CARD_START):card.index(CARD_END)]
    assert header in section and "| `onnx-int8`" in section and "et-strict" not in section


def test_action_summary_and_sticky_comment_show_the_table(run: Run):
    from action.summary import run_markdown

    report_md = (run.out / "report.md").read_text()
    header = "| variant | format | size | latency / tokens per second | quality | runs in | verdict |"
    summary = run_markdown(run.report, report_md, None, collapse_report=False)  # the job summary
    comment = run_markdown(run.report, report_md, None, collapse_report=True)  # the sticky PR comment
    assert header in summary
    assert comment.index(header) < comment.index("<details><summary>Full report")  # visible, not folded


def test_report_stays_under_the_limit_with_many_variants(run: Run):
    many = copy.deepcopy(run.report)
    many["targets"] = [{**copy.deepcopy(t), "name": f"{t['name']}-{i}"} for i in range(40) for t in run.report["targets"]]
    text = render_markdown(many)
    assert len(text.encode()) <= MARKDOWN_LIMIT
    assert len("\n".join(variants_table(many)).encode()) > MARKDOWN_LIMIT // 2  # its runtimes' details: too long
    table = "\n".join(variants_table(many, runtime_details=False))
    assert table in text  # the table is whole, each runtime's mark kept; only per-target details are cut
    assert "ONNX Runtime GenAI ✗ |" in table or "ONNX Runtime GenAI ✗ ·" in table


def test_variants_shorthand_expands_to_named_targets():
    recipe = parse_recipe(json.dumps(RECIPE))
    names = [(t.name, t.dtype, t.quantize.method if t.quantize else None) for t in recipe.exports]
    assert names == [("onnx", "float32", None), ("onnx-int8", None, "onnxruntime-dynamic"),
                     ("et-8da4w", None, "pt2e-xnnpack"), ("et-strict", None, "pt2e-xnnpack")]
    assert all(t.variants is None for t in recipe.exports)
    assert Recipe.model_validate(recipe.model_dump()) == recipe  # expanded once: a dump re-reads the same
    assert recipe.target("onnx-int8").components["prefill"].dynamic_shapes == recipe.target("onnx").components[
        "prefill"].dynamic_shapes
    # an expanded target's settings are written in the target it came from; later targets keep their own index
    assert recipe.locate("onnx-int8", "components")[0] == "$.exports[0].components"
    assert recipe.locate("et-strict", "dynamic_shapes")[0] == "$.exports[2].dynamic_shapes"


def test_cli_check_lists_the_expanded_targets(tmp_path):
    path = tmp_path / "export_config.json"
    path.write_text(json.dumps(RECIPE))
    result = run_cli("check", str(path))
    assert result.returncode == 0, result.stderr
    assert [line.split(":")[0] for line in result.stdout.splitlines()] == [*PASSING, "et-strict"]


# ── An encoder: calibration, static int8, PT2E x86, cosine; no benchmark ──────

SEQ = {"1": {"name": "seq", "min": 2, "max": 32}}
BERT_RECIPE = {
    "schema_version": 1,
    "exports": [
        {"name": "onnx", "export_format": "onnx", "mode": "model", "variants": ["fp32", "int8-static"],
         "dynamic_shapes": {"input_ids": SEQ, "attention_mask": SEQ, "token_type_ids": SEQ}},
        {"name": "dynamo-x86", "export_format": "dynamo", "mode": "model", "quantize": {"method": "pt2e-x86"}},
    ],
    "inputs": {"sequence_length": 8, "calibration": {"samples": 3}},
}


@pytest.fixture(scope="module")
def encoder(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess, dict]:
    folder = tiny_bert(tmp_path_factory.mktemp("bert-variants"), BERT_RECIPE)
    out = tmp_path_factory.mktemp("out-bert")
    result = run_cli("run", str(folder), "--out", str(out), "--quiet", "--no-bench")
    return out, result, json.loads((out / "report.json").read_text())


def test_encoder_variants_calibrate_on_the_recipe_and_are_judged_by_cosine(encoder):
    out, result, report = encoder
    assert result.returncode == 0, result.stderr[-3000:]
    targets = {t["name"]: t for t in report["targets"]}
    assert list(targets) == ["onnx", "onnx-int8-static", "dynamo-x86"]
    for name in ("onnx-int8-static", "dynamo-x86"):
        quality = targets[name]["quality"]
        assert quality["judged_by"] == "metrics" and quality["metrics"]["positions"] == 0  # no logits: cosine
        assert quality["budget"]["min_cosine"] <= quality["metrics"]["cosine"] < 1.0 + 1e-6
        assert quality["decided_by"].startswith("hidden-state cosine")
        record = json.loads((out / name / "export.json").read_text())["quantization"]
        assert record["calibration"] == {"source": "samples", "samples": 3, "per_component": {"model": 3}}
    static = json.loads((out / "onnx-int8-static" / "export.json").read_text())["quantization"]
    assert static["quantized_ops"]["model"]["QuantizeLinear"] > 0
    assert targets["dynamo-x86"]["quantization"]["quantizer"].endswith("PT2EQuantizer(X86InductorQuantizer)")


def test_no_bench_skips_timing(encoder):
    out, _, report = encoder
    assert all(t["bench"] is None for t in report["targets"]) and report["machine"] is None
    assert "not measured" in (out / "report.md").read_text()


# ── The metrics themselves ────────────────────────────────────────────────────


def test_quality_metrics_and_the_metric_that_decides():
    from exporters.report.results import GenerationReport
    from exporters.validate.quality import greedy_match, judge, measure

    torch.manual_seed(0)
    logits = torch.randn(1, 10, 50) * 4
    same = measure({"logits": logits}, {"logits": logits.clone()})
    assert (same["positions"], same["top1_matches"], same["kl_sum"], same["problems"]) == (10, 10, 0.0, [])
    flipped = logits.clone()
    flipped[0, :3] = -flipped[0, :3]  # three positions now disagree
    off = measure({"logits": logits}, {"logits": flipped})
    assert off["top1_matches"] == 7 and off["kl_sum"] > 1
    broken = measure({"logits": logits, "past": logits}, {"logits": logits * float("nan")})
    assert broken["problems"] == ["'logits' holds NaN or inf"]  # only logits are judged when a graph has them
    hidden = measure({"last_hidden_state": torch.ones(1, 4, 8)}, {"last_hidden_state": -torch.ones(1, 4, 8)})
    assert hidden["positions"] == 0 and hidden["cosine"] == pytest.approx(-1.0)

    budget = {"min_top1_agreement": 0.9, "max_kl": 0.05, "min_cosine": 0.99, "min_greedy_match": 4}
    verdict = judge("int8", budget, [("prefill", "traced", same), ("decode", "traced", off)], None)
    assert verdict["passed"] is False and verdict["metrics"]["top1_agreement"] == pytest.approx(17 / 20)
    assert verdict["decided_by"] == "top-1 agreement 85.0% < 90.0% (min_top1_agreement)"
    assert judge("int8", budget, [("prefill", "traced", same)], None)["passed"] is True
    assert judge("int8", budget, [("prefill", "traced", broken)], None)["decided_by"].startswith("broken outputs")
    assert judge("int8", budget, [], None)["passed"] is None  # nothing measured is not a pass

    generation = GenerationReport("failed", 6, eager_tokens=[[5, 6, 7, 8, 9, 10]], exported_tokens=[[5, 6, 7, 1, 9, 10]])
    assert greedy_match(generation) == (3, 6)


def test_a_quantized_stepped_prompt_is_judged_at_every_prompt_length_it_ran():
    """#50: a stepped prompt's parity runs at a shorter and a longer prompt too (`other_prompts`); a quantized
    target's budget (`min_greedy_match`) holds at each of them, not only at the sample's."""
    from exporters.report.results import GenerationReport
    from exporters.validate.quality import judge_generation

    def report(longer: list[int]) -> GenerationReport:
        generation = GenerationReport("failed", 6, eager_tokens=[[5, 6, 7, 8, 9, 10]],
                                      exported_tokens=[[5, 6, 7, 8, 1, 10]])
        generation.other_prompts = [
            {"prompt_length": 4, "status": "passed", "eager_tokens": [[1, 2, 3, 4, 5, 6]],
             "exported_tokens": [[1, 2, 3, 4, 5, 6]], "reason": None},
            {"prompt_length": 19, "status": "failed", "eager_tokens": [[9, 8, 7, 6, 5, 4]],
             "exported_tokens": [longer], "reason": None}]
        return generation

    budget = {"min_greedy_match": 4}
    within = report([9, 8, 7, 6, 1, 1])  # 4 tokens matched at the longer prompt: the budget holds
    judge_generation(within, budget)
    assert within.status == "passed" and within.matched_tokens == 4
    assert [o["status"] for o in within.other_prompts] == ["passed", "passed"]
    beyond = report([9, 8, 1, 1, 1, 1])  # the sample's prompt within budget, the longer one not
    judge_generation(beyond, budget)
    assert beyond.status == "failed"
    assert beyond.other_prompts[1]["matched_tokens"] == 2 and beyond.other_prompts[1]["status"] == "failed"


def test_variant_kinds_and_budget_defaults():
    from exporters.recipe.budgets import DEFAULT_BUDGETS, resolve_budget, variant_kind

    recipe = parse_recipe(json.dumps(RECIPE))
    kinds = [variant_kind(t.quantize, t.dtype) for t in recipe.exports]
    assert kinds == ["fp32", "int8", "int4", "int4"]
    assert resolve_budget("int4", recipe.target("et-strict").validation) == {**DEFAULT_BUDGETS["int4"],
                                                                             "min_top1_agreement": 1.0}
    assert variant_kind(None, "bfloat16") == "half"
