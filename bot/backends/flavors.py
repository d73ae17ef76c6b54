"""Which Hugging Face Jobs machine (flavor) a job gets: the one place for the flavors' sizes and prices, and the choice.

The table is Hugging Face's published one (`FLAVORS_SOURCE`); `huggingface_hub.JobHardware` lists the same names,
and `GET /api/jobs/hardware` (`HfApi.list_jobs_hardware`) answers today's prices. Sizes in decimal GB, as published.

The choice, from the work (`Work`: the run's memory estimate, `exporters.run.memory_plan`, from the checkpoint's
safetensors headers; the disk it writes; whether a target runs on CUDA):

```
candidates = the operator's allow-list (`hf_jobs_flavors`; empty: every flavor below)
             under the ceiling (`hf_jobs_max_flavor`: no dearer than it; `hf_jobs_max_usd_per_hour`)
a CUDA target  ──► GPU flavors whose one GPU's memory and whose host memory both hold the estimate
otherwise      ──► CPU flavors whose memory holds the estimate
               ──► the cheapest of those (then the smallest); none: skipped, saying what it would need
```

A flavor "holds" `n` bytes when `n` is at most `USABLE` of its memory (the rest: the system, the page cache of the
downloads). The estimate is one export at a time: a larger machine only lets the run export more targets at once.

Example:
    >>> work = Work(memory_bytes=20 * 10**9, disk_bytes=10**9, cuda=False)
    >>> choose(work).flavor.name
    'cpu-upgrade'
    >>> choose(work, max_usd_per_hour=0.02).flavor is None
    True
"""

from __future__ import annotations

from dataclasses import dataclass

FLAVORS_SOURCE = ("https://huggingface.co/docs/hub/jobs-pricing (huggingface/hub-docs docs/hub/jobs-pricing.md at "
                  "0b8c07f8), read 2026-12-05")
USABLE = 0.9
GB = 10**9


@dataclass(frozen=True)
class Flavor:
    """One Jobs machine: vCPUs, memory, GPUs (count, model, total GPU memory), ephemeral disk and USD per hour."""

    name: str
    vcpus: int
    memory_gb: int
    disk_gb: int
    usd_per_hour: float
    gpus: int = 0
    gpu: str = ""
    gpu_memory_gb: int = 0

    def holds(self, need: int | None, gpu: bool) -> bool:
        """Whether `need` bytes fit its memory (and, for `gpu`, one of its GPUs: an export runs on one device); an
        unknown need fits anything."""
        if need is None:
            return True
        one_gpu = self.gpu_memory_gb / max(self.gpus, 1)
        return need <= USABLE * self.memory_gb * GB and (not gpu or need <= USABLE * one_gpu * GB)

    def describe(self) -> str:
        """E.g. `cpu-xl (16 vCPU, 124 GB, $1.00/h)`."""
        gpu = f", {self.gpus}x {self.gpu} {self.gpu_memory_gb} GB" if self.gpus else ""
        return f"{self.name} ({self.vcpus} vCPU, {self.memory_gb} GB{gpu}, ${self.usd_per_hour:.2f}/h)"


def _gpu(name: str, vcpus: int, memory: int, disk: int, usd: float, gpus: int, gpu: str, gpu_memory: int) -> Flavor:
    return Flavor(name, vcpus, memory, disk, usd, gpus, gpu, gpu_memory)


FLAVORS: tuple[Flavor, ...] = (
    Flavor("cpu-basic", 2, 16, 50, 0.01),
    Flavor("cpu-upgrade", 8, 32, 50, 0.03),
    Flavor("cpu-xl", 16, 124, 1000, 1.00),
    Flavor("cpu-performance", 32, 256, 1024, 1.90),
    _gpu("t4-small", 4, 15, 50, 0.40, 1, "T4", 16),
    _gpu("t4-medium", 8, 30, 100, 0.60, 1, "T4", 16),
    _gpu("l4x1", 8, 30, 400, 0.80, 1, "L4", 24),
    _gpu("l4x4", 48, 186, 3200, 3.80, 4, "L4", 96),
    _gpu("l40sx1", 8, 62, 380, 1.80, 1, "L40S", 48),
    _gpu("l40sx4", 48, 382, 3200, 8.30, 4, "L40S", 192),
    _gpu("l40sx8", 192, 1534, 6500, 23.50, 8, "L40S", 384),
    _gpu("a10g-small", 4, 15, 110, 1.00, 1, "A10G", 24),
    _gpu("a10g-large", 12, 46, 200, 1.50, 1, "A10G", 24),
    _gpu("a10g-largex2", 24, 92, 1000, 3.00, 2, "A10G", 48),
    _gpu("a10g-largex4", 48, 184, 2000, 5.00, 4, "A10G", 96),
    _gpu("a100-large", 12, 142, 1000, 2.50, 1, "A100", 80),
    _gpu("a100x4", 48, 568, 4000, 10.00, 4, "A100", 320),
    _gpu("a100x8", 96, 1136, 8000, 20.00, 8, "A100", 640),
    _gpu("h200", 23, 256, 3000, 5.00, 1, "H200", 141),
    _gpu("h200x2", 46, 512, 6000, 10.00, 2, "H200", 282),
    _gpu("h200x4", 92, 1024, 12000, 20.00, 4, "H200", 564),
    _gpu("h200x8", 184, 2048, 24000, 40.00, 8, "H200", 1128),
    _gpu("rtx-pro-6000", 23, 256, 475, 2.75, 1, "RTX PRO 6000", 96),
    _gpu("rtx-pro-6000x2", 46, 512, 950, 5.50, 2, "RTX PRO 6000", 192),
    _gpu("rtx-pro-6000x4", 92, 1024, 1900, 11.00, 4, "RTX PRO 6000", 384),
    _gpu("rtx-pro-6000x8", 184, 2048, 3800, 22.00, 8, "RTX PRO 6000", 768),
)
BY_NAME = {flavor.name: flavor for flavor in FLAVORS}


