"""The recipe settings of a target's graph layout: `merged` (every format) and `layout` (ONNX), with their rules.

Mixins of the recipe's target models (`exporters.recipe`): their fields are recipe keys like the others, and a rule
they break is a recipe problem with its JSON path and line.

Example:
    >>> from exporters.recipe.load import parse_recipe
    >>> parse_recipe('{"export_format": "onnx", "layout": "transformers.js", "dtype": "bfloat16"}')
    Traceback (most recent call last):
    ...
    exporters.errors.RecipeError: $.dtype (line 1): transformers.js has no bfloat16 models: use dtype float32 or float16
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from exporters.recipe._base import problem as _problem

TRANSFORMERS_JS = "transformers.js"  # the `layout` value of transformers.js's folder (exporters.layouts.transformers_js)


class MergedSetting(BaseModel):
    """`merged`: one graph for the prompt and every decode step (`exporters.capture.merged`)."""

    model_config = ConfigDict(extra="forbid", validate_default=True)

    merged: StrictBool | None = Field(
        default=None,
        description="Generation: one graph ('model') for the prompt (empty cache) and every decode step, instead of "
        "prefill + decode. Default: true for dynamo targets, and ONNX targets with dynamic shapes, of decoder-only "
        "models with a dynamic key-value cache whose layers all keep one cache length (no sliding-window mix) and no "
        "prefill/decode components; false otherwise (and for models whose decode has no key-value cache, such as "
        "Mamba, or carries a state-space scan's recurrent states, such as the hybrid Falcon-H1). An encoder-decoder "
        "ONNX target's two decoders are merged into decoder_model_merged.onnx unless merged is false "
        "(decoder_model.onnx + decoder_with_past_model.onnx); true does not apply to it.",
    )

    @model_validator(mode="after")
    def _merged_is_one_graph(self) -> Any:
        if self.merged and getattr(self, "mode", None) == "model":
            raise _problem(("merged",), "merged applies to mode 'generation' (mode 'model' is one graph already)")
        separate = sorted(set(getattr(self, "components", {})) & {"prefill", "decode"}) if self.merged else []
        if separate:
            raise _problem(("components", separate[0]), f"a merged export has one component, 'model', and no "
                                                        f"{separate}: put these settings under components.model, or "
                                                        "set merged: false")
        return self


class LayoutSetting(BaseModel):
    """`layout`: the folder layout of an ONNX target (`exporters.layouts.transformers_js`)."""

    model_config = ConfigDict(extra="forbid", validate_default=True)

    layout: Literal["upstream", "transformers.js"] = Field(
        default="upstream",
        description="'transformers.js': write onnx/model.onnx (past_key_values.{i}.key/value inputs, present.{i}.* "
        "outputs) with model.onnx_data and the config files, so transformers.js can load the target folder; an "
        "encoder-decoder generation target writes onnx/encoder_model.onnx and onnx/decoder_model_merged.onnx instead, "
        "and a LLaVA, Idefics3 or SmolVLM generation target onnx/vision_encoder.onnx, onnx/embed_tokens.onnx and "
        "onnx/decoder_model_merged.onnx (another vision-language model keeps its components, transformers.js "
        "declined with the reason).",
    )

    @model_validator(mode="after")
    def _transformers_js_layout(self) -> Any:
        if self.layout != TRANSFORMERS_JS:
            return self
        if getattr(self, "merged", None) is False:
            raise _problem(("merged",), "layout 'transformers.js' needs the merged graph (transformers.js runs one "
                                        "decoder graph): drop merged: false")
        if getattr(self, "dtype", None) == "bfloat16":
            raise _problem(("dtype",), "transformers.js has no bfloat16 models: use dtype float32 or float16")
        for key, default in (("output_path", None), ("external_data", True), ("export_params", True),
                             ("keep_initializers_as_inputs", False)):
            if getattr(self, key, default) != default:
                raise _problem((key,), f"{key} is not supported with layout 'transformers.js' yet: the layout writes "
                                       "onnx/model.onnx with model.onnx_data itself")
        return self
