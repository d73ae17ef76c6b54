"""The ExecuTorch LLM runner's layout, the default of decoder-only ExecuTorch generation targets: one `model.pte`
that executorch's own `TextLLMRunner` runs from the target folder alone, generating what eager generates.

Each model is exported once (module-scoped fixtures) through the real CLI; every check reads that one export.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from tests.conftest import PLAINEST_EXECUTORCH, ROOT, run_and_read, run_cli, targets_by_name
from tests.export_store import stored_run
from tests.models import RUNNER_EOS as EOS
from tests.models import runner_model, tiny_llama

PROMPT = "the quick brown fox jumps over the lazy dog"
RUNNER = "ExecuTorch LLM runner"
# a sitecustomize: each runtime proof's child (started with -c; the CLI and its forked exports are not) writes the
# modules it had loaded when it ended
MODULES_DUMPER = """import atexit, json, os, sys
if sys.argv[:1] == ["-c"]:
    atexit.register(lambda: json.dump(sorted(sys.modules), open(os.path.join({folder!r}, f"{{os.getpid()}}.json"), "w")))
"""


# A chat model's template (one turn: the role, the content; the generation prompt), as a repo's chat_template.jinja
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def _export(root: Path, kind: str, recipe, bench: bool = False, layers: int = 2,
            chat_template: bool = False) -> tuple[Path, dict, str]:
    model_dir = runner_model(root / "model", kind, recipe, layers=layers)
    if chat_template:
        (model_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    return run_and_read(root, model_dir, bench=bench)


RECIPE = {"exports": [PLAINEST_EXECUTORCH], "inputs": {"prompt": PROMPT}, "generation": {"max_new_tokens": 8}}
# each runner fixture's decoder layers, which its program's `get_n_layers` reports (#48: one where no check reads
# the depth)
LAYERS = {"llama_runner": 2, "qwen2_plain_runner": 1}


@pytest.fixture(scope="module")
def llama_runner(tmp_path_factory):
    """The tiny Llama (tied embeddings) with the plainest ExecuTorch recipe, benchmarked; its repo holds a chat
    template (the runner proof's prompt and the card's are one user turn in it)."""
    return _export(tmp_path_factory.mktemp("runner-llama"), "llama", RECIPE, bench=True, layers=LAYERS["llama_runner"],
                   chat_template=True)


@pytest.fixture(scope="module")
def qwen2_plain_runner(tmp_path_factory):
    """Qwen2 with the custom ops off, and a static cache of 48 positions; one decoder layer (#48: its checks read
    the custom ops, the cache length, the untied head and the layer count the program reports, not the depth)."""
    recipe = {**RECIPE, "exports": [{**PLAINEST_EXECUTORCH, "custom_ops": False}],
              "generation": {"max_new_tokens": 8, "cache_implementation": "static", "max_cache_len": 48}}
    return _export(tmp_path_factory.mktemp("runner-qwen2"), "qwen2", recipe, layers=LAYERS["qwen2_plain_runner"])


@pytest.fixture(scope="module")
def gemma3_runner(tmp_path_factory):
    """A tiny Gemma 3 text (a sliding-window layer of window 6, then a full-attention one) with the plainest recipe:
    its 9-token prompt and 8 new tokens cross the window and wrap the 12-slot ring buffer (#52 item 5)."""
    return stored_run(runner_model(tmp_path_factory.mktemp("runner-gemma3") / "model", "gemma3", RECIPE))


def _target(report: dict) -> dict:
    return report["targets"][0]


@pytest.mark.parametrize("fixture", ["llama_runner", "qwen2_plain_runner", "gemma3_runner"])
def test_the_runner_program_passes_and_runs_in_the_runner(fixture, request):
    out, report, log = request.getfixturevalue(fixture)
    target = _target(report)
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    proofs = {p["runtime"]: p for p in target["runtimes"]}
    assert proofs["ExecuTorch LLM runner"] == {"runtime": "ExecuTorch LLM runner", "status": "passed",
                                                "detail": "8/8 tokens", "compared": 8, "asked": 8}
    assert "ExecuTorch LLM runner ✓ 8/8 tokens" in (out / "report.md").read_text()
    generation = target["generation"]
    assert generation["status"] == "passed" and generation["exported_tokens"] == generation["eager_tokens"]
    assert len(generation["eager_tokens"][0]) == 8


def test_the_runner_proofs_child_forked_warm_answers_as_a_cold_one(qwen2_plain_runner):
    """The tests start this environment's proof children warm (tests/side_launcher.py, `HF_EXPORT_PROOF_PYTHON`):
    the runner proof's own child on a stored folder, forked from the proof launcher, gives the pieces and stats a
    cold interpreter gives."""
    from exporters.layouts.executorch_llm.proof import CHILD
    from exporters.upstream import read_manifest
    from tests.side_launcher import warm_and_cold

    out, report, _ = qwen2_plain_runner
    folder = out / _target(report)["name"]
    entry = read_manifest(folder)["components"]["model"]
    spec = {"program": str(folder / entry["file"]), "tokenizer": str(folder / "tokenizer.json"),
            "data": str(folder / entry["data_file"]) if entry.get("data_file") else None, "prompt": PROMPT,
            "max_new_tokens": 8}
    found = warm_and_cold(CHILD, spec, folder)
    assert found["calls"] == ["warm"], found["calls"]
    assert found["warm"] == found["cold"] and found["warm"][1] == "", found
    assert len(found["warm"][0]["pieces"]) == 8 and found["warm"][0]["stats"]["prompt_tokens"] > 1, found["warm"]


@pytest.mark.parametrize("fixture,custom,cache,tied", [("llama_runner", True, 64, True),
                                                       ("qwen2_plain_runner", False, 48, False)])
def test_the_folder_holds_the_runner_contract(fixture, custom, cache, tied, request):
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401
    from executorch.runtime import Runtime

    out, report, _ = request.getfixturevalue(fixture)
    folder = out / "executorch"
    names = sorted(p.name for p in folder.iterdir())
    # an untied model's weights are inside model.pte; a tied one's in model.ptd, where the table is stored once
    assert "model.pte" in names and [n for n in names if n.endswith(".ptd")] == (["model.ptd"] if tied else []), names
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json", "export.json"):
        assert name in names, names
    manifest = json.loads((folder / "export.json").read_text())
    assert manifest["layout"] == "runner" and manifest["custom_ops"] is custom
    assert list(manifest["components"]) == ["model"]
    assert manifest["components"]["model"].get("data_file") == ("model.ptd" if tied else None)
    data = {"data_path": folder / "model.ptd"} if tied else {}
    program = Runtime.get().load_program(folder / "model.pte", **data)
    methods = set(program.method_names)
    expected = {"forward", "get_max_seq_len", "get_max_context_len", "get_max_batch_size", "get_bos_id",
                "get_eos_id", "get_eos_ids", "get_vocab_size", "get_n_layers", "get_n_kv_heads", "get_head_dim",
                "use_kv_cache", "use_sdpa_with_kv_cache", "enable_dynamic_shape"}
    assert expected <= methods, methods
    value = {name: program.load_method(name).execute([]) for name in expected - {"forward"}}
    assert value["get_max_seq_len"] == [cache] and value["get_max_context_len"] == [cache]
    assert value["use_sdpa_with_kv_cache"] == [custom] and value["enable_dynamic_shape"] == [True]
    assert value["get_n_layers"] == [LAYERS[fixture]]
    assert value["get_n_kv_heads"] == [2] and value["get_head_dim"] == [8]
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    eos = next(t["id"] for t in tokenizer["added_tokens"] if t["content"] == EOS)
    assert value["get_eos_ids"] == [eos]
    forward = program.load_method("forward")
    assert forward.metadata.num_inputs() == 2 and forward.metadata.num_outputs() == 1
    # the prompt in one call, then one token at its position: the program keeps the cache
    logits = forward.execute([torch.tensor([[5, 6, 7]]), torch.arange(3)])[0]
    assert logits.shape[:2] == (1, 3)
    nodes = "llama" in (folder / "model.pte").read_bytes().decode("latin-1")
    assert nodes is custom


def test_sliding_window_layers_get_ring_buffers_in_the_runner_program(gemma3_runner):
    """#52 item 5: Gemma 3's sliding-window layer is a ring buffer of twice its window (ExecuTorch's
    `llama::update_cache_with_indices`), its full-attention layer the static cache; one call takes at most the window
    (`get_max_seq_len`), so the runner feeds the 9-token prompt in two chunks. The runner's tokens equal eager's
    (test_the_runner_program_passes_and_runs_in_the_runner), and eager's differ with a window of 5, 7 or none."""
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401
    from executorch.runtime import Runtime

    out, report, log = gemma3_runner
    target = _target(report)
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    generation = target["generation"]
    assert generation["prompt_length"] == 9 and len(generation["exported_tokens"][0]) == 8  # 17 > 2 * window
    folder = out / "executorch"
    manifest = json.loads((folder / "export.json").read_text())
    assert manifest["layout"] == "runner" and manifest["custom_ops"] is True
    program = Runtime.get().load_program(folder / "model.pte")
    value = {name: program.load_method(name).execute([]) for name in ("get_max_seq_len", "get_max_context_len")}
    assert value == {"get_max_seq_len": [6], "get_max_context_len": [64]}
    assert "update_cache_with_indices" in (folder / "model.pte").read_bytes().decode("latin-1")
    assert any("ring buffers of 12 slots, not 64" in f for f in target["findings"]), target["findings"]
    assert not any("keeps its sliding-window layers whole" in f for f in target["findings"]), target["findings"]


def test_a_softcapped_sliding_window_model_keeps_the_methods_layout(tmp_path):
    """Gemma 2 caps its attention scores (attn_logit_softcapping), which `llama::custom_sdpa` cannot, so its runner
    program would have the standard ops, and a sliding-window layer's ring buffer needs the custom ones: the default
    target keeps the methods layout and says why; `layout: "runner"` is refused. Without the cap it fits."""
    from transformers import AutoModelForCausalLM

    from exporters.capture import llm_runner
    from exporters.errors import TargetPlanError
    from exporters.recipe.load import parse_recipe

    model = AutoModelForCausalLM.from_pretrained(runner_model(tmp_path / "model", "gemma2", RECIPE)).eval()
    plain = parse_recipe(json.dumps(PLAINEST_EXECUTORCH)).exports[0]
    inputs = {"input_ids": torch.tensor([[5, 6, 7]])}
    assert llm_runner.wants_runner(plain, "text", "static", 1, 6, 64)
    why = llm_runner.refused(plain, model, inputs, 64)
    assert why is not None and "sliding-window layers (window 6" in why and "attn_logit_softcapping" in why, why
    asked = parse_recipe(json.dumps({**PLAINEST_EXECUTORCH, "layout": "runner"})).exports[0]
    with pytest.raises(TargetPlanError, match="ring buffer"):
        llm_runner.refused(asked, model, inputs, 64)
    assert llm_runner.refused(plain, model, inputs, 4) is None  # a window the cache does not exceed: no ring
    model.config.attn_logit_softcapping = None
    assert llm_runner.refused(plain, model, inputs, 64) is None


def test_the_8da4w_variant_of_a_model_that_cannot_be_a_runner_program_fails_saying_why(tmp_path):
    """Issue #51's sweep: `variants: ["8da4w"]` (docs/recipe.md's one-liner) on Gemma 2, which keeps the methods
    layout (above), failed in the export's child with a bare ValueError that named neither the model's reason nor the
    variant. The target now fails before exporting (TargetPlanError, exit 1), saying the method, why this model is
    not a runner program and what quantizes a methods program; no program is written. A target whose own settings
    give the methods layout (a dynamic cache) is told the same (unit)."""
    from exporters.capture import llm_runner
    from exporters.export.quantize import layout_refusal
    from exporters.recipe.load import parse_recipe

    variant = {"export_format": "executorch", "mode": "generation", "variants": ["8da4w"]}
    recipe = {**RECIPE, "exports": [variant]}
    out, report, log = run_and_read(tmp_path, runner_model(tmp_path / "model", "gemma2", recipe, layers=1))
    target = targets_by_name(report)["executorch-8da4w"]
    assert target["status"] == "failed" and target["error"]["type"] == "TargetPlanError", (log[-3000:], target)
    said = target["error"]["message"]
    for part in ("'torchao-xnnpack'", "'8da4w'", "layout 'methods'", "attn_logit_softcapping",
                 "sliding-window layers (window 6", '"method": "pt2e-xnnpack", "scheme": "8da4w"'):
        assert part in said, said
    assert not list(out.rglob("*.pte")), sorted(p.name for p in out.rglob("*"))
    # the report's variant column says what was asked, not the recipe's default dtype (fp32)
    row = next(line for line in (out / "report.md").read_text().splitlines() if line.startswith("| `executorch-8da4w`"))
    assert "torchao-xnnpack" in row and "fp32" not in row, row
    dynamic = parse_recipe(json.dumps({**variant, "dynamic": True})).exports[0]
    assert "(its settings give it a method per component)" in layout_refusal(dynamic, "text",
                                                                              llm_runner.methods_reason(None))
    plain = parse_recipe(json.dumps(PLAINEST_EXECUTORCH)).exports[0]
    assert layout_refusal(plain, "text", "any reason") is None  # a float target: nothing to refuse


def test_a_tied_runner_program_stores_the_table_once_and_is_benchmarked(llama_runner):
    """#46 §4, #47 §7: the plainest ExecuTorch recipe of a model with tied embeddings writes the runner program with
    its weights in model.ptd, each tensor once (the report's ratio read from the files' bytes), and its benchmark
    times the program as the runner feeds it (the prompt, then one token per call at its position)."""
    from transformers import AutoModelForCausalLM

    from exporters.upstream import pte_weight_bytes

    out, report, log = llama_runner
    target = _target(report)
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    eager = AutoModelForCausalLM.from_pretrained(out.parent / "model")
    assert eager.lm_head.weight is eager.model.embed_tokens.weight  # tied
    folder = out / "executorch"
    stored, parameters = target["weights_stored_bytes"], target["parameter_bytes"]
    assert stored / parameters < 1.1, (stored, parameters)
    assert stored >= parameters and stored >= (folder / "model.ptd").stat().st_size  # read from the files
    assert not any("parameter bytes" in f for f in target["findings"]), target["findings"]
    assert pte_weight_bytes(folder / "model.pte") < 0.01 * parameters  # the program keeps none of its own
    bench = target["bench"]
    assert "error" not in bench and not any("benchmark" in f for f in target["findings"]), bench
    generation = bench["generation"]
    assert generation["prefill_ms"] > 0 and generation["decode_tokens_per_s"] > 0, bench
    assert generation["new_tokens"] == 8 and bench["latency"]["model"]["runs"] > 0, bench
    assert bench["size_bytes"] >= (folder / "model.pte").stat().st_size + (folder / "model.ptd").stat().st_size


def test_the_methods_layout_stays_available(tmp_path):
    """`layout: "methods"`: one program with prefill and decode methods taking the cache, as before. The run is
    tests/test_weights_once.py's `tied_run` (the plainest recipe in the methods layout on a one-layer tiny Llama with
    tied embeddings), read from the store (#48: one export for both modules; the checks read the layout, not the
    model)."""
    out, report, log = stored_run(tiny_llama(tmp_path / "model", {**PLAINEST_EXECUTORCH, "layout": "methods"},
                                             tie_word_embeddings=True, layers=1))
    target = _target(report)
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:4000])
    manifest = json.loads((out / "executorch" / "export.json").read_text())
    assert sorted(manifest["components"]) == ["decode", "prefill"] and manifest.get("layout") != "runner"
    assert not target.get("runtimes")  # the runner does not run this layout: no claim about it
    loads = [f for f in target["findings"] if "method per component (prefill, decode)" in f]
    assert loads and "optimum-executorch do not load it" in loads[0] and 'layout: \"runner\"' in loads[0], \
        target["findings"]  # the report says which runtime loads what was written


