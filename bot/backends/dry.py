"""The `dry` backend: run nothing, succeed at once (for benchmarks and intake smoke tests)."""

from __future__ import annotations

from ..settings import BotSettings
from . import JobContext, Outcome


class DryBackend:
    """Marks every job succeeded without reading the Hub or exporting anything.

    Example:
        >>> DryBackend(BotSettings()).needs_hub_check
        False
    """

    name = "dry"
    needs_hub_check = False

    def __init__(self, settings: BotSettings) -> None:
        self.settings = settings

    def run(self, ctx: JobContext) -> Outcome:
        return Outcome("succeeded", "dry run: nothing exported", operation="none")
