"""Is the ONNX graph of a deep decoder its layers stamped out? The feasibility study of tracing a layer once (#46).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/onnx_layer_repeats.py [--layers 2 4 8] [--hidden 256]
        [--work /tmp/onnx-layer-repeats]

For each depth, TinyLlama-1.1B's layer (32 heads, 4 key-value heads, SiLU MLP at 2.75x, RMSNorm, rotary, untied,
bfloat16 weights, TinyLlama-Chat's ids and generation config) at a narrow width (`--hidden`: the node count of a
layer does not depend on it), through the plainest ONNX target (`hf-export run`, in this process, the export
child forked as in every run). Just before the trace's metadata is dropped (`drop_trace_metadata`, before the save)
the optimized `onnx_ir` graph is read: each node's layer from the module scopes torch.onnx records
(`pkg.torch.onnx.name_scopes`, `model.layers.N`), and per layer the op sequence, the initializers it reads and the
graph inputs and outputs it touches. Printed per depth: the nodes in layers, outside them and without a scope
(written by the optimizer), whether every layer's op sequence is the same, and report.json's phase timings; the
marginal trace cost of a layer is the difference between depths of the export child's CPU seconds in
`_export_one` (torch.export, torch.onnx's translation and optimizer: `export_cpu_s`; wall times measure a shared
machine's load).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_peers  # the 1.1B checkpoint's tokenizer and recipes

LAYER = re.compile(r"(?:^|[.'])layers\.(\d+)(?!\d)")  # in the scopes' list as torch.onnx writes it
SCOPES = "pkg.torch.onnx.name_scopes"


def build(folder: Path, layers: int, hidden: int) -> None:
    """TinyLlama's layer at width `hidden` (head dim hidden/32), `layers` deep, saved as bench_peers saves it."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    if (folder / "config.json").is_file():
        return
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32000, hidden_size=hidden, intermediate_size=int(hidden * 2.75),
                         num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=4,
                         max_position_embeddings=2048, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0, max_length=2048)
    model.save_pretrained(folder)
    bench_peers.ascii_tokenizer(folder, 32000, bench_peers.LLAMA_SPECIALS, ("unk", "bos", "eos"))


def layer_of(node) -> int | None:
    """The decoder layer a node was traced in, from its innermost `layers.N` scope; None outside every layer."""
    scopes = node.metadata_props.get(SCOPES) or node.metadata_props.get("namespace") or ""
    found = LAYER.findall(scopes)
    return int(found[-1]) if found else None


def analyse(model) -> dict:
    """Per layer: op sequence, initializers read, graph inputs/outputs touched; the nodes outside layers."""
    graph = model.graph
    initializers = set(graph.initializers)
    inputs = {v.name for v in graph.inputs}
    outputs = {v.name for v in graph.outputs}
    per_layer: dict[int, list] = {}
    outside: Counter = Counter()
    unscoped: Counter = Counter()
    touches: dict[int, dict[str, set]] = {}
    outside_nodes: list[str] = []
    for node in graph:
        layer = layer_of(node)
        if not node.metadata_props.get(SCOPES):
            unscoped[node.op_type] += 1
        if layer is None:
            outside[node.op_type] += 1
            outside_nodes.append(_describe(node))
            continue
        attrs = tuple(sorted((k, str(a.value)) for k, a in node.attributes.items()))
        per_layer.setdefault(layer, []).append((node.domain, node.op_type, attrs, len(node.inputs)))
        seen = touches.setdefault(layer, {"initializers": set(), "inputs": set(), "outputs": set()})
        for value in node.inputs:
            if value is None:
                continue
            if value.name in initializers:
                seen["initializers"].add(value.name)
            if value.name in inputs:
                seen["inputs"].add(value.name)
        for value in node.outputs:
            if value.name in outputs:
                seen["outputs"].add(value.name)
    signatures = {layer: ops for layer, ops in per_layer.items()}
    first = signatures.get(min(signatures)) if signatures else []
    same_as_first = {layer: ops == first for layer, ops in signatures.items()}
    last = max(signatures) if signatures else None
    same_as_second = {layer: ops == signatures.get(1) for layer, ops in signatures.items()}
    return {
        "nodes": len(list(graph)), "in_layers": sum(len(v) for v in per_layer.values()),
        "per_layer_nodes": {k: len(v) for k, v in sorted(per_layer.items())},
        "outside_layers": sum(outside.values()), "outside_ops": dict(outside.most_common()),
        "without_scope": sum(unscoped.values()), "without_scope_ops": dict(unscoped.most_common()),
        "layers_same_as_layer_0": same_as_first, "layers_same_as_layer_1": same_as_second, "last": last,
        "layer_initializers": {k: sorted(v["initializers"])[:3] + [f"... {len(v['initializers'])} in all"]
                               for k, v in sorted(touches.items())},
        "layer_inputs": {k: sorted(v["inputs"]) for k, v in sorted(touches.items())},
        "layer_outputs": {k: sorted(v["outputs"]) for k, v in sorted(touches.items())},
        "initializers": len(initializers),
        "outside_nodes": outside_nodes,
        "layer_0_and_1": [[_describe(n) for n in graph if layer_of(n) == k] for k in (0, 1)],
    }