def flavor(name: str) -> Flavor:
    """The flavor called `name`; `ValueError` naming the known ones otherwise.

    Example:
        >>> flavor("a100-large").gpu_memory_gb
        80
    """
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown Jobs flavor {name!r}; known: {', '.join(BY_NAME)}") from None


@dataclass(frozen=True)
class Work:
    """What a job needs: its memory estimate (None: unknown, no safetensors), the disk it writes, a CUDA target."""

    memory_bytes: int | None
    disk_bytes: int | None
    cuda: bool
    detail: str = ""  # how the estimate was made, for the job's record and the repo's message

    def describe(self) -> str:
        need = f"about {self.memory_bytes / GB:.1f} GB of memory" if self.memory_bytes else "an unknown memory"
        disk = f", {self.disk_bytes / GB:.1f} GB of disk" if self.disk_bytes else ""
        return f"{need}{' on a GPU' if self.cuda else ''}{disk}{f' ({self.detail})' if self.detail else ''}"


@dataclass(frozen=True)
class Choice:
    """The flavor chosen (None: none may run the job) and why; `needed`: the one it would take without the
    operator's limits (None: no flavor at all is large enough)."""

    flavor: Flavor | None
    reason: str
    needed: Flavor | None = None

    def worst_cost_usd(self, timeout_seconds: float) -> float:
        """What the job costs at most: its flavor's price for the whole of its timeout."""
        return self.flavor.usd_per_hour * timeout_seconds / 3600 if self.flavor else 0.0


def fits(work: Work, candidate: Flavor) -> bool:
    """Whether `candidate` can run `work`: a GPU flavor for a CUDA target, a CPU one otherwise, with the memory and
    the disk."""
    if bool(candidate.gpus) != work.cuda:
        return False
    disk_ok = work.disk_bytes is None or work.disk_bytes <= USABLE * candidate.disk_gb * GB
    return disk_ok and candidate.holds(work.memory_bytes, work.cuda)


def choose(work: Work, allowed: list[str] | None = None, max_flavor: str | None = None,
           max_usd_per_hour: float = 0.0) -> Choice:
    """The cheapest flavor that fits `work` among `allowed` (empty: all) under the ceiling (`max_flavor`: no dearer
    than it; `max_usd_per_hour`, 0: none)."""
    ranked = sorted(FLAVORS, key=lambda f: (f.usd_per_hour, f.memory_gb, f.name))
    needed = next((f for f in ranked if fits(work, f)), None)
    ceiling = flavor(max_flavor).usd_per_hour if max_flavor else None
    limits = []
    if allowed:
        limits.append(f"the allowed flavors ({', '.join(allowed)})")
    if ceiling is not None:
        limits.append(f"no dearer than {max_flavor} (${ceiling:.2f}/h)")
    if max_usd_per_hour:
        limits.append(f"at most ${max_usd_per_hour:.2f}/h")
    for candidate in ranked:
        if (allowed and candidate.name not in allowed) or (ceiling is not None and candidate.usd_per_hour > ceiling) \
                or (max_usd_per_hour and candidate.usd_per_hour > max_usd_per_hour):
            continue
        if fits(work, candidate):
            return Choice(candidate, f"{candidate.describe()}: the cheapest allowed flavor for {work.describe()}",
                          needed)
    kind = "GPU" if work.cuda else "CPU"
    if needed is None:
        return Choice(None, f"it needs {work.describe()}, more than any Hugging Face Jobs {kind} flavor has")
    return Choice(None, f"it needs {work.describe()}: the smallest {kind} flavor that fits is {needed.describe()}, "
                        f"outside what the bot's operator allows ({'; '.join(limits)})", needed)
