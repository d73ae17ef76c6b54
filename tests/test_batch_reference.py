"""The eager side of the batch proofs is computed once per model and batch (issue #46): ONNX Runtime GenAI's proof
and optimum's both compare with eager greedy `generate` over the same left-padded batch of two prompts, and a model
with its own pad token gives both the same batch, so the run generates it once (at 1.1B each generation is 8 forward
passes of 4.4 GB of weights). A run of the plainest ONNX recipe, in process so eager `generate` can be counted."""

from __future__ import annotations

import torch
from transformers import GenerationMixin

from exporters.run.context import RunOptions
from exporters.run.pipeline import run_pipeline
from tests.models import save_ascii_bpe_tokenizer, tiny_llama

RECIPE = {"export_format": "onnx", "mode": "generation", "dynamic": True}


def test_genai_and_optimum_prove_against_one_eager_batch_generation(tmp_path, monkeypatch):
    model_dir = tiny_llama(tmp_path / "model", RECIPE, initializer_range=0.3, layers=1)
    save_ascii_bpe_tokenizer(model_dir)
    batches: list[list[list[int]]] = []
    real = GenerationMixin.generate

    def counted(self, *args, **kwargs):
        ids = kwargs.get("input_ids")
        if isinstance(ids, torch.Tensor) and ids.shape[0] == 2:  # the batch proofs' two prompts
            batches.append(ids.tolist())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(GenerationMixin, "generate", counted)
    report = run_pipeline(str(model_dir), RunOptions(out_dir=tmp_path / "out", bench=False, progress=False,
                                                     use_cache=False))
    (target,) = report["targets"]
    assert target["status"] == "passed", target
    proofs = {proof["runtime"]: proof for proof in target["runtimes"]}
    for runtime in ("ONNX Runtime GenAI", "optimum"):  # both compared with the eager batch, token for token
        assert proofs[runtime]["status"] == "passed", proofs
        assert "batch of 2" in proofs[runtime]["detail"]
    assert len(batches) == 1, batches  # generated once, for both proofs
