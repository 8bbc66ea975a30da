"""The small interfaces background jobs depend on, instead of the service that implements them.

``tiered.cold`` (the flusher) and ``tiered.gc`` (the GC tasks) are handed
these by the node; they never import the streams service, so there is no
import cycle and each can be tested with fakes. Likewise the stream reader
reports to a ``StoreHealth`` without importing the job that probes the store.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol


class Committer(Protocol):
    async def commit(self, records: Sequence[Any]) -> None:
        """Journal and apply ``records``, and wait until they are durable."""
        ...


class HotReader(Protocol):
    def read(self, seg: int, pos: int, length: int) -> bytes:
        """Bytes of a hot record, or of a run of written records, checksum-checked (blocking; callable from a
        worker thread)."""
        ...


class SegmentReaper(Protocol):
    async def delete_unreferenced(self) -> int:
        """Delete sealed hot segments nothing reads and replay does not need; returns how many."""
        ...


class StoreHealth(Protocol):
    """Where the shells that call the object store report whether it answered (``tiered.engine.jobs.health``)."""

    def ok(self) -> None:
        """A call was answered."""
        ...

    def failed(self, error: str, *, stalled: bool = False) -> None:
        """A call failed; ``stalled``: it got no answer before its deadline."""
        ...


class PrefixOwner(Protocol):
    async def still_held(self, *, force: bool = False) -> bool:
        """Whether this data dir still owns the object-store prefix (nothing is written or deleted otherwise)."""
        ...


class LatencyRecorder(Protocol):
    """Where a shell reports how long something took: a histogram (``tiered.engine.engine_metrics``).

    ``observe(seconds)`` records one duration the shell measured on its clock;
    ``with recorder.time(): ...`` measures the block itself, whatever its
    outcome (for shells without a clock, such as the journal's writer thread).
    """

    def observe(self, amount: float) -> None: ...

    def time(self) -> AbstractContextManager[Any]: ...


class NotRecorded:
    """A ``LatencyRecorder`` that records nothing: the default where no node's metrics are wired in."""

    def observe(self, amount: float) -> None:
        pass

    def time(self) -> AbstractContextManager[Any]:
        return nullcontext()


NOT_RECORDED = NotRecorded()
