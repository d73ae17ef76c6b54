"""A live progress line per running target (stage and elapsed time), on stderr; silent when disabled.

Example:
    >>> with Progress(enabled=False) as progress:
    ...     progress.update("onnx", "exporting")
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import Progress as RichProgress
from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn


class Progress:
    """A rich progress line per target; every running export shows at once."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._progress: Any = None
        self._tasks: dict[str, Any] = {}

    def __enter__(self) -> Progress:
        if self.enabled:

            self._progress = RichProgress(
                SpinnerColumn(), TextColumn("[bold]{task.fields[target]}"), TextColumn("{task.description}"),
                TimeElapsedColumn(), console=Console(stderr=True), transient=False,
            )
            self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)

    def update(self, target: str, stage: str, done: bool = False) -> None:
        """Show `stage` for `target` (`done`: the line stops its spinner)."""
        if self._progress is None:
            return
        if target not in self._tasks:
            self._tasks[target] = self._progress.add_task(stage, target=target, total=1)
        self._progress.update(self._tasks[target], description=stage, completed=1 if done else 0)