@pytest.fixture(scope="module")
def llama_8da8w_runner(tmp_path_factory):
    """The tiny Llama with `quantize` pt2e-xnnpack 8da8w (the `int8-dynamic` variant of ExecuTorch) and no layout:
    the runner's layout, quantized."""
    recipe = {**RECIPE, "exports": [{**PLAINEST_EXECUTORCH, "quantize": {"method": "pt2e-xnnpack", "scheme": "8da8w"}}]}
    return _export(tmp_path_factory.mktemp("runner-llama-8da8w"), "llama", recipe)


def test_a_quantized_target_gets_the_runner_layout_and_runs_in_the_runner(llama_8da8w_runner):
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401
    from executorch.runtime import Runtime

    out, report, log = llama_8da8w_runner
    target = _target(report)
    assert target["status"] == "passed", (log[-3000:], json.dumps(target, indent=1)[:6000])
    folder = out / "executorch"
    manifest = json.loads((folder / "export.json").read_text())
    assert manifest["layout"] == "runner" and list(manifest["components"]) == ["model"]
    quantization = manifest["quantization"]  # recorded as for every quantized target
    assert (quantization["method"], quantization["options"], quantization["kind"]) == \
        ("pt2e-xnnpack", {"scheme": "8da8w"}, "int8")
    assert quantization["weights"].startswith("int8 per-channel") and "dynamic" in quantization["activations"]
    # judged by the quantization budget (the int8 defaults), never by atol
    quality = target["quality"]
    assert (quality["judged_by"], quality["kind"], quality["passed"]) == ("metrics", "int8", True), quality
    assert quality["budget"]["min_greedy_match"] == 4
    assert quality["metrics"]["top1_agreement"] >= quality["budget"]["min_top1_agreement"]
    assert 0 <= quality["metrics"]["kl"] <= quality["budget"]["max_kl"]
    for component in target["components"]:
        for check in component["checks"]:
            assert not check["outputs"] and check["quality"]["positions"] >= 1, check
    generation = target["generation"]
    assert generation["status"] == "passed" and generation["required_tokens"] == 4
    assert generation["matched_tokens"] >= 4 and len(generation["eager_tokens"][0]) == 8
    # the runner generates from the folder alone; a quantized program's text is held to min_greedy_match
    proof = {p["runtime"]: p for p in target["runtimes"]}["ExecuTorch LLM runner"]
    assert proof["status"] == "passed", proof
    if generation["exported_tokens"] == generation["eager_tokens"]:
        assert proof["detail"] == "8/8 tokens"  # the same program our loop ran
    else:
        equal = int(proof["detail"].split("/")[0])
        assert equal >= 4 and proof["detail"] == f"{equal}/8 tokens before the first divergence (min_greedy_match 4)"
    # the runner's contract: forward(tokens, input_pos) -> logits, the cache inside, the metadata methods
    program = Runtime.get().load_program(folder / "model.pte")
    assert {"forward", "get_max_seq_len", "get_eos_ids", "use_kv_cache", "enable_dynamic_shape"} <= \
        set(program.method_names)
    forward = program.load_method("forward")
    assert forward.metadata.num_inputs() == 2 and forward.metadata.num_outputs() == 1
    # the program starts from an empty cache (calibration ran on fresh buffers, which would otherwise be baked in
    # with their write positions): the prompt at position 0 gives eager's next tokens
    from transformers import AutoModelForCausalLM

    eager = AutoModelForCausalLM.from_pretrained(out.parent / "model").eval()
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        reference = eager(input_ids=ids).logits
    first = forward.execute([ids, torch.arange(6)])[0]
    assert (first.argmax(-1) == reference.argmax(-1)).float().mean() >= 0.9
    assert "ExecuTorch LLM runner ✓" in (out / "report.md").read_text()


