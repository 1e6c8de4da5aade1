"""A progress bar on stderr for long runs (rich's, which typer installs); silent when stderr
is not a terminal."""

from __future__ import annotations

import sys
from typing import Callable


def stderr_progress(label: str) -> Callable[[int, int], None]:
    """``show(i, n)``: ``i`` of ``n`` requests handed to the scheduler; the bar closes at n
    (rich is imported only for a terminal)."""
    if not sys.stderr.isatty():
        return lambda i, n: None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    bar = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   transient=False)
    task: list[int] = []

    def show(i: int, n: int) -> None:
        if not task:
            bar.start()
            task.append(bar.add_task(label, total=n))
        bar.update(task[0], completed=i)
        if i >= n:
            bar.stop()
    return show
