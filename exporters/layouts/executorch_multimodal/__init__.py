"""ExecuTorch MultimodalRunner's layout: one `model.pte` with the methods the runner calls (`token_embedding`,
`vision_encoder`, `text_decoder` with the cache inside) and its metadata methods, `tokenizer.json` and the processor's
files beside it, run by executorch's `MultimodalRunner` (C++, and its Python binding `executorch.extension.llm.runner`).

| module      | what it holds                                                                                        |
|-------------|------------------------------------------------------------------------------------------------------|
| `__init__`  | [`ExecutorchMultimodal`]: when it applies (layout `multimodal_runner`), its card snippet, its decline  |
|             | of a methods-layout program it cannot hold (PaliGemma's prefix: `exporters.capture.image_attention`) |
| `proof.py`  | `MultimodalRunner` generating from an image and a prompt, the folder alone, token for token vs eager |

The image reaches the runner as the processor's `pixel_values` (float, normalized, `[1, 3, H, W]`: the
`vision_encoder` method's input dtype is float, so the runner takes float `CHW` pixels, not raw `uint8` `HWC`), the
prompt as the processor's token ids, split around each run of image tokens into the runner's input list
(`IMAGE_INPUTS`: what the binding's `generate_hf` does for one image; several images, each at its own run in the
prompt's order: proven with two), its text in pieces no longer than one `text_decoder` call takes (`get_max_seq_len`:
a sliding window's, Gemma 3's, where the program holds it in a ring buffer; the runner's prefiller runs each text
input in one call); Idefics3's and SmolVLM's `[1, n, 3, H, W]` (one image, or the processor's tiles and the whole
image, each its own run) go in as n images `[1, 3, H, W]`; an image with its `image_sizes` (LLaVA-NeXT's and
LLaVA-OneVision's tiles) as one, its tiles stacked down the height, at the one size the program takes (its
`image_size`: the snippet resizes the image to it and refuses another; `exporters.upstream.fixed_image`; several
images' `image_sizes` are refused the same way); Mistral 3's span of rows (`[IMG_BREAK]` after each, `[IMG_END]`
after the last) as one image, those two ids (the program's `image_span_tokens`) folded into its run of image tokens.
The program is the export's (`exporters.export.multimodal_runner`, `exporters.capture.multimodal_runner`, lowered by
`exporters.upstream.multimodal_runner`).

Example:
    >>> ExecutorchMultimodal().runtime
    'ExecuTorch MultimodalRunner'
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from exporters.capture.chat_prompt import IMAGE_PROMPT as CHAT_PROMPT, IMAGE_TEXT
from exporters.capture.image_attention import runner_declined
from exporters.layouts.base import Layout, read_json
from exporters.layouts.card import download, file_names, has_processor
from exporters.layouts.executorch_llm import ExecutorchLlm

LAYOUT = "multimodal_runner"  # the target's layout (exporters.capture.multimodal_runner)
# a vision- or audio-language generation program that kept the methods layout by default (the model or the target's
# settings do not fit the runner's program: its findings say which, `exporters.capture.multimodal_runner.NOT_MULTIMODAL`)
METHODS_KEPT = ("the program has a method per component (layout 'methods'), not the runner's token_embedding, "
                "vision_encoder or audio_encoder and text_decoder; the target's findings say why")
# the card's snippet and the proof's child share these lines: the runner, built and called the same way
RUNNER_IMPORTS = ("import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (the llama:: kernels)\n"
                  "import executorch.kernels.quantized  # noqa: F401  (a quantized embedding table's kernels)\n"
                  "from executorch.extension.llm.runner import GenerationConfig, MultimodalRunner\n")
IMAGE_IMPORTS = ("from executorch.extension.llm.runner import make_image_input, make_token_input\n"
                 "from executorch.runtime import Runtime\n")
# the most positions one text_decoder call takes (the program's get_max_seq_len: a sliding window held in a ring
# buffer, else the cache): the runner runs each text input in one call, so the prompt's text goes in pieces of it
STEP = ('program = Runtime.get().load_program({program})\n'
        'step = program.load_method("get_max_seq_len").execute([])[0]  # positions a call takes\n')
# a program of a model whose image comes with its image_sizes (LLaVA-NeXT, LLaVA-OneVision) takes one image of one size, its
# constant method image_size [H, W] (`exporters.upstream.fixed_image`): the image is resized to it before the
# processor, and an image the processor makes another size of is refused (the program's input has the traced shape)
SIZE = ('size = program.load_method("image_size").execute([]) if "image_size" in program.method_names else None\n'
        # Mistral 3's (Pixtral's) [IMG_BREAK] and [IMG_END]: the program emits them with the image's features
        'span = program.load_method("image_span_tokens").execute([]) if "image_span_tokens" in program.method_names '
        'else []\n')
RESIZE = "image = image.resize((size[1], size[0])) if size else image  # the one image size the program takes\n"
SIZE_CHECK = (
    'if size and inputs["image_sizes"].tolist() != [size]:  # the program is traced at one image size\n'
    '    raise ValueError(f"this program takes one image of {size[0]}x{size[1]}, not {inputs[\'image_sizes\'].tolist()}: "\n'
    '                     "resize the image to it")\n')
# the runner's input list from the processor's output: the prompt's text, and each image where its run of image
# tokens stands (LLaVA: one; Idefics3 and SmolVLM: [1, n, 3, H, W], the tiles and the whole image where the processor
# splits it, each its own run), what the binding's generate_hf does for one image; the text in pieces of at most
# `step` tokens (STEP)
IMAGE_INPUTS = (
    'ids, images = inputs["input_ids"][0].tolist(), inputs["pixel_values"].flatten(0, -4)  # images [n, 3, H, W]\n'
    "ids = [image_token_id if token in span else token for token in ids]  # Pixtral's rows: the image's one run\n"
    'if "image_sizes" in inputs:  # one image (LLaVA-NeXT: its tiles stacked down its height): one image input\n'
    "    images = images.transpose(0, 1).reshape(1, images.shape[1], -1, images.shape[-1])\n"
    "parts, text, n = [], [], 0\n"
    "for i, token in enumerate(ids):\n"
    "    if token != image_token_id:\n"
    "        text.append(token)\n"
    "    elif i == 0 or ids[i - 1] != image_token_id:  # a run of image tokens: the next image's features go there\n"
    "        parts += [make_token_input(text[j:j + step]) for j in range(0, len(text), step)]\n"
    "        parts.append(make_image_input(images[n:n + 1]))\n"
    "        text, n = [], n + 1\n"
    "parts += [make_token_input(text[j:j + step]) for j in range(0, len(text), step)]\n")
GENERATE = ("runner.generate(parts, GenerationConfig(echo=False, max_new_tokens={max_new_tokens}, temperature=0.0)"
            "{callback})")
# the card's call: the runner itself prints each piece as it generates (and its stats line after), so the card gives
# it no callback that would print them a second time
CARD_CALL = "  # the runner prints the text as it generates"
# an audio-language program: the binding's generate_hf splits a prompt around image tokens only, so the prompt goes
# in as the runner's input list, the audio's log-mel features where its audio tokens stand (make_audio_input)
AUDIO_IMPORTS = "from executorch.extension.llm.runner import make_audio_input, make_token_input\n"
AUDIO_INPUTS = "parts = [make_token_input(before), make_audio_input(input_features), make_token_input(after)]\n"
AUDIO_PROMPT = "Transcribe the audio."


class ExecutorchMultimodal(Layout):
    """`MultimodalRunner` on an ExecuTorch target in its layout."""

    runtime = "ExecuTorch MultimodalRunner"
    install = ExecutorchLlm.install

    def may_apply(self, target: Any, components: list[str]) -> bool:
        """The runner's layout, or a vision- or audio-language generation program in the methods layout (its
        stages: `embed_tokens`, `language_model`), which this runtime declines where it cannot hold the model."""
        if target.export_format != "executorch":
            return False
        layout = getattr(target, "layout", None)
        return layout == LAYOUT or (layout is None and target.mode == "generation"
                                    and {"embed_tokens", "language_model"} <= set(components))

    def applies(self, target: Any, directory: Path) -> bool:
        return target.export_format == "executorch" and getattr(target, "layout", None) == LAYOUT

    def declines(self, target: Any, directory: Path) -> str | None:
        if getattr(target, "layout", None) != LAYOUT:  # the methods layout kept by default: the runner loads none
            return runner_declined(read_json(directory / "config.json")) or METHODS_KEPT
        return ExecutorchLlm.declines(self, target, directory)  # the same C++ tokenizer

    def reference(self, model: Any, context: Any) -> Any:
        if getattr(context.target, "layout", None) != LAYOUT:
            return None  # a methods-layout program: no proof runs (declined, or not this runtime's folder)
        return super().reference(model, context)

    def snippet(self, repo_id: str, target: dict[str, Any], revision: str | None) -> tuple[str, str] | None:
        if not has_processor(target):  # the snippet runs the folder's processor: none to run as written
            return None
        data = ', f"{folder}/model.ptd"' if "model.ptd" in file_names(target) else ""
        names = {c.get("name") if isinstance(c, dict) else c for c in target.get("components") or []}
        if "audio_encoder" in names:  # the report's components: an audio-language program
            return "python", audio_snippet(repo_id, target, revision, data)
        return "python", (
            download(repo_id, target, revision)
            + RUNNER_IMPORTS + IMAGE_IMPORTS
            + "from PIL import Image\nfrom transformers import AutoConfig, AutoProcessor\n\n"
            f'runner = MultimodalRunner(f"{{folder}}/model.pte", f"{{folder}}/tokenizer.json"{data})\n'
            "processor = AutoProcessor.from_pretrained(folder)\n"
            "image_token_id = AutoConfig.from_pretrained(folder).image_token_id\n"
            + STEP.format(program='f"{folder}/model.pte"') + SIZE
            + 'image = Image.open("image.jpg").convert("RGB")  # your image\n' + RESIZE
            + f'text = {json.dumps(IMAGE_TEXT)}  # your prompt\n'
            + CHAT_PROMPT  # the repo's chat template, as the sample's prompt the proof ran (capture.chat_prompt)
            + 'inputs = processor(images=image, text=prompt, add_special_tokens=specials, return_tensors="pt")'
            "  # float pixel_values\n"
            + SIZE_CHECK + IMAGE_INPUTS
            + GENERATE.format(max_new_tokens=32, callback="") + CARD_CALL)


def audio_snippet(repo_id: str, target: dict[str, Any], revision: str | None, data: str) -> str:
    """The card's snippet of an audio-language program: the folder's feature extractor makes the log-mel features
    of a 16 kHz clip, the tokenizer the prompt around them (the proof's child runs the same input list)."""
    return (download(repo_id, target, revision)
            + RUNNER_IMPORTS + AUDIO_IMPORTS
            + "import numpy as np\nfrom transformers import AutoFeatureExtractor, AutoTokenizer\n\n"
            f'runner = MultimodalRunner(f"{{folder}}/model.pte", f"{{folder}}/tokenizer.json"{data})\n'
            "tokenizer = AutoTokenizer.from_pretrained(folder)\n"
            "extractor = AutoFeatureExtractor.from_pretrained(folder)\n"
            "audio = np.zeros(extractor.n_samples, dtype=np.float32)  # your 16 kHz mono clip\n"
            'input_features = extractor(audio, sampling_rate=16000, return_tensors="pt")["input_features"]\n'
            "before = [tokenizer.bos_token_id]\n"
            f'after = tokenizer.encode("{AUDIO_PROMPT}", add_special_tokens=False)  # your prompt\n'
            + AUDIO_INPUTS
            + GENERATE.format(max_new_tokens=32, callback="") + CARD_CALL)
