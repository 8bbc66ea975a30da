"""The imperative shell of consumer groups: journal, long-poll waiters, sweeper.

Like ``StreamService``: decide (pure, ``tiered.groups``) -> journal + apply
(``StreamService.commit_records``, with no ``await`` in between, so the event
loop makes it atomic) -> wait for durability -> respond. Views are built
*before* waiting for the journal to flush, so a response never shows a
cursor or plan that a crash could take back.

A sweeper journals what nobody asked for: member expiry, and plans that follow
streams appearing or disappearing (``GroupsState.decide_sweep``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from .groups import GroupError, GroupsState
from .journal import JournalFailed
from .service import StreamService, now_ms
from .state import StreamError

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 0.5
MAX_WAIT_MS = 10_000


class GroupCoordinator:
    def __init__(self, service: StreamService, sweep_interval_s: float = SWEEP_INTERVAL_S) -> None:
        self.service = service
        self.sweep_interval_s = sweep_interval_s
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._task: asyncio.Task[None] | None = None

    @property
    def core(self) -> GroupsState:
        ext = self.service.state.extensions["groups"]
        assert isinstance(ext, GroupsState)
        return ext

    # ------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self.core.grant_grace(now_ms())
        if self._task is None:
            self._task = asyncio.create_task(self._sweep_loop(), name="group-sweeper")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None
        for name in list(self._waiters):
            self._notify(name)

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_interval_s)
            try:
                await self.sweep()
            except StreamError as exc:
                log.warning("group sweep not journaled: %s", exc.message)
            except Exception:
                log.exception("group sweep failed")

    async def sweep(self) -> int:
        """Journal expirations and stream-set changes; returns how many plans."""
        if self.service.journal.failed is not None:
            return 0
        records = self.core.decide_sweep(self.service.state, now_ms())
        await self.commit(records)
        return len(records)

    # ------------------------------------------------------------- writes

    async def commit(self, records: Sequence[Any]) -> None:
        """Journal and apply decided records (call with no await since deciding)."""
        if not records:
            return
        try:
            await self.service.commit_records(list(records))
        except StreamError as exc:
            raise GroupError(exc.status, "UNAVAILABLE", exc.message) from None
        for name in {r.name for r in records}:
            self._notify(name)

    async def settled(self) -> None:
        """Wait until everything applied so far is durable."""
        try:
            await self.service.journal.flushed()
        except JournalFailed as exc:
            raise GroupError(503, "UNAVAILABLE", f"write not durable: {exc}") from None

    # ------------------------------------------------------------- long-poll

    def _notify(self, name: str) -> None:
        for fut in self._waiters.pop(name, []):
            if not fut.done():
                fut.set_result(None)

    async def wait_for_change(self, name: str, incarnation: int, revision: int, timeout_s: float) -> None:
        """Park until the group's plan moves past ``revision`` (or it goes), or the timeout."""
        deadline = time.monotonic() + timeout_s
        loop = asyncio.get_running_loop()
        while not self.service.closing:
            g = self.core.groups.get(name)
            if g is None or g.incarnation != incarnation or g.revision != revision:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.setdefault(name, []).append(fut)
            try:
                # Short slices: a shutdown releases parked heartbeats promptly.
                async with asyncio.timeout(min(remaining, 0.5)):
                    await fut
            except TimeoutError:
                pass
            finally:
                futs = self._waiters.get(name)
                if futs is not None and fut in futs:
                    futs.remove(fut)
                    if not futs:
                        del self._waiters[name]
