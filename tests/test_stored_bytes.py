"""#46 §4: weights stored once, counted from the files' bytes.

A `.pte`'s stored weights are counted from its bytes, a delegate's blob included.

XNNPACK puts its weights in named-data segments, but a backend may keep them in its own blob (Core ML's holds its
whole model); the counter once read only the constant and named-data segments, so such a program's weights were
missing from the stored-weights ratio (Whisper-tiny's 222 MB `.pte` reported as 0.999x its 144 MB of parameters).

A tied embedding table is stored once in the merged ONNX graph: the optimizer once folded the output projection's
transpose of a small table into a second initializer (a tiny tied Llama stored 1.18x its parameters).
"""

from __future__ import annotations

from pathlib import Path

import torch

from exporters.export.footprint import weights_stored_bytes
from tests.conftest import run_and_read
from tests.models import tiny_llama


def test_a_delegate_blob_holding_the_weights_is_counted(tmp_path: Path) -> None:
    from executorch.exir import to_edge
    from executorch.exir.backend.backend_api import to_backend
    from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult

    class WeightsInBlob(BackendDetails):  # registered by subclassing; looked up by its name below
        @staticmethod
        def preprocess(program, compile_specs) -> PreprocessResult:
            return PreprocessResult(processed_bytes=b"".join(
                t.detach().contiguous().numpy().tobytes() for t in program.state_dict.values()))

    model = torch.nn.Linear(64, 256).eval()
    edge = to_edge(torch.export.export(model, (torch.randn(1, 64),)))
    lowered = to_backend("WeightsInBlob", edge.exported_program(), [])

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lowered = lowered

        def forward(self, x):
            return self.lowered(x)

    program = to_edge(torch.export.export(Wrapper(), (torch.randn(1, 64),))).to_executorch()
    (tmp_path / "model.pte").write_bytes(program.buffer)
    parameters = sum(p.numel() * p.element_size() for p in model.parameters())
    stored = weights_stored_bytes(tmp_path, "executorch")
    assert parameters <= stored <= (tmp_path / "model.pte").stat().st_size, (stored, parameters)


def test_a_tied_table_is_stored_once_in_the_merged_onnx_graph(tmp_path: Path) -> None:
    import onnx

    model_dir = tiny_llama(tmp_path / "model", {"export_format": "onnx", "mode": "generation", "dynamic": True},
                           initializer_range=0.3, tie_word_embeddings=True)
    out, report, log = run_and_read(tmp_path, model_dir)
    [target] = report["targets"]
    assert target["status"] == "passed", log[-3000:]
    proofs = {p["runtime"]: p["status"] for p in target["runtimes"]}
    assert proofs == {"ONNX Runtime GenAI": "passed", "optimum": "passed"}, proofs  # each runs the one table
    graph = onnx.load(str(out / "onnx" / "model.onnx"), load_external_data=False).graph
    tables = [t.name for t in graph.initializer if sorted(t.dims) == [32, 128]]
    assert len(tables) == 1, tables
    stored = weights_stored_bytes(out / "onnx", "onnx")
    assert target["weights_stored_bytes"] == stored and stored <= 1.02 * target["parameter_bytes"], target
    assert not any("parameter bytes" in f for f in target["findings"]), target["findings"]
