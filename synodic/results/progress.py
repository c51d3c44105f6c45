"""Progress of a job longer than a few seconds: a rich bar on a terminal, log lines otherwise.

    with progress("eval", total=40, unit="batches") as advance:
        for ...:
            advance()          # or advance(3, note="blocks.7")

On a terminal (stderr is a tty) the bar redraws in place; elsewhere (CI, a pipe, Ray, nohup) the same
progress goes to `logging` at most every `every_s` seconds, so Hydra's run.log and a redirected log
both show how far a job got. The start and the end are logged either way.
"""
from __future__ import annotations

import logging
import sys
import time
from contextlib import contextmanager

log = logging.getLogger("synodic.progress")


def on_terminal() -> bool:
    return sys.stderr.isatty()


@contextmanager
def progress(description: str, total: int | None, unit: str = "steps", *, done: int = 0, every_s: float = 10.0,
             enabled: bool = True, logger: logging.Logger | None = None):
    """Yields `advance(n=1, note=None)`. enabled=False: nothing shown or logged (tests, nested jobs)."""
    lg = logger or log
    state = {"n": done, "last": time.perf_counter(), "note": None}
    t0 = time.perf_counter()
    if not enabled:
        yield lambda n=1, note=None: None
        return
    lg.info("%s: started, %s %s", description, "?" if total is None else total, unit)
    bar = task = None
    if on_terminal():
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        bar = Progress(TextColumn(f"{description} {{task.description}}"), BarColumn(), MofNCompleteColumn(),
                       TextColumn(unit), TimeElapsedColumn(), TimeRemainingColumn(), console=Console(stderr=True))
        task = bar.add_task("", total=total, completed=done)
        bar.start()

    def line(final: bool = False) -> str:
        el = time.perf_counter() - t0
        n = state["n"]
        of = "" if total is None else f"/{total} ({100 * n / max(total, 1):.0f}%)"
        left = ""
        if total and n > done and not final:
            left = f", ~{el / (n - done) * (total - n):.0f}s left"
        note = f" [{state['note']}]" if state["note"] else ""
        return f"{description}: {n}{of} {unit}, {el:.1f}s elapsed{left}{note}"

    def advance(n: int = 1, note: str | None = None) -> None:
        state["n"] += n
        state["note"] = note
        if bar is not None:
            bar.update(task, advance=n, description=note or "")
            return
        now = time.perf_counter()
        if now - state["last"] >= every_s:
            state["last"] = now
            lg.info(line())

    try:
        yield advance
    finally:
        if bar is not None:
            bar.stop()
        lg.info("%s (done)", line(final=True))
