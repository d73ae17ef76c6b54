"""Can one torch.export trace feed the ONNX and the ExecuTorch conversions (issue #31 §2)?

Tiny BERT and a tiny Llama (no cache: one graph, the contract every format of a `mode: model` target shares), dynamic
batch + sequence. Each backend's exporter with its own trace (what `hf-export run` does per target today) against
converting the dynamo exporter's program (`torch.onnx.export(program)`, `to_edge_transform_and_lower(program)`);
each artifact checked against eager at the traced shape and (ONNX) at another batch and length.

Run: `python benchmarks/one_trace.py bert` (or `llama`). Results: RESULTS.md, "One trace for every format".
"""

from __future__ import annotations

import copy
import os
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
from executorch.runtime import Runtime
from torch.export import Dim
from transformers import BertConfig, BertModel, LlamaConfig, LlamaForCausalLM
from transformers.exporters.exporter_dynamo import DynamoConfig, DynamoExporter
from transformers.exporters.exporter_executorch import ExecutorchConfig, ExecutorchExporter
from transformers.exporters.exporter_onnx import OnnxConfig, OnnxExporter


def timed(f):
    started = time.perf_counter()
    result = f()
    return result, time.perf_counter() - started


def main(which: str) -> None:
    torch.manual_seed(0)
    if which == "bert":
        model = BertModel(BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=37)).eval()
        extra = {}
    else:
        model = LlamaForCausalLM(LlamaConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                             num_key_value_heads=2, intermediate_size=37)).eval()
        extra = {"use_cache": False}
    ids = torch.randint(0, 99, (2, 7))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    batch, seq = Dim("batch", min=1, max=64), Dim("seq", min=1, max=512)
    shapes = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
    with torch.no_grad():
        eager = model(**inputs, **extra)[0].numpy()

    (dynamo, _), t_dynamo = timed(lambda: DynamoExporter().export_program(
        model, dict(inputs), DynamoConfig(dynamic=True, dynamic_shapes=shapes)))
    _, t_onnx = timed(lambda: OnnxExporter().export_program(
        model, dict(inputs), OnnxConfig(dynamic=True, dynamic_shapes=shapes)))
    print(f"{which}: dynamo trace {t_dynamo:.2f}s; ONNX exporter (own trace + convert) {t_onnx:.2f}s")
    program, t_convert = timed(lambda: torch.onnx.export(dynamo, args=(), kwargs=copy.deepcopy(dict(inputs)),
                                                         optimize=True))
    path = os.path.join(tempfile.mkdtemp(), "model.onnx")
    program.save(path)
    session = ort.InferenceSession(path)
    names = [i.name for i in session.get_inputs()]
    got = session.run(None, dict(zip(names, (v.numpy() for v in inputs.values()))))[0]
    print(f"  ONNX from the dynamo program: convert {t_convert:.2f}s, max diff vs eager {np.abs(got - eager).max():.2e}")
    other = torch.randint(0, 99, (3, 11))
    with torch.no_grad():
        eager_other = model(input_ids=other, attention_mask=torch.ones_like(other), **extra)[0].numpy()
    got_other = session.run(None, dict(zip(names, (other.numpy(), np.ones((3, 11), np.int64)))))[0]
    print(f"  ... at batch 3 x 11: max diff {np.abs(got_other - eager_other).max():.2e}")

    _, t_executorch = timed(lambda: ExecutorchExporter().export_program(
        model, dict(inputs), ExecutorchConfig(dynamic=True, dynamic_shapes=shapes)))
    print(f"  ExecuTorch exporter (own trace + lower) {t_executorch:.2f}s")
    manager, t_lower = timed(lambda: to_edge_transform_and_lower(dynamo, partitioner=[XnnpackPartitioner()])
                             .to_executorch())
    path = os.path.join(tempfile.mkdtemp(), "model.pte")
    with open(path, "wb") as file:
        file.write(manager.buffer)
    out = Runtime.get().load_program(path).load_method("forward").execute(list(inputs.values()))[0].numpy()
    print(f"  ExecuTorch from the dynamo program: lower {t_lower:.2f}s, max diff vs eager {np.abs(out - eager).max():.2e}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bert")
