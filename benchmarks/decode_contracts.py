"""What each call our batch-1 int4 decoder takes and the GenAI builder's graph does not costs a decode step (#51).

Our fused batch-1 graph (`onnx-int4-b1`) computes what eager computes for every call a batch of 1 can make, a
left-padded prompt included; the builder's graph (`-p int4 -e cpu`) assumes GenAI's calls: no padding, positions
counting up from 0. This script writes, beside our folder, graphs that give up one of those calls after another,
each cumulative on the one before, so that a step's cost can be read contract by contract:

    exact               our folder as exported
    no-pad-rows         + no attention bias and no zeroed rows: a padded position's own outputs left unspecified
                          (its logits and the keys and values it writes; no later token reads them)
    lengths-from-mask   + `seqlens_k` and the total length from the mask's sum (the builder's): right padding only
    constant-rotary     + eager's cos / sin at every position as constants, no `position_ids` (the builder's):
                          positions must count up from 0 (`position_ids` is then ignored)
    unpacked-gate-up    + the MLP's packed gate/up `MatMulNBits` split into two (the builder's 2 kernels, no `Split`)

For each it prints the largest |difference| from `exact` on a decode step after an unpadded past (what the
contract keeps) and on a left-padded prompt's real positions (what it gives up), its kernels a step, and µs a step
beside the builder's (`decode_step_cost.py`'s sessions: 1 thread, one token after a past of 16, rounds rotating).
The folders are written under `--work` with their data hard-linked (GenAI loads them:
`bench_runtimes.py --genai NAME=FOLDER`).

Usage (benchmarks/RESULTS.md, issue #51):
    .venv/bin/python benchmarks/decode_contracts.py OURS_B1_FOLDER BUILDER_FOLDER --work /tmp/contracts
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
from onnx_ir.passes.common import RemoveUnusedNodesPass

sys.path.insert(0, str(Path(__file__).parent))
import decode_step_cost  # noqa: E402  (a sibling script)

BIAS, POSITIONS = 10, 9  # GroupQueryAttention's inputs
STEPS = ("no-pad-rows", "lengths-from-mask", "constant-rotary", "unpacked-gate-up")


def _initializer(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    value = ir.Value(name=name, const_value=ir.tensor(array), shape=ir.Shape(array.shape),
                     type=ir.TensorType(ir.tensor(array).dtype))
    graph.register_initializer(value)
    return value


def _attentions(graph: ir.Graph) -> list[ir.Node]:
    return [node for node in graph if node.op_type == "GroupQueryAttention"]


def no_pad_rows(graph: ir.Graph, config: dict) -> None:
    for node in graph:
        if node.op_type == "Where" and node.inputs[2] is not None and node.inputs[2].producer() is not None \
                and node.inputs[2].producer().op_type == "GroupQueryAttention":
            node.outputs[0].replace_all_uses_with(node.inputs[2])
    for node in _attentions(graph):
        node.replace_input_with(BIAS, None)


def lengths_from_mask(graph: ir.Graph, config: dict) -> None:
    mask = next(value for value in graph.inputs if value.name == "attention_mask")
    first = next(iter(graph))

    def op(op_type: str, *inputs: ir.Value, **attributes) -> ir.Value:
        node = ir.node(op_type, list(inputs), attributes=attributes)
        graph.insert_before(first, node)
        return node.outputs[0]

    one = _initializer(graph, "contract_one", np.array([1], np.int64))
    seqlens = op("Cast", op("Sub", op("ReduceSum", mask, one), one), to=ir.DataType.INT32)
    total = op("Cast", op("Gather", op("Shape", mask), _initializer(graph, "contract_axis", np.array(1, np.int64))),
               to=ir.DataType.INT32)
    for node in _attentions(graph):
        node.replace_input_with(5, seqlens)
        node.replace_input_with(6, total)


def constant_rotary(graph: ir.Graph, config: dict) -> None:
    head = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if config.get("rope_scaling") or (config.get("rope_parameters") or {}).get("rope_type", "default") != "default":
        raise SystemExit("constant-rotary: only the default rope type is written here")
    theta = config.get("rope_theta") or (config.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    inverse = 1.0 / theta ** (np.arange(0, head, 2, dtype=np.float32) / head)
    angles = np.arange(config["max_position_embeddings"], dtype=np.float32)[:, None] * inverse[None]
    cos = _initializer(graph, "contract_cos_cache", np.cos(angles).astype(np.float32))
    sin = _initializer(graph, "contract_sin_cache", np.sin(angles).astype(np.float32))
    for node in _attentions(graph):
        node.replace_input_with(7, cos)
        node.replace_input_with(8, sin)
        node.replace_input_with(POSITIONS, None)


def unpacked_gate_up(graph: ir.Graph, config: dict) -> None:
    for split in [node for node in graph if node.op_type == "Split"]:
        matmul = split.inputs[0].producer() if split.inputs[0] is not None else None
        if matmul is None or matmul.op_type != "MatMulNBits" or len(split.inputs[0].uses()) != 1:
            continue
        sizes = split.inputs[1].const_value.numpy().tolist()
        weights, scales = (value.const_value.numpy() for value in matmul.inputs[1:3])
        flat, scales = scales.ndim == 1, scales.reshape(weights.shape[0], -1)
        start = 0
        for index, (size, output) in enumerate(zip(sizes, split.outputs)):
            rows = slice(start, start + size)
            attributes = {name: attribute.value for name, attribute in matmul.attributes.items()} | {"N": size}
            part = ir.node("MatMulNBits", [
                matmul.inputs[0],
                _initializer(graph, f"{matmul.inputs[1].name}_part{index}", np.ascontiguousarray(weights[rows])),
                _initializer(graph, f"{matmul.inputs[2].name}_part{index}", np.ascontiguousarray(scales[rows]).reshape(-1 if flat else (size, -1))),
            ], attributes=attributes, domain="com.microsoft")
            graph.insert_before(matmul, part)
            output.replace_all_uses_with(part.outputs[0])
            start += size


REWRITES = dict(zip(STEPS, (no_pad_rows, lengths_from_mask, constant_rotary, unpacked_gate_up)))


def write_variants(ours: Path, work: Path) -> list[Path]:
    """`work/exact`, then one folder a step of `STEPS`, each the one before rewritten once more."""
    config = json.loads((ours / "config.json").read_text())
    folders = [_copied(ours, work / "exact")]
    model = ir.load(folders[0] / "model.onnx")
    for step in STEPS:
        REWRITES[step](model.graph, config)
        RemoveUnusedNodesPass()(model)
        folders.append(_linked(folders[0], work / step, model))
    return folders


def _copied(source: Path, folder: Path) -> Path:
    """A copy of `source` (onnx_ir refuses to read data with several hard links)."""
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(source, folder)
    return folder


def _linked(source: Path, folder: Path, model: ir.Model) -> Path:
    """`folder` with `source`'s other files hard-linked (ONNX Runtime refuses data outside the graph's folder) and
    `model` written with its initializers in a data file of its own."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for file in source.iterdir():
        if not file.name.startswith("model.onnx"):
            os.link(file, folder / file.name)
    ir.save(model, folder / "model.onnx", external_data="model.onnx.data")
    return folder


