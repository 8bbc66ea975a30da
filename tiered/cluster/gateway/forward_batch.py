"""Frames queued in one turn of the event loop, written in one call: both halves of forwarding use it.

A group commit acknowledges many appends in one turn of the loop; their
answers (on the owner) and the requests behind them (on the sender) leave in
one ``write`` instead of one system call each (``forward_frames.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["TurnBatch", "write_all"]


def write_all(transport: asyncio.Transport, out: list[bytes]) -> None:
    """``out`` in one call (a large body is not copied into a joined buffer)."""
    if len(out) == 1:
        transport.write(out[0])
    else:
        transport.writelines(out)


class TurnBatch:
    """Buffers queued now go to ``write`` together, once, at the end of this turn of the loop."""

    __slots__ = ("_out", "_write")

    def __init__(self, write: Callable[[list[bytes]], None]) -> None:
        self._out: list[bytes] = []
        self._write = write

    def add(self, parts: list[bytes]) -> None:
        if not self._out:
            asyncio.get_running_loop().call_soon(self.flush)
        self._out += parts

    def flush(self) -> None:
        """Write what is queued now (also before something written directly, to keep the order)."""
        out, self._out = self._out, []
        if out:
            self._write(out)

    def clear(self) -> None:
        self._out.clear()