def test_the_quantized_runner_program_is_smaller(llama_runner, llama_8da8w_runner):
    # the program and its data file (the float program's weights are in model.ptd: its table stored once)
    fp32, int8 = (sum(p.stat().st_size for p in (run[0] / "executorch").glob("model.pt[ed]"))
                  for run in (llama_runner, llama_8da8w_runner))
    assert not (llama_8da8w_runner[0] / "executorch" / "model.ptd").exists()  # a quantized projection is not the table
    assert int8 < 0.75 * fp32, (int8, fp32)  # the linear weights int8, the embedding table float32


def test_the_runner_proof_holds_a_quantized_program_to_min_greedy_match():
    """The rule generation parity uses for quantized targets: greedy tokens equal before the first divergence, at
    least `min_greedy_match` (the recipe's, else the variant kind's default), capped at what eager produced."""
    from exporters.recipe.load import parse_recipe
    from exporters.layouts.executorch_llm.proof import required_match

    def target(**settings):
        return parse_recipe(json.dumps({"exports": [{**PLAINEST_EXECUTORCH, **settings}]})).exports[0]

    assert required_match(target(), 8) is None  # float32: token for token
    assert required_match(target(quantize={"method": "pt2e-xnnpack", "scheme": "8da8w"}), 8) == 4
    assert required_match(target(quantize={"method": "pt2e-xnnpack", "scheme": "8da4w"}), 8) == 2
    assert required_match(target(quantize={"method": "pt2e-xnnpack"}, validation={"min_greedy_match": 6}), 8) == 6
    assert required_match(target(quantize={"method": "pt2e-xnnpack"}), 3) == 3  # capped at eager's tokens
    assert required_match(target(dtype="float16"), 16) == 8


