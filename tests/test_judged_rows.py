"""The quality budget of a decoder fed an image's features judges its text rows, whose logits a runtime reads, not the
image's (`exporters.validate.judged_rows`), in the upstream stages' layout too: `language_model` and `lm_head`, each
traced on the whole prompt by the model's own forward (a LLaVA's default ONNX or ExecuTorch `methods` target). The
transformers.js and MultimodalRunner decoders are judged through the real CLI on a trained LLaVA
(tests/test_trained_vlm.py).

In process, on a random tiny LLaVA (under a second): its stages captured as a run captures them
(`exporters.capture.components.complete_components`), their probes' image rows found by content, and an `lm_head`
variant whose image rows alone disagree measured against eager.
"""

from __future__ import annotations

import torch

from exporters.capture.components import complete_components
from exporters.validate.judged_rows import decoder_media_rows, judged_rows
from exporters.validate.quality import judge, measure
from tests.models import tiny_llava

TEXT = [1, 5, 6, 7]  # bos, then the image's 4 tokens, then 3 text tokens


def test_the_upstream_stages_are_judged_on_the_prompts_text_rows(tmp_path):
    from transformers import LlavaForConditionalGeneration

    model = LlavaForConditionalGeneration.from_pretrained(tiny_llava(tmp_path / "llava")).eval()
    token, count = model.config.image_token_index, model.config.image_seq_length
    ids = torch.tensor([TEXT[:1] + [token] * count + TEXT[1:]] * 2)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
              "pixel_values": torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))}
    components = complete_components(model, {}, inputs, "vision-language", None)
    image = ids == token
    for name, key in (("language_model", "inputs_embeds"), ("lm_head", "input")):
        media = decoder_media_rows(name, components, model, inputs)
        traced = components[name][1]
        assert torch.equal(judged_rows(traced, media), ~image), name
        # probes of unseen shapes: the prompt cut (its first rows), and grown by random rows, which hold no image
        cut = {key: traced[key][:1, :3]}
        grown = {key: torch.cat([traced[key], torch.randn(2, 2, traced[key].shape[-1])], 1)}
        assert judged_rows(cut, media).tolist() == [[True, False, False]], name
        assert torch.equal(judged_rows(grown, media), torch.cat([~image, torch.ones(2, 2, dtype=torch.bool)], 1))
    for name in ("multi_modal_projector", "embed_tokens", "image_encoder"):  # no decoder: every row, as before
        assert decoder_media_rows(name, components, model, inputs) is None, name

    # an lm_head whose image rows alone disagree with eager (their logits reversed): judged on the 8 text rows,
    # every one agreeing; judged on every row, 8 of the prompt's 16 positions would disagree
    head, traced = components["lm_head"]
    with torch.no_grad():
        eager = head(**traced)
    variant = torch.where(image.unsqueeze(-1), eager.flip(-1), eager)
    assert bool((eager.argmax(-1) != variant.argmax(-1))[image].all())
    rows = judged_rows(traced, decoder_media_rows("lm_head", components, model, inputs))
    measured = measure({"logits": eager}, {"logits": variant}, rows=rows)
    assert (measured["positions"], measured["top1_matches"], measured["media_positions"]) == (8, 8, 8)
    verdict = judge("int8", {"min_top1_agreement": 0.9}, [("lm_head", "traced", measured)], None)
    assert verdict["passed"] and verdict["metrics"]["top1_agreement"] == 1.0, verdict
    assert verdict["metrics"]["media_positions"] == 8, verdict
    everything = measure({"logits": eager}, {"logits": variant})
    assert (everything["positions"], everything["top1_matches"]) == (16, 8), everything
    assert judge("int8", {"min_top1_agreement": 0.9}, [("lm_head", "traced", everything)], None)["passed"] is False
