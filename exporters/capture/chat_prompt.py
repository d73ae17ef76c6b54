"""The prompt a user's transformers builds for one user turn from the repo's chat template, as lines of Python the
card's snippets run as written and the sample inputs are made by: the prompt a runtime's proof ran is the one its card
shows. Reads no torch (the layouts' face imports it).

A vision-language model's turn holds one image and the text ([`IMAGE_PROMPT`], [`image_prompt`]): the repo's chat
template (the processor's: `chat_template.jinja`, `chat_template.json`, `processor_config.json`; else the
tokenizer's: `tokenizer_config.json`) rendered with the generation prompt, and `specials` False where the rendering
starts with the tokenizer's bos (the template wrote it: the processor's `apply_chat_template(..., tokenize=True)`
drops the tokenizer's own likewise); a repo without a template: the image token, then the text. A text model's turn
holds the text alone ([`TEXT_PROMPT`], [`text_prompt`]): the tokenizer's template (`chat_template.jinja`,
`tokenizer_config.json`) rendered with the generation prompt; without one, the text as it is.

Example:
    >>> from types import SimpleNamespace
    >>> llava = SimpleNamespace(chat_template="USER: {% for m in messages %}{% for c in m.content %}"
    ...                         "{{ '<image>' if c.type == 'image' else c.text }}{% endfor %}{% endfor %} ASSISTANT:",
    ...                         image_token="<image>", tokenizer=SimpleNamespace(bos_token="<s>"))
    >>> llava.apply_chat_template = lambda turn, chat_template, add_generation_prompt: __import__(
    ...     "jinja2").Template(chat_template).render(messages=turn)
    >>> image_prompt(llava, "Describe the image.")
    ('USER: <image>Describe the image. ASSISTANT:', True)
"""

from __future__ import annotations

from typing import Any

IMAGE_TEXT = "Describe the image."  # the turn's text where the recipe sets no prompt (the card's: "your prompt")
# `processor` and `text` in, `prompt` and `specials` (the processor call's `add_special_tokens`) out. Our own lines:
# nothing from a report or a repo enters them (the template is rendered by transformers' sandboxed Jinja).
IMAGE_PROMPT = """turn = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
template = processor.chat_template or getattr(processor.tokenizer, "chat_template", None)  # the repo's, if any
prompt = (processor.apply_chat_template(turn, chat_template=template, add_generation_prompt=True) if template
          else f"{processor.image_token}{text}")
bos = processor.tokenizer.bos_token
specials = not (template and bos and prompt.startswith(bos))  # the template wrote the bos: not twice
"""


def image_prompt(processor: Any, text: str) -> tuple[str, bool]:
    """`(prompt, add_special_tokens)` of one user turn with one image and `text` ([`IMAGE_PROMPT`]: the card's
    lines, run here as the card runs them; one rendering, not two).

    Example:
        >>> from types import SimpleNamespace
        >>> plain = SimpleNamespace(chat_template=None, image_token="<image>",
        ...                         tokenizer=SimpleNamespace(bos_token="<s>", chat_template=None))
        >>> image_prompt(plain, "Describe the image.")
        ('<image>Describe the image.', True)
    """
    scope: dict[str, Any] = {"processor": processor, "text": text}
    exec(IMAGE_PROMPT, scope)  # our own constant (never a report's value): the lines the card's snippet shows
    return scope["prompt"], scope["specials"]


# `tokenizer` (transformers') and `prompt` in, `prompt` out: the ExecuTorch LLM runner's card runs these lines as
# written, its proof's prompt is made by them ([`text_prompt`]); the runner's tokenizer reads the rendering's special
# tokens (its bos among them) as transformers' does
TEXT_PROMPT = """if tokenizer.chat_template:  # the repo's chat template: one user turn, with the generation prompt
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                           add_generation_prompt=True)
"""


def text_prompt(tokenizer: Any, prompt: str) -> str:
    """One user turn of `prompt` in the tokenizer's chat template ([`TEXT_PROMPT`]: the card's lines, run here as
    the card runs them), or `prompt` itself where it has none.

    Example:
        >>> from types import SimpleNamespace
        >>> text_prompt(SimpleNamespace(chat_template=None), "Hello")
        'Hello'
    """
    scope: dict[str, Any] = {"tokenizer": tokenizer, "prompt": prompt}
    exec(TEXT_PROMPT, scope)  # our own constant (never a report's value): the lines the card's snippet shows
    return scope["prompt"]
