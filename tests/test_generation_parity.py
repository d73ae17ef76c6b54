"""Generation parity that generates and fails only on real divergence (issue #12, §2 and §6), through the real CLI
on tiny models exported once per module:

- the first recipe an on-device user writes, `{"export_format": "executorch", "mode": "generation"}`, gets a static
  cache and generates (parity over 8 tokens, the program driven step by step from disk);
- `cache_implementation: "static"` exports in dynamo and ONNX pass parity, driven with the fixed-size cache;
- a decode that could run only one step fails the target with the one recipe change that fixes it;
- eager `generate()`'s logits processors (a Marian's forced EOS, suppressed tokens) select the exported tokens too;
- a near tie is reported and decoding goes on with eager's token; a real divergence fails.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from tests.conftest import PLAINEST_EXECUTORCH, run_cli, run_plainest_executorch
from tests.models import tiny_gemma2, tiny_llama, tiny_marian, tiny_qwen2

SPREAD = 0.3  # logits tenths apart: parity cannot pass on luck, and no step is a near tie
# One decoder layer where no check reads the depth (#48: half the program to trace and lower): the static cache, the
# runner's metadata, a mask per layer type and the decode graph's cache inputs are each layer's alike; at SPREAD a
# one-layer Llama's greedy tokens vary as a two-layer one's do, top-2 gaps of hundredths to tenths. Gemma 2 keeps its
# two (a sliding and a full layer are both read).
ONE_LAYER = 1


def _report(out):
    return json.loads((out / "report.json").read_text())


def _target(out, name):
    return next(t for t in _report(out)["targets"] if t["name"] == name)


def _assert_generates(generation, steps=8):
    assert generation["status"] == "passed", generation
    eager, exported = generation["eager_tokens"][0], generation["exported_tokens"][0]
    assert eager == exported and len(exported) == steps, generation
    assert len(set(exported)) > 2, f"greedy tokens must vary for parity to be able to fail: {exported}"
    assert generation["near_ties"] == []


# ── ExecuTorch with no cache settings: a static cache by default ─────────────


@pytest.fixture(scope="module")
def et_run(tmp_path_factory):
    return run_plainest_executorch(tmp_path_factory.mktemp("et-default"), tiny_llama, initializer_range=SPREAD,
                                   layers=ONE_LAYER)


def test_executorch_generation_defaults_to_a_static_cache_and_generates(et_run):
    _, out, result = et_run
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    target = _target(out, "executorch")
    assert target["status"] == "passed", target["error"]
    generation = target["generation"]
    _assert_generates(generation, steps=8)  # the recipe's default max_new_tokens
    assert generation["cache"] == {"implementation": "static", "max_cache_len": 256}  # max_position_embeddings
    finding = next(f for f in target["findings"] if "static cache" in f)
    assert "declares no dynamic cache axis" in finding and "min(2048, max_position_embeddings 256)" in finding
    assert any("static cache of 256 positions" in f for f in _report(out)["findings"])
    assert "static cache of 256 positions" in (out / "report.md").read_text()


def test_saved_executorch_program_records_its_static_cache(et_run):
    """What a runtime reads from the saved export: the LLM runner's program (the default of a decoder-only model)
    holding a static cache of 256 positions, which its metadata methods say (parity drove this program from disk)."""
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (the program's llama:: kernels)
    from executorch.runtime import Runtime

    _, out, _ = et_run
    manifest = json.loads((out / "executorch" / "export.json").read_text())
    assert manifest["layout"] == "runner" and list(manifest["components"]) == ["model"]
    program = Runtime.get().load_program(out / "executorch" / "model.pte")
    assert program.load_method("get_max_context_len").execute([]) == [256]
    assert program.load_method("use_kv_cache").execute([]) == [True]
    forward = program.load_method("forward")
    assert forward.metadata.num_inputs() == 2 and forward.metadata.num_outputs() == 1  # tokens, positions -> logits


@pytest.fixture(scope="module")
def qwen2_et_run(tmp_path_factory):
    """The methods layout (prefill + decode taking the cache): Qwen2's plainest recipe is the runner's program
    (tests/test_llm_runner.py), so the mask feeding of a decode method is checked on the layout that has one."""
    root = tmp_path_factory.mktemp("et-qwen2")
    model_dir = tiny_qwen2(root / "model", {**PLAINEST_EXECUTORCH, "layout": "methods"}, initializer_range=SPREAD,
                           layers=ONE_LAYER)
    out = root / "out"
    return model_dir, out, run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")


def test_executorch_methods_layout_generates_for_a_model_taking_a_mask_per_layer_type(qwen2_et_run):
    """Qwen2 (and Qwen3, SmolLM3, Gemma...) take `{"full_attention": mask}`: each decode step gets the mask of its
    own position, as `generate()` builds it, not the captured step's."""
    _, out, result = qwen2_et_run
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    target = _target(out, "executorch")
    assert target["status"] == "passed", target["error"]
    decode = json.loads((out / "executorch" / "export.json").read_text())["components"]["decode"]
    assert set(decode["metadata"]["kwargs"]["attention_mask"]["leaves"]) == {"full_attention"}
    _assert_generates(target["generation"], steps=8)


