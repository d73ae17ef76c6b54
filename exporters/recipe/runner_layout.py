"""The recipe settings of an ExecuTorch target's program layout: `layout`, `custom_ops`, `external_weights`.

A mixin of the ExecuTorch target model (`exporters.recipe`): its fields are recipe keys like the others, and a rule
they break is a recipe problem with its JSON path and line.

Example:
    >>> from exporters.recipe.load import parse_recipe
    >>> parse_recipe('{"export_format": "executorch", "layout": "methods", "custom_ops": true}')
    Traceback (most recent call last):
    ...
    exporters.errors.RecipeError: $.custom_ops (line 1): custom_ops applies to layout 'runner' (the methods layout takes the cache as inputs): drop it, or use layout 'runner'
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from exporters.recipe._base import problem as _problem


class ExecutorchLayoutSetting(BaseModel):
    """`layout`: the ExecuTorch LLM runner's program, or a method per component (`exporters.capture.llm_runner`)."""

    model_config = ConfigDict(extra="forbid", validate_default=True)

    layout: Literal["runner", "multimodal_runner", "methods"] | None = Field(
        default=None,
        description="Generation: 'runner' writes one model.pte in the contract of ExecuTorch's LLM runner "
        "(TextLLMRunner) and optimum-executorch: forward(tokens [1, seq], cache_position [seq]) -> logits, the KV "
        "cache held in the program, constant metadata methods (get_max_seq_len, get_eos_ids, ...), tokenizer.json "
        "beside it; for a vision-language model, the layout of ExecuTorch's MultimodalRunner ('multimodal_runner', which "
        "may also be asked by name): one model.pte with the methods token_embedding, vision_encoder (the "
        "processor's pixel_values, float [1, 3, H, W]) and text_decoder (inputs_embeds, cache_position; the cache "
        "inside) and the same metadata methods, for LLaVA-style models (one image whose features replace one run of "
        "image tokens). 'methods': one program with a method per component (prefill, decode taking and returning the "
        "cache). For a speech encoder-decoder (Whisper) 'runner' is the layout of ExecuTorch's ASR runner and "
        "optimum-executorch: methods encoder (input_features) and text_decoder (decoder_input_ids, "
        "encoder_hidden_states, cache_position; the self-attention cache inside). Default: 'runner' for decoder-only "
        "models (static cache, batch 1) that run with the runner program's static cache and whose runner program "
        "exports, and for Whisper (static cache, batch 1), 'multimodal_runner' for LLaVA-style vision-language "
        "models (float or quantized, static cache, batch 1), 'methods' otherwise (the report says why).",
    )
    custom_ops: StrictBool | None = Field(
        default=None,
        description="Layout 'runner': use ExecuTorch's LLM custom ops (llama::custom_sdpa, llama::update_cache), "
        "as optimum-executorch's --use_custom_sdpa --use_custom_kv_cache. Default: true where the model's attention goes "
        "through transformers' attention interface (false for models that compute it in their own code, such as "
        "BLOOM's ALiBi). A runtime that runs the "
        "program needs the custom-ops kernels (Python: import executorch.extension.llm.custom_ops.custom_ops).",
    )
    external_weights: StrictBool | None = Field(
        default=None,
        description="Layout 'runner': the weights in model.ptd beside model.pte (pass it as the runner's data "
        "path). Default: in model.ptd when the model ties its embedding table to its output projection and is not "
        "quantized (the table is then stored once; inside a .pte it is stored twice) or when the program would pass "
        "2 GB, inside model.pte otherwise.",
    )

    @model_validator(mode="after")
    def _runner_settings(self) -> Any:
        if self.layout in ("runner", "multimodal_runner") and getattr(self, "mode", None) == "model":
            raise _problem(("layout",), f"layout {self.layout!r} applies to mode 'generation'")
        method = getattr(getattr(self, "quantize", None), "method", None)
        if method == "torchao-xnnpack" and (self.layout == "methods" or getattr(self, "mode", None) == "model"):
            raise _problem(("quantize", "method"), "'torchao-xnnpack' quantizes a runner's program (mode "
                                                   "'generation', layout 'runner' or 'multimodal_runner'); for this "
                                                   "target use {'method': 'pt2e-xnnpack', 'scheme': '8da4w'}")
        if self.layout == "methods":
            for key in ("custom_ops", "external_weights"):
                if getattr(self, key) is not None:
                    raise _problem((key,), f"{key} applies to layout 'runner' (the methods layout takes the cache as "
                                           "inputs): drop it, or use layout 'runner'")
        return self
