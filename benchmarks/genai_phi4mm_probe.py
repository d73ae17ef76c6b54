"""Probe (#52 item 3): can ONNX Runtime GenAI 0.18's `phi4mm` run graphs traced from transformers' own
`Phi4MultimodalForCausalLM` (no remote code, no LoRA)? The matrix's tiny Phi-4-multimodal, one 448 x 448 image (the
global crop and one HD crop: 545 image tokens), its three graphs traced by hand at that geometry (this product does
not write them: it refuses the model before any layout), `genai_config.json` typed `phi4mm` with no speech section;
GenAI fed the processor's tensors (pixel_values [1, 2, 3, 448, 448], image_attention_mask [1, 2, 32, 32],
image_sizes [1, 2], num_image_tokens) generates greedily in a child, against eager `generate()` on the same inputs.
Then a mutant: the vision graph traced again with the projection's last bias shifted by 5 (the same folder
otherwise): GenAI's tokens must then differ from eager's. Exit 0 only where the proof holds and the mutant fails.

Usage:
    python benchmarks/genai_phi4mm_probe.py
prints `proof: genai=[...] eager=[...] equal=8/8 ...` and `mutant: ... equal=n/8`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporters.layouts.genai.config import GENAI_CONFIG, genai_config  # noqa: E402
from exporters.layouts.genai.qwen_vl import SESSION, _export, write_embedding  # noqa: E402
from matrix.families import FAMILIES, tiny_model  # noqa: E402
from transformers import DynamicCache  # noqa: E402

STEPS, BASE = 8, 16  # new tokens; a 448-pixel crop's 14-pixel patches pooled 2 x 2: 16 a side


class FixedHdVision(torch.nn.Module):
    """GenAI's vision graph for one image of `rows` x `cols` 448-pixel crops with an all-ones mask: the tower on the
    global crop and the HD crops, then eager's assembly (HD rows each ended by the sub extensor, the global extensor,
    the global crop's rows likewise) and projection, at that fixed geometry."""

    def __init__(self, model, rows: int, cols: int):
        super().__init__()
        self.embed, self.rows, self.cols = model.model.embed_tokens_extend.image_embed, rows, cols

    def forward(self, pixel_values, image_attention_mask):
        e, rows, cols = self.embed, self.rows, self.cols
        feats = e.get_img_features(pixel_values.flatten(0, 1), attention_mask=image_attention_mask.flatten(0, 1) > 0)
        width = feats.shape[-1]
        feats = feats.reshape(1, -1, BASE * BASE, width)
        glb = feats[0, :1].reshape(1, BASE, BASE, width)
        glb = torch.cat([glb, e.sub_img_feature_extensor.repeat(1, BASE, 1, 1)], dim=2).reshape(1, -1, width)
        sub = feats[0, 1:1 + rows * cols].reshape(rows, cols, BASE, BASE, width).transpose(1, 2)
        sub = sub.reshape(1, rows * BASE, cols * BASE, width)
        sub = torch.cat([sub, e.sub_img_feature_extensor.repeat(1, rows * BASE, 1, 1)], dim=2).reshape(1, -1, width)
        out = torch.cat([sub, e.global_img_feature_extensor, glb], dim=1)
        out = e.img_projection_down(torch.nn.functional.gelu(e.img_projection_up(out)))
        return out[0]


class Decoder(torch.nn.Module):
    """GenAI's decoder graph: the model on `inputs_embeds` after a past of any length."""

    def __init__(self, model):
        super().__init__()
        self.model, self.layers = model, model.config.num_hidden_layers

    def forward(self, inputs_embeds, attention_mask, position_ids, *past):
        cache = DynamicCache(config=self.model.config)
        for layer in range(self.layers):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        out = self.model(inputs_embeds=inputs_embeds, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=cache, use_cache=True)
        return (out.logits, *[t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)])


CHILD = r"""
import json, sys
import numpy as np
import onnxruntime_genai as og
spec = json.loads(sys.argv[1])
sample = json.load(open(spec["sample"]))
model = og.Model(spec["folder"])
params = og.GeneratorParams(model)
length = len(sample["ids"]) + spec["steps"]
params.set_search_options(do_sample=False, num_beams=1, max_length=length, min_length=length, batch_size=1)
generator = og.Generator(model, params)
inputs = og.NamedTensors()
inputs["input_ids"] = np.array([sample["ids"]], dtype=np.int32)
inputs["pixel_values"] = np.array(sample["pixels"], dtype=np.float32).reshape(sample["shape"])
inputs["image_attention_mask"] = np.ones(sample["mask"], dtype=np.float32)
inputs["image_sizes"] = np.array([sample["size"]], dtype=np.int64)
inputs["num_image_tokens"] = np.array([sample["tokens"]], dtype=np.int64)
generator.set_inputs(inputs)
while not generator.is_done():
    generator.generate_next_token()
print(json.dumps([int(t) for t in generator.get_sequence(0).tolist()][len(sample["ids"]):]))
"""


