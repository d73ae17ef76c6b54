"""What validation is handed: the eager side a target is compared with ([`EagerModel`]) and the saved folder it
judges ([`SavedTarget`]), each one object instead of a long list of arguments.

Example:
    >>> SavedTarget(Path("out/onnx"), trust_artifacts=False).device is None
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporters.validate.folder_trust import Inventory


@dataclass(frozen=True)
class EagerModel:
    """What a target is compared with: the eager model loaded once for the run, its family, the sample inputs
    generation starts from, the eager outputs computed so far (`eager`, an `EagerCache` shared by the run's
    targets), the target's generation config (its cache setting applied; None outside generation), the folder
    the model came from (its processor, for the runtimes' own inputs) and whether the dynamic dims are probed one at
    a time (`probe_dims_apart`: `hf-export init` reads which dim fails at which size; else together,
    `exporters.capture.probes.make_probes`).

    Example:
        >>> EagerModel(model, "text", inputs, EagerCache(), source_dir=folder)  # doctest: +SKIP
    """

    model: Any
    family: str
    generate_inputs: dict[str, Any]
    eager: Any
    generation_config: Any = None
    source_dir: Path | None = None
    probe_dims_apart: bool = False


@dataclass(frozen=True)
class SavedTarget:
    """A target's saved folder and what this run knows about it: whether its pickled programs (`.pt2`) may load
    (`trust_artifacts`: this run wrote them, or the operator allowed it), what this run's export wrote and copied
    there (`inventory`, all a runtime may read; None for a folder this run did not write), where the artifact
    runs (`device`, the target's; the eager references stay where the model is), and whether its runtimes prove it
    here (`proofs`: False for a dtype file judged alone, `exporters.validate.dtype_files`, whose folder's proof
    loads every dtype file).

    Example:
        >>> SavedTarget(Path("out/onnx")).trust_artifacts
        True
    """

    directory: Path
    trust_artifacts: bool = True
    inventory: Inventory | None = None
    device: str | None = None
    proofs: bool = True
