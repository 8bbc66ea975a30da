"""Journal and apply as one step, then wait for durability: the write path every feature shares.

Each write is decide (pure) -> ``commit_nowait`` (journal append + apply, no
``await`` in between, so the event loop makes decide-journal-apply atomic) ->
``durable`` (wait for the disk) -> respond. Streams, subscriptions, groups, the
flusher and GC all write through one ``Committer``.

Observers hook the step without the committer knowing the features: stream
visibility holds what readers may see until a record is durable, and
subscriptions add follow-up records (links for a new stream, wakes after an
append) to the same batch, right after the record that caused them.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from tiered.core.errors import ErrorCode, TieredError
from tiered.engine.journal.journal import Applier, Journal, JournalFailed

RETRY_AFTER_JOURNAL_S = 5


class CommitObserver(Protocol):
    def before_apply(self, record: Any) -> object:
        """Look at the state a record is about to change; the token comes back to ``after_apply``."""
        ...

    def after_apply(self, record: Any, token: object) -> Sequence[Any]:
        """React to an applied record; returns follow-up records for the same batch."""
        ...

    def on_durable(self, record: Any) -> Callable[[], None] | None:
        """What to run once the record is durable (on the loop, in log order)."""
        ...


def journal_failed(detail: str) -> TieredError:
    return TieredError(ErrorCode.JOURNAL_FAILED, detail, retry_after_s=RETRY_AFTER_JOURNAL_S)


class Committer:
    def __init__(
        self,
        journal: Journal[Any],
        state: Applier,
        *,
        snapshot_every_bytes: int,
        observers: Sequence[CommitObserver] = (),
    ) -> None:
        self.journal = journal
        self.state = state
        self.snapshot_every_bytes = snapshot_every_bytes
        self.observers: tuple[CommitObserver, ...] = tuple(observers)  # in this order, fixed at construction
        self.snapshot_due = asyncio.Event()  # a snapshot task (owned by the node) waits on it

    def check_writable(self) -> None:
        if self.journal.failed is not None:
            raise journal_failed("the journal cannot write to disk; restart the server")

    async def admit(self) -> None:
        """Wait while the pending batch is full (backpressure), then check the journal still writes."""
        self.check_writable()
        while self.journal.backlogged:
            await self.journal.flushed()
            self.check_writable()

    def admitted(self) -> bool:
        """``admit`` without waiting: True when it would return at once (raises as it would), False when
        the caller must ``await admit()`` (the pending batch is full). The append path asks this first, so
        the usual append does not step through one more coroutine."""
        journal = self.journal
        if journal.failed is not None:
            self.check_writable()  # raises
        return not journal.backlogged

    def commit_nowait(self, records: Sequence[Any]) -> asyncio.Future[None] | None:
        """Journal and apply records; returns the durability future of the last (no await here)."""
        future = None
        observers = self.observers
        for record in records:
            # Plain loops, not comprehensions: each of those is a function call of its own (this runs
            # for every record of every append).
            tokens: list[object] = []
            for o in observers:
                tokens.append(o.before_apply(record))
            callbacks: list[Callable[[], None]] = []
            for o in observers:
                cb = o.on_durable(record)
                if cb is not None:
                    callbacks.append(cb)
            try:
                future, location = self.journal.append(record, _chain(callbacks))
            except JournalFailed as exc:
                raise journal_failed(str(exc)) from None
            self.state.apply(record, location)
            for observer, token in zip(observers, tokens, strict=True):
                follow_ups = observer.after_apply(record, token)
                if follow_ups:
                    future = self.commit_nowait(follow_ups)
        if self.journal.bytes_since_snapshot >= self.snapshot_every_bytes:
            self.snapshot_due.set()
        return future

    async def durable(self, future: asyncio.Future[None] | None) -> None:
        """Wait until a committed batch is on disk (a failed disk is JOURNAL_FAILED, never a silent success)."""
        if future is None:
            return
        if not future.done():
            # What ``asyncio.shield`` does, at a third of its cost per append: the batch's future is
            # shared, so a cancelled request (its client left) cancels its own waiter, never the batch.
            waiter = future.get_loop().create_future()
            future.add_done_callback(functools.partial(_wake, waiter))
            await waiter
        try:
            future.result()
        except JournalFailed as exc:
            raise journal_failed(f"write not durable: {exc}") from None

    def durable_wait(self, future: asyncio.Future[None] | None) -> Awaitable[None]:
        """``durable(future)`` as an awaitable that is no coroutine: the request's own waiter, woken by the
        batch with its outcome (``JOURNAL_FAILED`` for a failed disk, as ``durable`` raises it). The
        append path awaits it directly: one coroutine fewer per append, and the same cancellation
        semantics (a cancelled request cancels its waiter, never the batch)."""
        if future is None or future.done():
            return self.durable(future)
        waiter: asyncio.Future[None] = future.get_loop().create_future()
        future.add_done_callback(functools.partial(_settle, waiter))
        return waiter

    async def commit(self, records: Sequence[Any]) -> None:
        """Journal, apply and wait for durability (the entry point of background jobs)."""
        if not records:
            return
        self.check_writable()
        await self.durable(self.commit_nowait(records))

    async def settled(self) -> None:
        """Wait until everything applied so far is durable.

        Answers that rest on state still on its way to disk ("stream is closed"
        while the close is in flight, an identical create, a duplicate append)
        wait for this first: answering before could tell a client something a
        crash then takes back.
        """
        try:
            await self.journal.flushed()
        except JournalFailed as exc:
            raise journal_failed(f"write not durable: {exc}") from None


def _wake(waiter: asyncio.Future[None], _batch: asyncio.Future[None]) -> None:
    if not waiter.done():  # cancelled: its request is gone
        waiter.set_result(None)


def _settle(waiter: asyncio.Future[None], batch: asyncio.Future[None]) -> None:
    """Hand a batch's outcome to one request's waiter (``durable_wait``)."""
    if waiter.done():  # cancelled: its request is gone
        return
    if batch.cancelled():
        waiter.cancel()
        return
    exc = batch.exception()
    if exc is None:
        waiter.set_result(None)
    elif isinstance(exc, JournalFailed):
        waiter.set_exception(journal_failed(f"write not durable: {exc}"))
    else:
        waiter.set_exception(exc)


def _chain(callbacks: list[Callable[[], None]]) -> Callable[[], None] | None:
    if not callbacks:
        return None
    if len(callbacks) == 1:
        return callbacks[0]

    def run_all() -> None:
        for cb in callbacks:
            cb()

    return run_all
