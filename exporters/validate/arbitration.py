"""Float64 arbitration of a failed float32 check: is the artifact wrong, or is eager float32 itself rounding?

A float32 artifact is compared with the eager model run in float32, and both round. Where activations grow large
(a random Pixtral tower's states reach ~100: issue #50), eager float32's own rounding can exceed the check's
tolerance while the artifact is nearer the exact result than eager is. So where a float32 check fails, that probe's
eager reference is computed again in float64 (the same module copied to float64 on CPU, the probe's floating inputs
in float64) and the artifact is judged against that more exact reference, at the same atol/rtol. The check then
passes only when the artifact is within tolerance of float64 (never a pass the float64 reference does not back);
the report keeps both comparisons (the check's `float64` record) and says how far eager float32 itself was.

    failed check ──► Arbiter.reference(probe) ──► module copied to float64, probe in float64
                                │
                                ▼
       artifact vs float64 (judges the check) · eager float32 vs float64 (reported) · artifact vs float32 (kept)

Example:
    >>> arbiter = Arbiter(torch.nn.Linear(2, 2), [("traced", {"input": torch.ones(1, 2)}, None)])
    >>> arbiter.reference(0)[0].dtype
    torch.float64
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from exporters.errors import describe_error, recoverable

__all__ = ["ARBITRATION_MAX_BYTES", "Arbiter", "float64_inputs", "keeps_eager_weights"]

# the float64 copy of a module is made only where it holds at most this many bytes of weights (a failed check of a
# larger model is left failed, saying so): it lives beside the model while the check is judged
ARBITRATION_MAX_BYTES = 2 * 1024 ** 3


def keeps_eager_weights(model: torch.nn.Module) -> bool:
    """Whether a run keeps `model`'s eager weights through its last target's validation instead of freeing them
    before the artifact loads: where the whole model's float64 copy is within `ARBITRATION_MAX_BYTES`, so a failed
    check can be arbitrated on every target alike (a target's verdict never depends on its place in the run); a
    larger model frees them (the eager model and the artifact are never in memory together) and is never arbitrated.

    Example:
        >>> keeps_eager_weights(torch.nn.Linear(2, 2))
        True
    """
    return _float64_bytes(model) <= ARBITRATION_MAX_BYTES


def _float64_bytes(module: torch.nn.Module) -> int:
    """What `module`'s float64 copy (its parameters and buffers) takes."""
    return sum(t.numel() for t in (*module.parameters(), *module.buffers())) * 8


def float64_inputs(value: Any) -> Any:
    """`value` with every floating tensor (in dicts, lists, tuples) as float64 on CPU; everything else as it is.

    Example:
        >>> float64_inputs({"x": torch.ones(1), "ids": torch.ones(1, dtype=torch.long)})["x"].dtype
        torch.float64
    """
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().to(torch.float64) if value.is_floating_point() else value.cpu()
    if isinstance(value, dict):
        return {key: float64_inputs(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(float64_inputs(item) for item in value)
    value = copy.deepcopy(value)
    for layer in getattr(value, "layers", None) or []:  # a cache: its keys, values and states
        for name, item in vars(layer).items():
            if isinstance(item, torch.Tensor) and item.is_floating_point():
                setattr(layer, name, item.to(torch.float64))
            elif isinstance(item, dict):
                item.update({k: v.to(torch.float64) for k, v in item.items()
                             if isinstance(v, torch.Tensor) and v.is_floating_point()})
    return value


class Arbiter:
    """A component's eager module and its probes (as eager takes them), from which a failed probe's float64
    reference is computed on demand ([`reference`]); the copy in float64 is made once, at the first failure."""

    def __init__(self, module: torch.nn.Module, probes: list) -> None:
        self.module, self.probes = module, probes
        self._float64: torch.nn.Module | None = None

    def unavailable(self) -> str | None:
        """Why no float64 reference can be computed (None when it can)."""
        if any(t.device.type == "meta" for t in (*self.module.parameters(), *self.module.buffers())):
            return ("the eager weights were freed before the artifact was loaded (the run's last target: the two "
                    "are never in memory together)")
        size = _float64_bytes(self.module)
        if size > ARBITRATION_MAX_BYTES:
            return f"the module's float64 copy would take {size / 1024 ** 3:.1f} GiB (at most " \
                   f"{ARBITRATION_MAX_BYTES / 1024 ** 3:.0f} GiB)"
        return None

    def reference(self, index: int) -> Any:
        """Probe `index`'s eager output in float64. Raises when the module cannot run in float64."""
        if self._float64 is None:
            self._float64 = copy.deepcopy(self.module).to(device="cpu", dtype=torch.float64)
        _, probe, _ = self.probes[index]
        with torch.no_grad():
            return self._float64(**float64_inputs(probe))

    def judge(self, index: int, reference: Any, actual: Any, atol: float, rtol: float, compare) -> dict[str, Any]:
        """The check's float64 record: `outputs` (the artifact vs float64, which judge the check), `eager_float32`
        (eager float32 vs float64: the reference's own rounding), `passed`; or `error` when it could not run.
        `compare` is `exporters.validate.checks.compare_outputs`."""
        why = self.unavailable()
        if why is not None:
            return {"passed": False, "error": f"float64 arbitration not run: {why}"}
        try:
            exact = self.reference(index)
        except BaseException as err:
            if not recoverable(err):
                raise
            return {"passed": False, "error": f"float64 arbitration could not run: {describe_error(err)[:300]}"}
        outputs = compare(exact, actual, atol, rtol)
        eager = compare(exact, reference, atol, rtol)
        return {"passed": bool(outputs) and all(o.passed for o in outputs), "outputs": outputs,
                "eager_float32": eager}