@pytest.fixture(scope="module")
def gemma2_et_run(tmp_path_factory):
    return run_plainest_executorch(tmp_path_factory.mktemp("et-gemma2"), tiny_gemma2)


def test_plainest_executorch_recipe_generates_past_a_sliding_window(gemma2_et_run):
    """A window of 6, an 8-token prompt, 8 new tokens: the static cache keeps the sliding layer whole (a rolling
    window layer's graph is fixed at trace time to one code path: docs/upstream-gaps.md #9), the mask applies the
    window, and the report says what it costs."""
    _, out, result = gemma2_et_run
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    target = _target(out, "executorch")
    assert target["status"] == "passed", target["error"]
    generation = target["generation"]
    assert generation["status"] == "passed", generation
    assert generation["prompt_length"] + len(generation["exported_tokens"][0]) > 6
    assert generation["eager_tokens"] == generation["exported_tokens"]
    finding = next(f for f in target["findings"] if "sliding-window layers whole" in f)
    assert "256 positions each" in finding and "window of 6" in finding
    manifest = json.loads((out / "executorch" / "export.json").read_text())
    # Gemma 2 soft-caps its attention scores, which the custom ops of the runner program's ring buffers cannot: its
    # sliding layers shorter than the cache keep the methods layout, the report saying why
    assert manifest.get("layout") != "runner"
    assert any("ring buffer" in f and "attn_logit_softcapping" in f for f in target["findings"]), target["findings"]
    decode = manifest["components"]["decode"]
    assert set(decode["metadata"]["kwargs"]["attention_mask"]["leaves"]) == {"full_attention", "sliding_attention"}


def test_a_sliding_layers_mask_sees_only_the_window():
    from exporters.capture.steps import causal_mask

    like = torch.zeros(1, 1, 1, 10, dtype=torch.bool)
    assert causal_mask(like, 7, 1, window=3).flatten().tolist() == [False] * 5 + [True] * 3 + [False] * 2
    assert causal_mask(like, 7, 1).flatten().tolist() == [True] * 8 + [False] * 2
    additive = causal_mask(torch.zeros(1, 1, 2, 4), 2, 2, window=2)[0, 0]
    assert (additive == 0).tolist() == [[False, True, True, False], [False, False, True, True]]


def test_each_step_gets_the_mask_of_its_position_for_every_layer_type():
    from exporters.capture.steps import step_inputs

    captured = torch.zeros(1, 1, 1, 6, dtype=torch.bool)
    captured[..., :3] = True  # the traced step: position 2
    template = {"input_ids": torch.tensor([[5]]), "position_ids": torch.tensor([[2]]),
                "attention_mask": {"full_attention": captured, "sliding_attention": captured.clone()}}
    at_4 = step_inputs(template, torch.tensor([[7]]), 4, None)
    assert at_4["attention_mask"]["full_attention"].flatten().tolist() == [True] * 5 + [False]
    assert at_4["attention_mask"]["sliding_attention"].flatten().tolist() == [True] * 5 + [False]
    assert at_4["position_ids"].tolist() == [[4]]
    # past a sliding window of 6 slots the static layer rolls on a path fixed at trace time: fed as captured
    at_6 = step_inputs(template, torch.tensor([[7]]), 6, None)
    assert at_6["attention_mask"]["full_attention"].shape == captured.shape
    assert torch.equal(at_6["attention_mask"]["sliding_attention"], captured)
    assert torch.equal(template["attention_mask"]["full_attention"], captured)  # the template is not changed


