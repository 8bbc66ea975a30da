"""Deleting cross-shard fork pins whose fork is gone (``tiered/cluster/features/xfork.py``): a pin must not outlive its fork.

A pin is left behind when the fork's node crashed between the pin and the
fork's create, when a release failed (the source's owner unreachable at that
moment), or when the fork expired or its bucket was erased. Left alone, it
keeps the source's data and turns a delete of the source into a soft delete.

Each node, every ``cluster_fork_pin_sweep_s``, looks at the pins in the shards
it serves that are older than ``cluster_fork_pin_grace_s`` (far longer than a
fork's creation takes, so a pin whose fork is still being created is never
taken for an orphan), reads the fork's address back from the pin's name,
asks for the fork (``HEAD`` through shard routing) and deletes the pin when
the answer is 404. Anything else (the fork is there, its shard has no owner
right now, an error) keeps the pin for a later pass. A 404 must mean "no such
stream", not "you may not know": the ``HEAD`` and the ``DELETE`` are this
node's signed *system* calls (``subrequest.system_request``), which the
engines authorize as the operator on stream routes, with authentication on
or off and with no admin token. (An unsigned call, before this node read the
cluster secret, is answered 401 with authentication on: nothing is deleted.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from tiered.api.kit.types import Request, Response
from tiered.cluster.features.xfork import PIN_PREFIX, pinned_fork, stream_url
from tiered.cluster.gateway.subrequest import Sign, system_request
from tiered.core.errors import TieredError
from tiered.engine.node import Node

__all__ = ["PinSweeper"]

log = logging.getLogger(__name__)

MAX_PER_PASS = 256  # pins looked at per shard and pass, at most

Send = Callable[[Request, int], Awaitable[Response]]


class SweepSettings(Protocol):
    cluster_fork_pin_grace_s: float
    cluster_fork_pin_sweep_s: float


class PinSweeper:
    def __init__(
        self,
        engines: Callable[[], dict[int, Node]],
        shard_of: Callable[[str, str], int],
        settings: SweepSettings,
    ) -> None:
        self.engines = engines
        self.shard_of = shard_of
        self.settings = settings
        self.send: Send | None = None
        self.sign: Sign | None = (
            None  # set by shard routing: this node's signature (``tiered/cluster/membership/secret.py``)
        )
        self.swept = 0

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), self.settings.cluster_fork_pin_sweep_s)
            except TimeoutError:
                pass
            if stop.is_set():
                return
            try:
                await self.sweep_once()
            except Exception:
                log.exception("sweeping fork pins failed; the next pass tries again")

    async def sweep_once(self) -> int:
        """One pass over the shards served here; how many pins it deleted."""
        if self.send is None:
            return 0
        deleted = 0
        grace_ms = int(self.settings.cluster_fork_pin_grace_s * 1000)
        for shard, engine in list(self.engines().items()):
            state, now = engine.state, engine.clock.now_ms()
            pins: list[tuple[str, str]] = []
            for (bucket, path), uid in state.paths.items():
                if not path.startswith(PIN_PREFIX):
                    continue
                s = state.streams.get(uid)
                if s is not None and not s.soft_deleted and now - s.created_ms >= grace_ms:
                    pins.append((bucket, path))
                if len(pins) >= MAX_PER_PASS:
                    break
            for bucket, pin in pins:
                if await self._orphan(pin) and await self._delete(shard, bucket, pin):
                    deleted += 1
        self.swept += deleted
        return deleted

    async def _orphan(self, pin: str) -> bool:
        fork = pinned_fork(pin)
        if fork is None or self.send is None:
            return False
        try:
            found = await self.send(
                system_request(self.sign, "HEAD", stream_url(*fork), {}), self.shard_of(*fork)
            )
        except TieredError:
            return False
        return found.status == 404

    async def _delete(self, shard: int, bucket: str, pin: str) -> bool:
        assert self.send is not None
        try:
            gone = await self.send(system_request(self.sign, "DELETE", stream_url(bucket, pin), {}), shard)
        except TieredError:
            return False
        if gone.status in (204, 404):
            log.info("deleted the fork pin %s/%s: its fork is gone", bucket, pin)
            return True
        return False
