"""Ctrl-C while Rust runs: egglog's calls hold the interpreter, so Python's SIGINT handler (and
with it KeyboardInterrupt) waits until the call returns, which took ~11 s on a long saturation.

A process whose SIGINT handler ends the process anyway (the `eqsat` command line installs one,
marked `ends_process`) lets the operating system's default action take over while a long native
call runs, so Ctrl-C stops it at once. Library users keep their handler and KeyboardInterrupt.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

ENDS_PROCESS = "ends_process"


def ending_handler(command: str) -> Callable[[int, FrameType | None], None]:
    """A SIGINT handler for a command line: one line on stderr, then KeyboardInterrupt (exit 130)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        print(f"eqsat {command}: interrupted", file=sys.stderr, flush=True)
        raise KeyboardInterrupt

    setattr(handler, ENDS_PROCESS, True)
    return handler


@contextmanager
def native_call_interruptible() -> Iterator[None]:
    """Around a long native call: if the SIGINT handler ends the process anyway, let Ctrl-C end
    it at once (exit status 130 from the shell) instead of after the call returns."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    current = signal.getsignal(signal.SIGINT)
    if not getattr(current, ENDS_PROCESS, False):
        yield
        return
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, current)
