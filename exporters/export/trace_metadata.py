"""The trace's debugging metadata, dropped from every graph before it is saved.

torch's ONNX exporter annotates each node it writes with where it came from (`pkg.torch.onnx.stack_trace`: the
source lines with the absolute paths of the exporting machine's Python installation, `namespace`, the module
hierarchy, the FX node, name scopes), and `torch.export` keeps each node's `stack_trace` in a `.pt2`'s graph. None of
it is read by a runtime, but it is published with the artifact: it tells anyone who downloads the folder the
directory layout (and often the user name) of the machine or CI runner that exported it, and it is most of a graph
file's bytes (about nine tenths of a small LLM's `model.onnx`, which made an int4 folder larger than the GenAI
builder's for the same weights). ONNX Runtime GenAI's builder and optimum write no such metadata either.
"""

from __future__ import annotations

from typing import Any

# The `torch.export` node fields that hold source text (file paths and code lines) rather than graph semantics.
SOURCE_FIELDS = ("stack_trace",)


def drop_onnx_trace_metadata(model: Any) -> int:
    """Remove every node's `metadata_props` in an `onnx_ir.Model` (its graph, its functions and their subgraphs).

    Returns how many nodes carried some.

    Example:
        >>> import onnx_ir as ir
        >>> node = ir.node("Relu", [ir.Value(name="x")], metadata_props={"pkg.torch.onnx.stack_trace": "/home/u/x.py"})
        >>> model = ir.Model(ir.Graph([], node.outputs, nodes=[node]), ir_version=10)
        >>> drop_onnx_trace_metadata(model), dict(node.metadata_props)
        (1, {})
    """
    # onnx_ir loads only where an ONNX graph is exported
    from onnx_ir.traversal import RecursiveGraphIterator

    cleared = 0
    for root in [model.graph, *model.functions.values()]:
        for node in RecursiveGraphIterator(root):  # subgraphs too: an `If`'s branches, a `Loop`'s body
            if node.metadata_props:
                node.metadata_props.clear()
                cleared += 1
    return cleared


def drop_export_source_text(program: Any) -> int:
    """Remove the source text (`stack_trace`) from every node of a `torch.export.ExportedProgram`'s graph and of its
    submodules' graphs (a `cond`'s branches). Returns how many nodes carried some.

    Example:
        >>> import torch
        >>> program = torch.export.export(torch.nn.ReLU(), (torch.ones(2),))
        >>> drop_export_source_text(program) >= 0, any(n.meta.get("stack_trace") for n in program.graph.nodes)
        (True, False)
    """
    cleared = 0
    for module in program.graph_module.modules():
        graph = getattr(module, "graph", None)
        for node in graph.nodes if graph is not None else ():
            for field in SOURCE_FIELDS:
                if node.meta.pop(field, None) is not None:
                    cleared += 1
    return cleared


def drop_trace_metadata(component: Any, export_format: str) -> None:
    """Drop the trace's debugging metadata from an upstream exported component about to be saved: an ONNX graph
    (`onnx_ir.Model`) or a `torch.export` program (`dynamo`). An ExecuTorch program holds none."""
    if export_format == "onnx":
        drop_onnx_trace_metadata(component.program)
    elif export_format == "dynamo":
        drop_export_source_text(component.program)