def test_the_runner_proofs_child_loads_the_runtime_not_the_exporter(llama_runner, tmp_path):
    """The runner proof's child loads the kernel libraries and the runner, not the exporting Python that importing
    executorch's `custom_ops` module brings (torch._inductor's lowerings, executorch.exir: 3.4 of the child's 5.2 CPU
    seconds, benchmarks/RESULTS.md); its proof of the folder, through `hf-export validate`, is the run's."""
    out, report, _ = llama_runner
    target = _target(report)
    copy = tmp_path / "out"  # validate rewrites the report: on a copy of the module's export
    shutil.copytree(out / target["name"], copy / target["name"])
    site, dumps = tmp_path / "site", tmp_path / "modules"
    site.mkdir()
    dumps.mkdir()
    (site / "sitecustomize.py").write_text(MODULES_DUMPER.format(folder=str(dumps)))
    done = run_cli("validate", str(out.parent / "model"), str(copy), "--target", target["name"],
                   env={"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])})
    [again] = json.loads((copy / "report.json").read_text())["targets"]
    proofs = [p for p in again["runtimes"] if p["runtime"] == RUNNER]
    assert proofs == [p for p in target["runtimes"] if p["runtime"] == RUNNER] and proofs[0]["status"] == "passed", \
        (proofs, done.stderr[-3000:])
    children = [json.loads(p.read_text()) for p in dumps.iterdir()]
    [runner] = [modules for modules in children if "executorch.extension.llm.runner" in modules]
    exporting = [m for m in runner if m.split(".")[:2] in (["torch", "_inductor"], ["torch", "_dynamo"],
                                                            ["executorch", "exir"])]
    assert not exporting, exporting[:20]


def test_the_cards_runner_snippet_runs_as_written(llama_runner, hub, tmp_path):
    """The card's `TextLLMRunner` snippet (#45 §10), run as written by the venv's Python against the Hub emulator
    holding the folder at the commit it pins (only the documented prompt line set to this tokenizer's words):
    it imports the custom kernels the program's SDPA needs, as the runner proof's child does, and generates."""
    from exporters.layouts.executorch_llm import runner_child_imports
    from exporters.layouts.executorch_llm.proof import CHILD
    from tests.card_snippets import card_snippets, executorch_libraries, exports_card, run_snippet, upload_exports

    out, report, _ = llama_runner
    commit = upload_exports(hub, "alice/runner", out, ["executorch"])
    [(runtime, language, code)] = card_snippets(exports_card("alice/runner", out, commit))
    assert runtime == "ExecuTorch LLM runner" and language == "python" and f'revision="{commit}"' in code
    imports = [line.split("  #")[0] for line in CHILD.splitlines()
               if "executorch" in line and line.startswith(("import ", "from "))]
    assert imports and all(line in code for line in imports), (imports, code)  # the proof's imports, every one
    # and every native library the proof's child loads (its kernels, loaded without the exporting Python), the
    # card's imports load too
    card_imports = "".join(line + "\n" for line in code.splitlines() if "executorch" in line and "import" in line)
    assert runner_child_imports("TextLLMRunner") in CHILD
    child = executorch_libraries(runner_child_imports("TextLLMRunner"))
    assert any("custom_ops_aot_lib" in name for name in child), child
    assert child <= executorch_libraries(card_imports), (child, card_imports)
    done = run_snippet(code, hub, tmp_path / "home", prompt=PROMPT)
    assert done.returncode == 0, (code, done.stderr[-3000:])
    generation = _target(report)["generation"]
    assert done.stdout.strip() and generation["status"] == "passed"
    # the prompt it gives the runner is one user turn in the repo's chat template (before: the words alone); it prints
    # eager greedy generate()'s text on that prompt
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from exporters.capture.chat_prompt import TEXT_PROMPT
    from exporters.capture.generation_settings import greedy

    assert TEXT_PROMPT in code
    rendered = AutoTokenizer.from_pretrained(out / "executorch").apply_chat_template(
        [{"role": "user", "content": PROMPT}], tokenize=False, add_generation_prompt=True)
    assert rendered == f"<|begin_of_text|><|user|>\n{PROMPT}\n<|assistant|>\n", rendered
    tokenizer = Tokenizer.from_file(str(out / "executorch" / "tokenizer.json"))
    ids = torch.tensor([tokenizer.encode(rendered, add_special_tokens=False).ids])
    model = AutoModelForCausalLM.from_pretrained(out.parent / "model").eval()
    config = greedy(model.generation_config, max_new_tokens=32)  # the card's 32
    with torch.no_grad():
        new = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)[0, ids.shape[1]:]
    # the runner prints each piece itself, then its stats line (before: the card's callback printed every piece a
    # second time, after the runner's echo of the prompt)
    expected = tokenizer.decode(new.tolist())
    printed, observer = done.stdout[:len(expected)], done.stdout[len(expected):].strip()
    assert len(new) == 32 and printed == expected, (done.stdout, new, expected)
    assert observer.startswith("PyTorchObserver {") and "\n" not in observer, done.stdout


def test_the_non_strict_trace_reads_the_cache_through_the_wrappers_buffers():
    """The runner program is traced non-strict (a third of strict's CPU), its cache layers reading their tensors
    through the wrapper's buffers while the trace runs: the program names the cache (`key_cache_0`, ...) and a decode
    step after the prompt reads what the prompt wrote, as eager does; the layers' classes are theirs again after
    the block. Without the adapter the trace reads the layers' real tensors behind the buffers: the cache becomes
    anonymous constants (`lifted_tensor_*`)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from exporters.upstream import cache_layers_through_buffers
    from exporters.upstream.llm_runner import runner_module

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)).eval()
    prompt = {"input_ids": torch.tensor([[1, 5, 7, 9]]), "cache_position": torch.arange(4)}
    step = {"input_ids": torch.tensor([[3]]), "cache_position": torch.tensor([4])}
    shapes = {"input_ids": {1: torch.export.Dim("seq", max=15)}, "cache_position": {0: torch.export.Dim("seq", max=15)}}

    def traced(through: bool):
        program = runner_module(model, 16)
        kinds = [type(layer) for layer in program.wrapper.static_cache.layers]
        with torch.no_grad(), (cache_layers_through_buffers(program.wrapper) if through else contextlib.nullcontext()):
            exported = torch.export.export(program, (), dict(prompt), dynamic_shapes=shapes, strict=False)
        assert [type(layer) for layer in program.wrapper.static_cache.layers] == kinds  # restored
        return exported

    with torch.no_grad():
        eager = runner_module(model, 16)
        want = [eager(**prompt)["logits"], eager(**step)["logits"]]
    exported = traced(through=True)
    names = set(exported.constants) | set(exported.graph_signature.buffers)
    assert {"wrapper.key_cache_0", "wrapper.value_cache_0", "wrapper.cumulative_length_0"} <= names, names
    assert not [name for name in names if "lifted_tensor" in name], names
    module = exported.module()
    with torch.no_grad():
        got = [module(**prompt)["logits"], module(**step)["logits"]]
    assert all(torch.allclose(g, w, atol=1e-5) for g, w in zip(got, want)), [(g - w).abs().max() for g, w in zip(got, want)]
    bare = traced(through=False)
    assert [name for name in bare.constants if "lifted_tensor" in name], list(bare.constants)


def test_the_runner_lowering_shares_the_weights_and_spills_their_serialized_copies(tmp_path, monkeypatch):
    """Lowering the runner program goes through the same memory measures as the methods layout: each partition's
    copy for XNNPACK shares the weights (no second copy), and XNNPACK's serialized weights wait on disk as
    `FileBackedData`, not as bytes in memory, until the `.pte` is written (at 1.1B in float32 the export process
    passed 12 GiB without them: benchmarks/RESULTS.md). In-process (the pipeline forks this same call) with spies
    on ExecuTorch's named-data store and XNNPACK's preprocess; the folder written is the runner's as ever."""
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend
    from executorch.exir._serialize._cord import FileBackedData
    from executorch.exir._serialize._named_data_store import NamedDataStore
    from executorch.exir.backend.backend_details import BackendDetails

    from exporters.export.convert import export_to
    from exporters.run.context import RunOptions, prepare_run
    from exporters.run.workbench import Workbench

    seen: dict[str, list] = {"data": [], "copy_shares": []}
    real_add, real_preprocess = NamedDataStore.add_named_data, XnnpackBackend.preprocess  # a staticmethod
    real_copy = BackendDetails.__dict__["copy_exported_program_for_preprocess"]

    def add(self, key, data, *args, **kwargs):
        seen["data"].append(type(data).__name__)
        return real_add(self, key, data, *args, **kwargs)

    def preprocess(program, specs):
        seen["copy_shares"].append(BackendDetails.__dict__["copy_exported_program_for_preprocess"] is not real_copy)
        return real_preprocess(program, specs)

    monkeypatch.setattr(NamedDataStore, "add_named_data", add)
    monkeypatch.setattr(XnnpackBackend, "preprocess", staticmethod(preprocess))
    model_dir = runner_model(tmp_path / "model", "qwen2", {**RECIPE, "exports": [{**PLAINEST_EXECUTORCH,
                                                                                  "layout": "runner"}]},
                             layers=1)  # one layer still lowers in partitions: the spies see each one
    options = RunOptions(out_dir=tmp_path / "out", bench=False)
    context = prepare_run(str(model_dir), options)
    workbench = Workbench.load(context, options, context.targets)
    target = workbench.plan(context.targets[0])
    assert target.layout == "runner"
    components = workbench.components(target, context.recipe)
    outcome = export_to(workbench.model, target, components, context.recipe, tmp_path / "runner", [])
    assert "model.pte" in outcome["written"]
    assert seen["copy_shares"] and all(seen["copy_shares"]), "a partition's copy held its own weights"
    assert FileBackedData.__name__ in seen["data"], f"the serialized weights stayed in memory: {seen['data']}"
    assert not list((tmp_path / "runner").glob(".named-data-*"))  # the spill folder is gone with the export


def _eos_after_one_token(folder: Path) -> int:
    """Make the token greedy picks second after `PROMPT` (the runner proof's prompt, tokenized as it is) an eos of
    the saved model (its generation config, which the program's `get_eos_ids` are written from): eager and the
    runner then stop after one token, as the audit's tiny SmolVLM did. Returns that token."""
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, GenerationConfig

    ids = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(PROMPT, add_special_tokens=False).ids
    model = AutoModelForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        first, second = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                       max_new_tokens=2, do_sample=False)[0, len(ids):].tolist()
    assert first != second, (first, second)  # else eos would come first: another case (the reference says so)
    config = GenerationConfig.from_pretrained(folder)
    config.eos_token_id = [config.eos_token_id, second]
    config.save_pretrained(folder)
    return second