def main() -> int:
    spec = FAMILIES["phi4_multimodal"]
    model = tiny_model(spec).eval()
    config, vision = model.config, model.config.vision_config
    # transformers 5.24's Phi4MultimodalVisionAttention sets `is_causal = True`: under SDPA, where an all-ones patch
    # mask is dropped (create_bidirectional_mask returns None), its SigLIP tower attends causally, while the eager
    # kernel (and any traced graph, whose mask is kept) attends both ways; the tower runs the eager kernel here
    model.model.embed_tokens_extend.image_embed.img_processor.config._attn_implementation = "eager"
    image_token = int(vision.image_token_id)
    crops, rows, cols = 2, 1, 1  # one 448 x 448 image: the global crop and one HD crop
    tokens = BASE * BASE + 1 + rows * cols * BASE * BASE + rows * BASE + BASE  # GenAI's 256 + 1 + mask + rows + 16
    torch.manual_seed(1)
    pixels = torch.randn(1, crops, 3, 448, 448)
    mask = torch.ones(1, crops, 32, 32)
    text = [5, 17, 33]
    ids = torch.tensor([text[:2] + [image_token] * tokens + text[2:]])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), image_pixel_values=pixels,
                             image_sizes=torch.tensor([[448, 448]]), image_attention_mask=mask,
                             max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False, num_beams=1)
    eager = out[0, ids.shape[1]:].tolist()
    with tempfile.TemporaryDirectory(prefix="phi4mm-") as scratch:
        folder = Path(scratch)
        vision_module = FixedHdVision(model, rows, cols)
        _export(vision_module, (pixels, mask), folder / "genai_vision.onnx",
                ["pixel_values", "image_attention_mask"], ["image_features"])
        embed = SimpleNamespace(config=SimpleNamespace(image_token_id=image_token, text_config=config,
                                                       vision_config=SimpleNamespace()),
                                get_input_embeddings=model.get_input_embeddings)
        write_embedding(folder, embed)
        heads, kv = config.num_attention_heads, config.num_key_value_heads
        head = config.hidden_size // heads
        past = tuple(torch.zeros(1, kv, 3, head) for _ in range(2 * config.num_hidden_layers))
        names = [f".{n}.{part}" for n in range(config.num_hidden_layers) for part in ("key", "value")]
        query = torch.export.Dim("sequence_length", min=1)
        dynamic = ({1: query}, {1: torch.export.Dim("total_sequence_length", min=1)}, {1: query},
                   tuple({2: torch.export.Dim("past_sequence_length", min=0)} for _ in past))
        _export(Decoder(model), (torch.zeros(1, 2, config.hidden_size), torch.ones(1, 5, dtype=torch.long),
                                 torch.tensor([[3, 4]]), *past), folder / "genai_decoder.onnx",
                ["inputs_embeds", "attention_mask", "position_ids"] + [f"past_key_values{n}" for n in names],
                ["logits"] + [f"present{n}" for n in names], dynamic)
        content = genai_config(config, None, "genai_decoder.onnx")
        described = content["model"]
        inputs = {k: v for k, v in described["decoder"]["inputs"].items() if k != "input_ids"}
        described["decoder"]["inputs"] = {"inputs_embeds": "inputs_embeds", **inputs}
        described.update({
            "type": "phi4mm",
            # no speech graph: GenAI's own config defaults a speech processor file; both names cleared load vision only
            "speech": {"filename": "", "config_filename": ""},
            "embedding": {"filename": "genai_embedding.onnx",
                          "inputs": {"input_ids": "input_ids", "image_features": "image_features"},
                          "outputs": {"inputs_embeds": "inputs_embeds"}, "session_options": SESSION},
            "vision": {"filename": "genai_vision.onnx",
                       "inputs": {"pixel_values": "pixel_values", "attention_mask": "image_attention_mask"},
                       "outputs": {"image_features": "image_features"}, "session_options": SESSION}})
        (folder / GENAI_CONFIG).write_text(json.dumps(content, indent=2))
        sample = {"ids": ids[0].tolist(), "pixels": pixels.flatten().tolist(), "shape": list(pixels.shape),
                  "mask": list(mask.shape), "size": [448, 448], "tokens": tokens}
        (folder / "sample.json").write_text(json.dumps(sample))
        results = []
        for run in ("proof", "mutant"):
            if run == "mutant":  # the vision graph again, its projection's last bias shifted
                with torch.no_grad():
                    model.model.embed_tokens_extend.image_embed.img_projection_down.bias.add_(5.0)
                _export(vision_module, (pixels, mask), folder / "genai_vision.onnx",
                        ["pixel_values", "image_attention_mask"], ["image_features"])
            genai = _generate_in_genai(folder)
            if genai is None:
                return 1
            equal = next((i for i, (a, b) in enumerate(zip(eager, genai)) if a != b), min(len(eager), len(genai)))
            print(f"{run}: genai={genai} eager={eager} equal={equal}/{STEPS} image_tokens={tokens}")
            results.append(genai == eager)
    return 0 if results == [True, False] else 1


def _generate_in_genai(folder: Path) -> list[int] | None:
    """GenAI's greedy tokens from the folder and its sample, in a child (a native abort ends it, not this)."""
    spec_json = json.dumps({"folder": str(folder), "sample": str(folder / "sample.json"), "steps": STEPS})
    done = subprocess.run([sys.executable, "-c", CHILD, spec_json], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        print(f"GenAI failed: {done.stderr[-3000:]}")
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    sys.exit(main())
