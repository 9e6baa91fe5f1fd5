"""Console output for the CLI (rich): progress bars and status lines, quiet when not on a
terminal, and the click group that turns a :class:`PestoError` into a message."""
from __future__ import annotations

import contextlib
import sys
import time

import click

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..errors import PestoError

console = Console(stderr=True)


class ErrorGroup(click.Group):
    """A click group whose commands print a :class:`PestoError` as one line and exit with 2."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except PestoError as e:
            console.print(f"[bold red]error:[/] {escape(str(e))}")  # a message's [brackets] are text, not markup
            sys.exit(2)


@contextlib.contextmanager
def step(label: str):
    """Show a spinner-like bar for one step; yields a ``progress(done, total, label=None)``
    callback (``label`` replaces the bar's description, e.g. the item being worked on)."""
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=False,
                  disable=not console.is_terminal) as prog:
        task = prog.add_task(label, total=None)
        t0 = time.perf_counter()

        def cb(done, total, label=None):
            prog.update(task, completed=done, total=total, **({"description": label} if label else {}))

        yield cb
        prog.update(task, total=1, completed=1)
    if not console.is_terminal:
        console.print(f"{label}: done in {time.perf_counter() - t0:.1f} s")
