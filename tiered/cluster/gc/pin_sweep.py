"""Deleting cross-shard fork pins whose fork is gone (``tiered/cluster/features/xfork.py``): a pin must not outlive its fork.

A pin is left behind when the fork's node crashed between the pin and the
fork's create, when a release failed (the source's owner unreachable at that
moment), or when the fork expired or its bucket was erased. Left alone, it
keeps the source's data and turns a delete of the source into a soft delete.

``PinSweep`` is a GC task of each shard's engine (``tiered/gc/runner.py``, a
hook of the engine: ``tiered/cluster/compose.py``): every
``cluster_fork_pin_sweep_s`` (its own period) it looks at the pins in its shard
that are older than ``cluster_fork_pin_grace_s`` (far longer than a
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

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from tiered.api.kit.types import Request, Response
from tiered.cluster.features.xfork import PIN_PREFIX, pinned_fork, stream_url
from tiered.cluster.gateway.subrequest import Sign, system_request
from tiered.core.errors import TieredError
from tiered.gc.context import GcContext, GcPass

__all__ = ["PinSweep"]

log = logging.getLogger(__name__)

MAX_PER_PASS = 256  # pins looked at per shard and pass, at most

Send = Callable[[Request, int], Awaitable[Response]]


class SweepSettings(Protocol):
    cluster_fork_pin_grace_s: float
    cluster_fork_pin_sweep_s: float


class PinSweep:
    """The GC task of one shard's engine that deletes the pins in it whose fork is gone."""

    name = "fork_pins"

    def __init__(
        self,
        shard: int,
        shard_of: Callable[[str, str], int],
        settings: SweepSettings,
        send: Send,
        sign: Sign | None,
    ) -> None:
        self.shard = shard
        self.shard_of = shard_of
        self.grace_ms = int(settings.cluster_fork_pin_grace_s * 1000)
        self.every_s = settings.cluster_fork_pin_sweep_s
        self.send = send  # shard routing's (``ShardRouter.send``)
        self.sign = sign  # this node's signature (``tiered/cluster/membership/secret.py``)
        self.swept = 0

    async def run(self, ctx: GcContext, gc_pass: GcPass) -> None:
        if not gc_pass.dry_run:
            await self.sweep_once(ctx)

    async def sweep_once(self, ctx: GcContext) -> int:
        """One pass over the shard's pins; how many it deleted."""
        state, now = ctx.state, ctx.clock.now_ms()
        pins: list[tuple[str, str]] = []
        for (bucket, path), uid in state.paths.items():
            if not path.startswith(PIN_PREFIX):
                continue
            s = state.streams.get(uid)
            if s is not None and not s.soft_deleted and now - s.created_ms >= self.grace_ms:
                pins.append((bucket, path))
            if len(pins) >= MAX_PER_PASS:
                break
        deleted = 0
        for bucket, pin in pins:
            if await self._orphan(pin) and await self._delete(bucket, pin):
                deleted += 1
        self.swept += deleted
        return deleted

    async def _orphan(self, pin: str) -> bool:
        fork = pinned_fork(pin)
        if fork is None:
            return False
        try:
            found = await self.send(
                system_request(self.sign, "HEAD", stream_url(*fork), {}), self.shard_of(*fork)
            )
        except TieredError:
            return False
        return found.status == 404

    async def _delete(self, bucket: str, pin: str) -> bool:
        try:
            gone = await self.send(
                system_request(self.sign, "DELETE", stream_url(bucket, pin), {}), self.shard
            )
        except TieredError:
            return False
        if gone.status in (204, 404):
            log.info("deleted the fork pin %s/%s: its fork is gone", bucket, pin)
            return True
        return False