# ── static cache in dynamo and ONNX ───────────────────────────────────────────


STATIC = {
    "schema_version": 1,
    "exports": [{"name": "dynamo", "export_format": "dynamo", "mode": "generation"},
                {"name": "onnx", "export_format": "onnx", "mode": "generation"}],
    "generation": {"cache_implementation": "static", "max_cache_len": 24, "max_new_tokens": 10},
}


@pytest.fixture(scope="module")
def static_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("static")
    model_dir = tiny_llama(root / "model", STATIC, initializer_range=SPREAD, layers=ONE_LAYER)
    out = root / "out"
    return model_dir, out, run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")


def test_static_cache_parity_in_dynamo_and_onnx(static_run):
    _, out, result = static_run
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    for name in ("dynamo", "onnx"):
        target = _target(out, name)
        assert target["status"] == "passed", (name, target["error"])
        _assert_generates(target["generation"], steps=10)
        assert target["generation"]["cache"] == {"implementation": "static", "max_cache_len": 24}
        assert not any("static cache" in f for f in target["findings"]), "the recipe chose it: no default to report"
    assert "Parity: static cache of 24 positions" in (out / "report.md").read_text()


def test_onnx_static_decode_graph_takes_the_fixed_size_cache(static_run):
    import onnx

    _, out, _ = static_run
    graph = onnx.load(str(out / "onnx" / "decode.onnx"), load_external_data=False).graph
    dims = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input}
    keys = [dims[name] for name in dims if name.endswith("layers.0.keys")]
    assert keys == [[1, 2, 24, 8]], dims
    assert dims["attention_mask"] == [1, 1, 1, 24]


def test_a_near_tie_continues_and_a_real_divergence_fails(static_run, tmp_path):
    """A decode graph perturbed so that its choices differ from eager's: with the default tolerance the first
    different token is a real divergence; with a tolerance wide enough to cover the perturbation it is a near tie,
    reported, and decoding goes on with eager's token."""
    import onnx
    from onnx import numpy_helper

    model_dir, out, _ = static_run
    copy = tmp_path / "out"
    shutil.copytree(out / "onnx", copy / "onnx")
    decode = copy / "onnx" / "decode.onnx"
    graph = onnx.load(str(decode))
    head = next(t for t in graph.graph.initializer if list(t.dims) == [32, 128])  # lm_head (hidden 32, vocab 128)
    weights = numpy_helper.to_array(head).copy()
    generator = torch.Generator().manual_seed(1)
    weights += torch.randn(weights.shape, generator=generator).numpy() * 2.0
    head.CopyFrom(numpy_helper.from_array(weights, head.name))
    onnx.save(graph, str(decode), save_as_external_data=True, location="decode.onnx.data")

    failed = run_cli("validate", str(model_dir), str(copy), "--target", "onnx")
    assert failed.returncode == 1
    generation = _target(copy, "onnx")["generation"]
    assert generation["status"] == "failed" and generation["near_ties"] == []
    divergence = generation["first_divergence"]
    assert divergence["step"] >= 1 and divergence["eager"] != divergence["exported"]
    assert divergence["eager_score_gap"] > 0

    wide = json.loads(json.dumps(STATIC))
    wide["validation"] = {"formats": {"onnx": {"atol": 50.0}}}
    recipe = tmp_path / "wide.json"
    recipe.write_text(json.dumps(wide))
    passed = run_cli("validate", str(model_dir), str(copy), "--target", "onnx", "--config", str(recipe))
    assert passed.returncode == 0, passed.stderr[-2000:]
    generation = _target(copy, "onnx")["generation"]
    assert generation["status"] == "passed"
    assert generation["near_ties"] and generation["near_ties"][0]["step"] == divergence["step"]
    assert generation["exported_tokens"] == generation["eager_tokens"], "decoding went on with eager's tokens"
    assert "near tie at step" in (copy / "report.md").read_text()


# ── a decode that could run one step only ─────────────────────────────────────


