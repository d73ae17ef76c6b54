"""Memory planned before loading (issue #46 item 6): the estimate read from the checkpoint's safetensors headers, and
through the real CLI a run that cannot fit stops with exit 2 before any work, one that fits only with fewer exports
at once runs with fewer and says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from exporters.capture.loading import load_model
from exporters.capture.source import ModelSource
from exporters.errors import MemoryPlanError
from exporters.run.memory_plan import (EXPORT_STACK, LIMIT_ENV, PARENT_STACK, WeightCounts, count_weights, estimate,
                                       parse_limit, plan_memory)
from tests.conftest import run_cli
from tests.models import tiny_bert, write_recipe

BF16_RECIPE = {"exports": [{"export_format": "onnx", "mode": "generation", "dynamic": True},
                           {"export_format": "executorch", "mode": "generation"}]}


@pytest.fixture(scope="module")
def sharded_bf16(tmp_path_factory) -> Path:
    """A tiny Llama in bfloat16, saved in several shards with `model.safetensors.index.json`, tied embeddings."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, dtype="bfloat16")
    folder = tmp_path_factory.mktemp("sharded-bf16")
    LlamaForCausalLM(config).to(torch.bfloat16).eval().save_pretrained(folder, max_shard_size="20KB")
    write_recipe(folder, BF16_RECIPE)
    return folder


def test_the_headers_of_a_sharded_bf16_checkpoint_count_its_parameters(sharded_bf16):
    from safetensors import safe_open

    shards = sorted(sharded_bf16.glob("*.safetensors"))
    assert (sharded_bf16 / "model.safetensors.index.json").is_file() and len(shards) > 1
    stored = 0
    for shard in shards:
        with safe_open(shard, "pt") as handle:
            for name in handle.keys():
                tensor = handle.get_tensor(name)
                assert tensor.dtype == torch.bfloat16
                stored += tensor.numel()
    counts = count_weights(sharded_bf16)
    assert counts == WeightCounts(floating=stored, other_bytes=0, stored_dtype="bfloat16")
    assert counts.bytes_in(None) == 2 * stored and counts.bytes_in("float32") == 4 * stored
    # a shard the index names that is not a plain file name in the folder is not read: the count is refused
    index = json.loads((sharded_bf16 / "model.safetensors.index.json").read_text())
    bad = sharded_bf16.parent / "bad-index"
    bad.mkdir(exist_ok=True)
    (bad / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        name: f"../{sharded_bf16.name}/{file}" for name, file in index["weight_map"].items()}}))
    assert count_weights(bad) is None


def test_a_bf16_checkpoint_loaded_in_float32_is_read_not_mapped_and_in_bf16_stays_mapped(sharded_bf16,
                                                                                           monkeypatch):
    """The load's peak (issue #46 item 6): mapped, every shard stays resident beside the float32 weights until the
    load ends (1.66x the float32 weights); read, each tensor is dropped once converted. The mechanism, not a memory
    figure (benchmarks/bench_load_memory.py measures it): every shard is opened to be read, and the model is the
    one transformers' own mapped load gives, bit for bit."""
    from transformers import LlamaForCausalLM, modeling_utils

    real, opened = modeling_utils.safe_open, []

    def recording(filename, framework, device="cpu", backend="mmap"):
        opened.append((Path(filename).name, backend))
        return real(filename, framework=framework, device=device, backend=backend)

    monkeypatch.setattr(modeling_utils, "safe_open", recording)
    model = load_model(ModelSource(model_id="sharded-bf16", folder=sharded_bf16), dtype="float32")
    assert modeling_utils.safe_open is recording  # the read-not-mapped patch is undone after the load
    shards = sorted(path.name for path in sharded_bf16.glob("*.safetensors"))
    assert sorted(name for name, _ in opened) == shards and {backend for _, backend in opened} == {"pread"}
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    opened.clear()  # in its own dtype nothing is converted: the tensors stay the shards' mapped pages
    as_stored = load_model(ModelSource(model_id="sharded-bf16", folder=sharded_bf16), dtype="bfloat16")
    assert as_stored.dtype == torch.bfloat16
    assert len(opened) == len(shards) and {backend for _, backend in opened} == {"mmap"}

    monkeypatch.undo()
    mapped = LlamaForCausalLM.from_pretrained(sharded_bf16, dtype=torch.float32)
    ours, theirs = dict(model.named_buffers()), dict(mapped.named_buffers())
    ours.update(model.state_dict())
    theirs.update(mapped.state_dict())
    assert ours.keys() == theirs.keys()
    assert all(ours[name].dtype == theirs[name].dtype and torch.equal(ours[name], theirs[name]) for name in ours)