def _describe(node) -> str:
    """One line: op, inputs -> outputs, the innermost scope."""
    scopes = node.metadata_props.get(SCOPES, "")
    names = lambda values: ",".join(v.name if v is not None else "" for v in values)  # noqa: E731
    return f"{node.op_type}({names(node.inputs)}) -> {names(node.outputs)}  @ {scopes[-120:]}"


def run(model_dir: Path, work: Path) -> dict:
    """hf-export run in this process with the graph read before its metadata is dropped (in the forked child)."""
    from exporters import cli
    from exporters.export import convert

    found = work / "layers.json"
    found.unlink(missing_ok=True)
    original = convert.drop_trace_metadata

    def read_then_drop(component, export_format):
        if export_format == "onnx":
            found.write_text(json.dumps(analyse(component.program), default=str))
        original(component, export_format)

    convert.drop_trace_metadata = read_then_drop
    export_one = convert._export_one
    cpu_file = work / "export_cpu.json"
    cpu_file.unlink(missing_ok=True)

    def timed_export_one(*args, **kwargs):  # in the forked child: its CPU seconds for torch.export + torch.onnx
        cpu = time.process_time()
        try:
            return export_one(*args, **kwargs)
        finally:
            cpu_file.write_text(json.dumps({"export_cpu_s": round(time.process_time() - cpu, 2)}))

    convert._export_one = timed_export_one
    recipe = work / "recipe-onnx.json"
    recipe.write_text(json.dumps(bench_peers.RECIPES["onnx"]))
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    argv = ["run", str(model_dir), "--quiet", "--no-cache", "--no-bench", "--jobs", "1", "--config", str(recipe),
            "--out", str(out)]
    try:
        cli.app(args=argv, standalone_mode=False)
    except SystemExit:
        pass
    finally:
        convert.drop_trace_metadata = original
        convert._export_one = export_one
    report = json.loads((out / "report.json").read_text())
    target = report["targets"][0]
    return {"status": target["status"], "timings": target.get("timings"),
            **(json.loads(cpu_file.read_text()) if cpu_file.is_file() else {}),
            "graph": json.loads(found.read_text()) if found.is_file() else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--work", type=Path, default=Path("/tmp/onnx-layer-repeats"))
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    results = {}
    for layers in args.layers:
        work = args.work / f"h{args.hidden}-l{layers}"
        work.mkdir(parents=True, exist_ok=True)
        build(work / "model", layers, args.hidden)
        started, cpu = time.monotonic(), time.process_time()
        results[layers] = run(work / "model", work)
        results[layers]["wall_s"] = round(time.monotonic() - started, 1)
        results[layers]["load"] = round(os.getloadavg()[0], 1)
        print(json.dumps({layers: results[layers]}, indent=1, default=str), flush=True)
    (args.work / f"h{args.hidden}-summary.json").write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