def test_a_runtime_proof_over_one_token_is_not_a_pass_and_genai_and_optimum_go_past_eos(tmp_path):
    """A model whose eos is greedy's second token: the ExecuTorch LLM runner, which cannot be told to go past eos,
    compares one token of the 8 asked: `unverified`, flagged in report.json and report.md, never a plain pass (the
    acceptance audit's 1/1 tokens). ONNX Runtime GenAI and optimum are told to go on (`min_length`,
    `min_new_tokens`, and eager alike): both compare all 8 tokens of each of their two rows."""
    recipe = {**RECIPE, "exports": [PLAINEST_EXECUTORCH, {"export_format": "onnx", "mode": "generation",
                                                          "dynamic": True}]}
    folder = runner_model(tmp_path / "model", "llama", recipe, layers=1)
    _eos_after_one_token(folder)
    out, report, log = run_and_read(tmp_path, folder)
    targets = targets_by_name(report)
    assert set(targets) == {"executorch", "onnx"}, log[-3000:]
    runner = {p["runtime"]: p for p in targets["executorch"]["runtimes"]}[RUNNER]
    assert runner["status"] == "unverified" and (runner["compared"], runner["asked"]) == (1, 8), runner
    assert runner["detail"].startswith("⚠ only 1 of 8 tokens compared, too few to prove generation (eager and the "
                                       "runner stopped at eos"), runner
    assert runner["ended"] in runner["detail"], runner
    # eager, not told to go on, stops after one token and eos on the sample prompt (its own parity: 2 of 8)
    assert len(targets["onnx"]["generation"]["eager_tokens"][0]) == 2, targets["onnx"]["generation"]
    onnx = {p["runtime"]: p for p in targets["onnx"]["runtimes"]}
    for runtime in ("ONNX Runtime GenAI", "optimum"):
        proof = onnx[runtime]
        assert proof["status"] == "passed" and (proof["compared"], proof["asked"]) == (16, 16), proof
        assert proof["detail"].startswith("16/16 tokens") and "ended" not in proof, proof
    markdown = (out / "report.md").read_text()
    assert f"{RUNNER} – ⚠ only 1 of 8 tokens compared, too few to prove generation" in markdown, markdown[:4000]
