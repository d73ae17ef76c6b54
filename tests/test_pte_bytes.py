"""#46 §4: a `.pte`'s stored weights are counted from its bytes, a delegate's blob included.

XNNPACK puts its weights in named-data segments, but a backend may keep them in its own blob (Core ML's holds its
whole model); the counter once read only the constant and named-data segments, so such a program's weights were
missing from the stored-weights ratio (Whisper-tiny's 222 MB `.pte` reported as 0.999x its 144 MB of parameters).
"""

from __future__ import annotations

from pathlib import Path

import torch

from exporters.export.footprint import weights_stored_bytes


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
