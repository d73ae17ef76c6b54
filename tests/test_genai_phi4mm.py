"""Phi-4-multimodal in ONNX Runtime GenAI (issue #52 item 3): GenAI 0.18 runs it as its `phi4mm` type, from four
graphs its own builder makes of Microsoft's remote-code checkpoint, with the image token id and the 448-pixel crops
hard-coded; this product refuses transformers' `Phi4MultimodalForCausalLM` before any layout (it hears and sees: its
image and audio stages are not exported). The reason a folder of it gets (`exporters/layouts/genai/phi4mm.py`) says
both, and what in a given model differs from GenAI's hard-coded ids and crops; the facts it quotes are checked
against the pinned GenAI package, so an upgrade that runs the native class fails here instead of leaving a stale
reason; the matrix's row says the refusal in every format. That GenAI's `phi4mm` runs graphs traced from
transformers' class (8/8, a shifted projection 0/8) is a benchmark, rerun with `python benchmarks/genai_phi4mm_probe.py`
(benchmarks/RESULTS.md, fourteenth round): not a suite test, for the suite's 20 minutes (#48)."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_genai_declines_a_phi4_multimodal_folder_naming_its_phi4mm_graphs_and_the_model_s_mismatches():
    """transformers' default config (the real checkpoint's geometry: crop 448, patch 14, image token 200010, audio
    200011) gets the layout reason alone; the matrix's tiny model (its ids moved inside a 256-token vocabulary)
    gets GenAI's hard-coded image token id too, and a tower of 32-pixel images GenAI's 448-pixel crops too."""
    import transformers

    from exporters.layouts.genai import vision_language_declined
    from exporters.layouts.genai.phi4mm import WRITTEN_BY_GENAI, mismatches
    from matrix.families import FAMILIES, shrink

    real = transformers.Phi4MultimodalConfig().to_dict()
    assert real["model_type"] == "phi4_multimodal" and mismatches(real) == []
    why = vision_language_declined(real)
    assert why == WRITTEN_BY_GENAI, why
    for fact in ("'phi4mm'", "`Phi4MMForCausalLM` only", "lora_A.vision", "Phi4MultimodalForCausalLM",
                 "image and audio stages"):
        assert fact in why, (fact, why)

    spec = FAMILIES["phi4_multimodal"]
    tiny = shrink(getattr(transformers, spec.model_class).config_class(), spec.overrides).to_dict()
    image = tiny["vision_config"]["image_token_id"]
    assert image < 256
    why = vision_language_declined(tiny)
    assert why.startswith(WRITTEN_BY_GENAI) and f"its image token id is {image}" in why, why
    assert "image_special_token_id = 200010" in why and "phi_multimodal_processor.cpp" in why
    assert "448-pixel crops" not in why, why  # the matrix keeps GenAI's crop geometry: only the ids differ

    small = {**tiny, "vision_config": {**tiny["vision_config"], "image_size": 32, "crop_size": 32, "patch_size": 8}}
    found = mismatches(small)
    assert len(found) == 2 and "its image tower takes 32-pixel crops (crop_size 32) of 8-pixel patches" in found[1]
    assert "256 + 1 + num_img_tokens + 16" in found[1] and "image_transforms_phi_4.hpp" in found[1]
    # GenAI's own `phi4mm` string keeps the generic reason for a type the layout does not write
    assert vision_language_declined({"model_type": "phi4mm", "vision_config": {}}).startswith("GenAI runs 'phi4mm'")


def test_the_facts_the_reason_quotes_are_the_pinned_genai_s():
    """The reason is read from GenAI's source: the pinned package's builder makes Phi-4-multimodal's decoder only
    for the remote-code `Phi4MMForCausalLM`, with its vision LoRA (`lora_A.vision`), and never names transformers'
    class; its library holds the `phi4mm` processor (the `<|endoftext10|>` the prompt's images become, its error
    when a prompt names more images than it has) and ONNX Runtime Extensions' Phi-4 image transforms."""
    import onnxruntime_genai  # the pinned runtime: `make venv` installs it

    package = Path(onnxruntime_genai.__file__).parent
    assert onnxruntime_genai.__version__ == "0.18.0", onnxruntime_genai.__version__
    builder = (package / "models" / "builder.py").read_text(encoding="utf-8")
    assert 'config.architectures[0] == "Phi4MMForCausalLM"' in builder
    assert "Phi4MultimodalForCausalLM" not in builder and "phi4_multimodal" not in builder
    assert "lora_A.vision" in (package / "models" / "builders" / "phi.py").read_text(encoding="utf-8")
    library = (package / "libonnxruntime-genai.so").read_bytes()
    for fact in (b"phi4mm", b"<|endoftext10|>", b"<|endoftext11|>", b"Number of image tokens exceeds the number of images",
                 b"Phi4VisionDynamicPreprocess", b"Phi4VisionProcessor"):
        assert fact in library, fact


def test_the_matrix_row_of_phi4_multimodal_says_the_refusal_in_every_format():
    """docs/coverage.json, measured: the plainest recipe of the tiny Phi-4-multimodal fails in each format at its
    sample inputs (ours, not upstream's), naming the audio and image it takes that no component reads: no format
    passes on the language model alone."""
    rows = {row["family"]: row for row in json.loads((ROOT / "docs" / "coverage.json").read_text())["rows"]}
    row = rows["phi4_multimodal"]
    assert row["model_class"] == "Phi4MultimodalForCausalLM" and set(row["cells"]) == {"dynamo", "onnx", "executorch"}
    for name, cell in row["cells"].items():
        assert cell["status"] == "failed" and cell["cause"] == "ours", (name, cell)
        assert "reads audio (its forward takes `audio_input_features`)" in cell["reason"], cell["reason"]
        assert "image (its forward takes `image_pixel_values`)" in cell["reason"], cell["reason"]