def test_a_decode_frozen_at_its_traced_length_fails_with_the_fix(tmp_path):
    """A decode contract the recipe declares (here: nothing dynamic) is exported as declared, and a decode fixed at
    its traced cache length fails before export, saying what to declare."""
    frozen = {"name": "frozen", "export_format": "dynamo", "mode": "generation", "merged": False,  # not the default
              "components": {"decode": {"dynamic_shapes": {}}}}
    plain = {"name": "plain", "export_format": "dynamo", "mode": "generation", "merged": False}
    recipe = {"schema_version": 1, "exports": [frozen, plain],
              "generation": {"cache_implementation": "dynamic"}}
    # one layer: the refusal names the cache's axis for every layer alike (`cache.layers.*`), and the plain target's
    # decode grows the one axis each layer's cache has (#48: half the prefill and decode graphs to trace)
    model_dir = tiny_llama(tmp_path / "model", recipe, layers=ONE_LAYER)
    out = tmp_path / "out"
    result = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    assert result.returncode == 1
    target = _target(out, "frozen")
    assert target["status"] == "failed" and target["error"]["type"] == "DecodeStepError"
    message = target["error"]["message"]
    assert "could not run a second step" in message
    assert '"cache.layers.*.keys": {"2": "auto"}' in message
    assert 'generation.cache_implementation: "static"' in message
    assert message.count(". ") == 0, "one sentence"
    assert not (out / "frozen").exists(), "nothing is exported for a contract that cannot generate"
    assert "could not run a second step" in result.stdout + result.stderr

    # the same target without any declared contract: the decode gets the one axis generation grows, and generates
    plain_target = _target(out, "plain")
    assert plain_target["status"] == "passed", plain_target.get("error")
    assert plain_target["generation"]["status"] == "passed"
    assert plain_target["generation"]["exported_tokens"] == plain_target["generation"]["eager_tokens"]
    assert any("cache length axis is dynamic" in finding for finding in plain_target["findings"])


# ── eager's token-selection rules on both sides ──────────────────────────────


@pytest.fixture(scope="module")
def marian_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("marian")
    recipe = {"export_format": "dynamo", "mode": "generation", "dynamic": True}
    model_dir = tiny_marian(root / "model", recipe, suppress_tokens=[79, 8])
    out = root / "out"
    return model_dir, out, run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")


def test_forced_eos_and_suppressed_tokens_apply_to_both_sides(marian_run):
    model_dir, out, result = marian_run
    config = json.loads((model_dir / "config.json").read_text())
    assert config["forced_eos_token_id"] == 0 and config["eos_token_id"] == 0
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    generation = _target(out, "dynamo")["generation"]
    assert generation["status"] == "passed", generation
    assert generation["logits_processors"] == ["ForcedEOSTokenLogitsProcessor", "SuppressTokensLogitsProcessor"]
    tokens = generation["exported_tokens"][0]
    assert tokens == generation["eager_tokens"][0] and len(tokens) == 8
    assert tokens[-1] == 0, "eager forces EOS at the last step, and so does the exported loop"
    assert not {79, 8} & set(tokens), "the suppressed tokens (the ones this model picks unsuppressed) never appear"
    assert len(set(tokens[:-1])) > 1
    text = (out / "report.md").read_text()
    assert "`ForcedEOSTokenLogitsProcessor`, `SuppressTokensLogitsProcessor`" in text


# ── the rules, without an export ──────────────────────────────────────────────


@pytest.mark.parametrize(("target", "generation", "expected"), [
    ({}, {}, ("static", 256, True)),
    ({}, {"max_cache_len": 64}, ("static", 64, True)),
    ({"dynamic": True}, {}, ("dynamic", None, False)),
    ({"components": {"decode": {"dynamic_shapes": {"cache.layers.*.keys": {"2": "auto"},
                                                   "cache.layers.*.values": {"2": "auto"}}}}}, {},
     ("dynamic", None, False)),
    ({"components": {"decode": {"dynamic_shapes": {"cache.layers.*.keys": {"0": "auto"}}}}}, {},
     ("static", 256, True)),  # a batch axis is not a cache length axis
    ({}, {"cache_implementation": "dynamic"}, ("dynamic", None, False)),  # the recipe chose: a run-time error
    ({}, {"cache_implementation": "static"}, ("static", 256, False)),
])
def test_cache_setting_per_target(target, generation, expected):
    from exporters.capture.cache_settings import cache_setting
    from exporters.recipe.load import parse_recipe

    recipe = parse_recipe(json.dumps({"exports": [{"export_format": "executorch", "mode": "generation", **target}],
                                      "generation": generation}))
    setting = cache_setting(recipe.exports[0], recipe, max_positions=256)
    assert (setting.implementation, setting.max_cache_len, setting.defaulted) == expected


