"""Progress bars and status lines for the CLI (rich), quiet when not on a terminal."""
from __future__ import annotations

import contextlib
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

console = Console(stderr=True)


@contextlib.contextmanager
def step(label: str):
    """Show a spinner-like bar for one step; yields a ``progress(done, total)`` callback."""
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=False,
                  disable=not console.is_terminal) as prog:
        task = prog.add_task(label, total=None)
        t0 = time.perf_counter()

        def cb(done, total):
            prog.update(task, completed=done, total=total)

        yield cb
        prog.update(task, total=1, completed=1)
    if not console.is_terminal:
        console.print(f"{label}: done in {time.perf_counter() - t0:.1f} s")
