"""`onnx.checker` on graphs fused for ONNX Runtime (`ort_fusions`): ONNX Runtime's own ops that it registers in
ONNX's own domain, which the checker does not know.

Fused ops in `com.microsoft` (`GroupQueryAttention`, `SkipSimplifiedLayerNormalization`, `RotaryEmbedding`) pass the
checker as they are: it checks the nodes of a domain it has no schemas for only for their structure. ONNX Runtime
registers `SimplifiedLayerNormalization` (the RMS norm `ort_fusions` writes for a model's last norm) in ONNX's domain
instead, where the checker refuses any op it has no schema for (`No Op registered for SimplifiedLayerNormalization`).
`ort_checker_schemas()` declares it, with ONNX Runtime's own schema (`onnxruntime/core/graph/contrib_ops/
contrib_defs.cc`), for the duration of a check only, so every other node is still checked against ONNX's.

Example:
    >>> sorted(ORT_ONNX_DOMAIN_OPS)
    ['SimplifiedLayerNormalization']
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_FLOATS = ["tensor(float)", "tensor(float16)", "tensor(double)", "tensor(bfloat16)"]


def _simplified_layer_normalization(schema_type: Any) -> Any:
    """ONNX Runtime's `SimplifiedLayerNormalization` schema (ONNX's domain, since version 1)."""
    parameter, option = schema_type.FormalParameter, schema_type.FormalParameterOption
    return schema_type(
        "SimplifiedLayerNormalization", "", 1,
        doc="ONNX Runtime's RMS normalization (contrib op registered in ONNX's domain).",
        inputs=[parameter("X", "T"), parameter("scale", "V")],
        outputs=[parameter("Y", "V"), parameter("inv_std_var", "U", param_option=option.Optional)],
        type_constraints=[("T", _FLOATS, ""), ("U", ["tensor(float)", "tensor(double)"], ""), ("V", _FLOATS, "")],
        attributes=[schema_type.Attribute("axis", schema_type.AttrType.INT, "", required=False),
                    schema_type.Attribute("epsilon", schema_type.AttrType.FLOAT, "", required=False),
                    schema_type.Attribute("stash_type", schema_type.AttrType.INT, "", required=False)],
    )


_SCHEMAS = {"SimplifiedLayerNormalization": _simplified_layer_normalization}
ORT_ONNX_DOMAIN_OPS = frozenset(_SCHEMAS)


@contextmanager
def ort_checker_schemas() -> Iterator[list[str]]:
    """Within the block, `onnx.checker` knows ONNX Runtime's ops of ONNX's domain (the module); yields the ones it
    declared (none where onnx already has them)."""
    # onnx loads only where an ONNX file is checked
    import onnx

    declared = []
    for op, schema in sorted(_SCHEMAS.items()):
        if not onnx.defs.has(op, ""):
            onnx.defs.register_schema(schema(onnx.defs.OpSchema))
            declared.append(op)
    try:
        yield declared
    finally:
        for op in declared:
            onnx.defs.deregister_schema(op, 1, "")