def test_default_cache_length_is_bounded_by_the_model():
    from exporters.capture.cache_settings import DEFAULT_MAX_CACHE_LEN, cache_setting
    from exporters.recipe.load import parse_recipe

    for fmt in ("executorch", "dynamo"):
        recipe = parse_recipe(json.dumps({"exports": [{"export_format": fmt, "mode": "generation"}],
                                          "generation": {"cache_implementation": "static"}}))
        assert cache_setting(recipe.exports[0], recipe, max_positions=131072).max_cache_len == DEFAULT_MAX_CACHE_LEN
        assert cache_setting(recipe.exports[0], recipe, max_positions=512).max_cache_len == 512
    dynamo = parse_recipe('{"export_format": "dynamo", "mode": "generation"}')
    assert cache_setting(dynamo.exports[0], dynamo, max_positions=256).implementation == "dynamic"


def test_max_cache_len_without_a_static_cache_is_a_recipe_error():
    from exporters.errors import RecipeError
    from exporters.recipe.load import parse_recipe

    recipe = {"exports": [{"export_format": "executorch"}],
              "generation": {"cache_implementation": "dynamic", "max_cache_len": 64}}
    with pytest.raises(RecipeError, match="max_cache_len only applies to a static cache") as err:
        parse_recipe(json.dumps(recipe, indent=1))
    assert err.value.path == "$.generation.max_cache_len"


def _greedy(eager_tokens, scores, tolerance=(1e-3, 1e-3)):
    from transformers import LogitsProcessorList

    from exporters.validate.greedy import EagerReference, Greedy, Tolerances

    reference = EagerReference(torch.tensor(eager_tokens), [torch.tensor(s) for s in scores], LogitsProcessorList(),
                               [])
    return Greedy(len(eager_tokens[0]), {9}, 0, reference, Tolerances(tolerance, tolerance))


def test_near_tie_takes_eagers_token_and_a_real_divergence_stops():
    not_finished = torch.zeros(1, dtype=torch.bool)
    sequence = torch.tensor([[5, 6]])
    greedy = _greedy([[1, 2]], [[[0.0, 3.0, 2.9995, -1.0]], [[0.0, 1.0, 3.0, 2.0]]])
    # the artifact prefers token 2 at step 0, eager's score for it is 0.0005 below eager's choice: a near tie
    chosen = greedy.select(0, sequence, torch.tensor([[0.0, 2.9995, 3.0, -1.0]]), not_finished)
    assert chosen.tolist() == [1] and greedy.divergence is None
    assert greedy.near_ties[0]["step"] == 0 and greedy.near_ties[0]["exported"] == 2
    # at step 1 it prefers token 3, a full 1.0 below eager's token 2: a real divergence
    chosen = greedy.select(1, sequence, torch.tensor([[0.0, 1.0, 2.0, 3.0]]), not_finished)
    assert greedy.divergence == {"batch": 0, "step": 1, "eager": 2, "exported": 3, "eager_score_gap": 1.0}


def test_a_token_eager_suppressed_is_never_a_near_tie():
    greedy = _greedy([[1]], [[[0.0, 3.0, float("-inf")]]], tolerance=(100.0, 0.0))
    greedy.select(0, torch.tensor([[5]]), torch.tensor([[0.0, 1.0, 2.0]]), torch.zeros(1, dtype=torch.bool))
    assert greedy.divergence is not None and greedy.divergence["exported"] == 2
    assert greedy.divergence["eager_score_gap"] is None, "no infinity in report.json"


def test_finished_rows_are_padded_and_not_compared():
    greedy = _greedy([[9, 0], [4, 4]], [[[0.0] * 10, [0.0] * 10], [[0.0] * 10, [0.0] * 10]])
    finished = torch.tensor([True, False])
    logits = torch.zeros(2, 10)
    logits[1, 4] = 1.0
    chosen = greedy.select(1, torch.tensor([[9], [4]]), logits, finished)
    assert chosen.tolist() == [0, 4] and greedy.divergence is None