def test_the_estimate_is_the_documented_formula():
    counts = WeightCounts(floating=10**9, other_bytes=0, stored_dtype="bfloat16")
    targets = [("onnx", "float32"), ("executorch", "float32"), ("dynamo", None)]
    # groups: the bf16 dynamo target first (the model in bf16), then the float32 ones (converted in place)
    bf16 = PARENT_STACK + 2 * 10**9 + EXPORT_STACK + int(1.0 * 2 * 10**9)
    fp32_one = PARENT_STACK + 4 * 10**9 + EXPORT_STACK + int(1.1 * 4 * 10**9)
    fp32_two = fp32_one + EXPORT_STACK + int(0.55 * 4 * 10**9)
    assert estimate(counts, targets, "bfloat16", 1) == max(bf16, fp32_one)
    assert estimate(counts, targets, "bfloat16", 2) == max(bf16, fp32_two)
    # a float16 target beside a float32 one: in the float32 group, its child casts its own copy (2 GB)
    cast = estimate(counts, [("onnx", "float32"), ("dynamo", "float16")], "bfloat16", 1)
    assert cast == PARENT_STACK + 4 * 10**9 + max(EXPORT_STACK + int(0.55 * 4 * 10**9),
                                                    EXPORT_STACK + 2 * 10**9 + int(1.0 * 2 * 10**9))


def test_a_cap_that_fits_fewer_jobs_lowers_them_and_says_why(tmp_path, monkeypatch):
    counts_folder = tiny_bert(tmp_path / "m")
    counts = count_weights(counts_folder)
    targets = [("dynamo", None), ("dynamo", None)]
    one, two = estimate(counts, targets, "float32", 1), estimate(counts, targets, "float32", 2)
    monkeypatch.setenv(LIMIT_ENV, str((one + two) // 2))
    notes: list[str] = []
    plan = plan_memory(counts_folder, targets, "float32", 2, requested=False, notes=notes)
    assert (plan.jobs, plan.estimate_bytes, plan.available_from) == (1, one, LIMIT_ENV)
    assert len(notes) == 1 and "2 exports at once need about" in notes[0] and "1 at once instead" in notes[0]
    assert "from the cores" in notes[0]
    assert parse_limit("8GB") == 8 * 10**9 and parse_limit("512MiB") == 512 * 2**20 and parse_limit("1.5G") == 1.5e9
    with pytest.raises(MemoryPlanError, match="is not a size"):
        parse_limit("lots")


def test_a_run_that_cannot_fit_exits_2_before_any_work(sharded_bf16, tmp_path):
    out = tmp_path / "out"
    done = run_cli("run", str(sharded_bf16), "--out", str(out), "--quiet", "--no-bench",
                   env={LIMIT_ENV: "100MB"}, timeout=300)
    text = done.stdout + done.stderr
    assert done.returncode == 2, text
    flat = " ".join(text.split())
    counts = count_weights(sharded_bf16)
    need = estimate(counts, [("onnx", "float32"), ("executorch", "float32")], "bfloat16", 1)
    assert f"needs about {need / 1e9:.1f} GB" in flat, flat
    assert "100 MB is available (EXPORT_ACTION_MEMORY_LIMIT)" in flat, flat
    assert "--jobs 1" in flat and "--target" in flat and "more memory" in flat, flat
    # nothing exported, no report claiming anything
    assert not (out / "onnx").exists() and not (out / "executorch").exists()
    assert not (out / "report.json").exists()
    assert not any(out.glob(".staging-*")) if out.exists() else True


def test_a_cap_that_fits_one_job_runs_one_export_at_a_time(tmp_path):
    model = tiny_bert(tmp_path / "model", {"exports": [{"name": "a", "export_format": "dynamo"},
                                                       {"name": "b", "export_format": "dynamo", "dynamic": True}]})
    counts = count_weights(model)
    targets = [("dynamo", None), ("dynamo", None)]
    one, two = estimate(counts, targets, "float32", 1), estimate(counts, targets, "float32", 2)
    cap = (one + two) // 2
    out = tmp_path / "out"
    done = run_cli("run", str(model), "--out", str(out), "--quiet", "--no-bench", "--jobs", "2",
                   env={LIMIT_ENV: str(cap)})
    report = json.loads((out / "report.json").read_text())
    assert done.returncode == 0, done.stdout + done.stderr
    assert report["jobs"] == 1
    assert report["memory"] == {"estimate_bytes": one, "available_bytes": cap, "available_from": LIMIT_ENV,
                                "jobs": 1, "weights_bytes": counts.bytes_in(None)}
    assert any(f.startswith("memory: 2 exports at once need about") and "1 at once instead (`jobs`)" in f
               for f in report["findings"]), report["findings"]


def test_a_cgroup_limit_leaves_its_room_and_no_limit_leaves_none(tmp_path):
    from exporters.run.resources import _room

    (tmp_path / "memory.max").write_text("1000000000\n")
    (tmp_path / "memory.current").write_text("400000000\n")
    (tmp_path / "memory.stat").write_text("anon 300000000\ninactive_file 100000000\n")
    assert _room(tmp_path, "memory.max", "memory.current", "inactive_file") == 700_000_000
    (tmp_path / "memory.max").write_text("max\n")
    assert _room(tmp_path, "memory.max", "memory.current", "inactive_file") is None


def test_the_memory_default_jobs_reads_is_the_lesser_of_the_machine_and_the_cgroup_limit():
    """`--jobs auto` where the weights cannot be counted (a pytorch_model.bin checkpoint) still honours a container's
    limit: `available_memory` is what the memory plan reads, not the machine's `MemAvailable` alone."""
    from exporters.run.resources import available_memory, cgroup_room, meminfo_available

    readings = [value for value in (meminfo_available(), cgroup_room()) if value is not None]
    available = available_memory()
    assert available is not None and readings
    assert abs(available - min(readings)) < 256 * 2**20  # read at two moments of a shared machine