def _run(folder: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = decode_step_cost._session(folder)
    names = [value.name for value in session.get_outputs()]
    wanted = {value.name for value in session.get_inputs()}
    return dict(zip(names, session.run(None, {k: v for k, v in feeds.items() if k in wanted})))


def _feeds(config: dict, past: int, ids: list[int], mask: list[int]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    head = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    # generate()'s positions: counting the real tokens, a pad at 1
    positions = np.where(np.array(mask) == 0, 1, np.cumsum(mask) - 1)[-len(ids):]
    feeds = {"input_ids": np.array([ids], np.int64), "attention_mask": np.array([mask], np.int64),
             "position_ids": np.array([positions], np.int64)}
    for layer in range(config["num_hidden_layers"]):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{layer}.{kind}"] = rng.standard_normal((1, heads, past, head)).astype(np.float32)
    return feeds


def differences(exact: Path, folder: Path, config: dict) -> tuple[float, float]:
    """Largest |Δ| from `exact`: every output of a decode step after an unpadded past of 16; the logits at the real
    positions of a 4-token prompt left-padded by 2."""
    step = _feeds(config, 16, [5], [1] * 17)
    a, b = _run(exact, step), _run(folder, step)
    kept = max(float(np.abs(a[name] - b[name]).max()) for name in a)
    padded = _feeds(config, 0, [0, 0, 7, 8, 9, 10], [0, 0, 1, 1, 1, 1])
    a, b = _run(exact, padded)["logits"], _run(folder, padded)["logits"]
    return kept, float(np.abs(a[:, 2:] - b[:, 2:]).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ours", type=Path, help="our batch-1 int4 folder (`onnx-int4-b1`)")
    parser.add_argument("builder", type=Path, help="the GenAI builder's `-p int4 -e cpu` folder")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=decode_step_cost.ROUNDS)
    args = parser.parse_args()
    config = json.loads((args.ours / "config.json").read_text())
    folders = write_variants(args.ours, args.work)
    medians = decode_step_cost.timed([*folders, args.builder], args.rounds)
    print(f"load {Path('/proc/loadavg').read_text().split()[:3]}")
    print("graph | kernels a step | µs a step | / builder | max |Δ| decode step | max |Δ| left-padded prompt")
    for folder, median in zip(folders, medians):
        kept, given_up = differences(folders[0], folder, config)
        print(f"{folder.name} | {decode_step_cost.kernels(folder):.0f} | {median:.1f} | {median / medians[-1]:.4f} | "
              f"{kept:.2e} | {given_up:.2e}")
    print(f"builder | {decode_step_cost.kernels(args.builder):.0f} | {medians[-1]:.1f} | 1 | – | –")


if __name__ == "__main__":
    main()
