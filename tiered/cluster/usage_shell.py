"""Publishing and reading every shard's usage summary, so quotas hold per bucket (the shell of ``usage.py``).

One pass (``exchange``) every ``cluster_usage_interval_s``:

1. hand every served shard's quota gate its "others" input (the other
   shards' usage: live for the shards served here, published for the rest;
   ``ClusterEngine`` already did at the engine's start);
2. list the summaries and read the ones whose ETag changed (until the first
   complete read, writes a size quota governs are refused with a retry hint);
3. for each shard this node may acknowledge in, publish its per-bucket
   (streams, retained bytes) when they changed since its last publication
   (a compare-and-set on the object's ETag, so two holders during a handoff
   never interleave half-written bodies; a lost race is settled next pass).

A pass cut short by the store is followed by the next; the figures it would
have moved stay as they were (stale by one more interval: the overshoot
bound in ``usage.py`` counts in intervals). ``rounds`` counts completed passes
(``/readyz`` shows it) so a test can wait for a full exchange instead of a
duration.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Mapping

from tiered.clock import Clock
from tiered.errors import ErrorCode, TieredError
from tiered.node import Node

from .cas import CasError, CasStore
from .usage import (
    USAGE,
    Summary,
    Totals,
    UsageBoard,
    decode_summary,
    encode_summary,
    nonzero,
    shard_of_usage_key,
    usage_key,
)

__all__ = ["UsageExchange"]

log = logging.getLogger(__name__)


class UsageExchange:
    def __init__(
        self,
        store: CasStore,
        node_id: str,
        clock: Clock,
        engines: Callable[[], Mapping[int, Node]],
        may_publish: Callable[[int], bool],
        *,
        interval_s: float,
    ) -> None:
        self.store = store
        self.node_id = node_id
        self.clock = clock
        self.engines = engines
        self.may_publish = may_publish
        self.interval_s = interval_s
        self.board = UsageBoard()
        self.rounds = 0
        self.published = 0  # summaries written
        self.errors = 0  # passes cut short by the store
        self.read_once = False  # every summary was read at least once (until then: no size decisions)
        self._mine: dict[int, tuple[str, dict[str, tuple[int, int]]]] = {}  # shard -> (etag, buckets)
        self._seen: dict[int, str] = {}  # shard -> etag of the summary read
        self._attached: dict[int, Node] = {}

    def live(self) -> dict[int, Callable[[str], Totals]]:
        return {shard: engine.footprint.totals for shard, engine in self.engines().items()}

    def others_of(self, shard: int) -> Callable[[str], Totals]:
        """The "others' usage" input of ``shard``'s quota gate.

        Until the summaries were read once (just after start) the others are
        unknown: a write a size quota governs is refused with a retry hint
        rather than admitted as if the bucket held nothing elsewhere.
        """

        def others(bucket: str) -> Totals:
            if not self.read_once:
                raise TieredError(
                    ErrorCode.UNAVAILABLE,
                    "this node has not read the other shards' usage yet; retry",
                    retry_after_s=1,
                )
            return self.board.others(bucket, shard, self.live())

        return others

    def attach_engine(self, shard: int, engine: Node) -> None:
        """Give one shard's gate its view of the other shards (at its engine's start, before it serves)."""
        if self._attached.get(shard) is not engine:
            engine.gate.others = self.others_of(shard)
            self._attached[shard] = engine

    def attach(self) -> None:
        """Give every served shard's gate its view of the other shards (idempotent)."""
        for shard, engine in self.engines().items():
            self.attach_engine(shard, engine)

    async def exchange(self) -> None:
        """One pass: read the others' summaries, then publish ours (each goes on if the other failed)."""
        self.attach()
        ok = True
        try:
            await self._read()
        except CasError as exc:
            ok = False
            log.info("usage summaries not read this pass: %s", exc)
        for shard, engine in sorted(self.engines().items()):
            if not self.may_publish(shard):
                continue
            try:
                await self._publish(shard, nonzero(engine.footprint.all_totals()))
            except CasError as exc:
                ok = False
                log.info("shard %d's usage not published this pass: %s", shard, exc)
        if ok:
            self.rounds += 1
        else:
            self.errors += 1

    async def _publish(self, shard: int, buckets: dict[str, tuple[int, int]]) -> None:
        known = self._mine.get(shard)
        if known is not None and known[1] == buckets:
            return
        body = encode_summary(
            Summary(shard, self.node_id, self.clock.now_ms(), secrets.token_hex(8), buckets)
        )
        key = usage_key(shard)
        etag = known[0] if known is not None else None
        if etag is None:
            current = await self.store.get(key)
            etag = current.etag if current is not None else None
        try:
            if etag is None:
                new = await self.store.put_if_absent(key, body)
            else:
                new = await self.store.put_if_match(key, body, etag)
        except CasError:
            self._mine.pop(shard, None)  # someone else wrote it (a handoff): read it again next pass
            raise
        self._mine[shard] = (new, buckets)
        self.published += 1

    async def _read(self) -> None:
        for item in await self.store.list(USAGE):
            shard = shard_of_usage_key(item.key)
            if shard is None or self._seen.get(shard) == item.etag:
                continue
            got = await self.store.get(item.key)
            if got is None:
                continue
            summary = decode_summary(got.data)
            if summary is None or summary.shard != shard:
                log.warning("ignoring a malformed usage summary at %s", item.key)
            else:
                self.board.apply(summary)
            self._seen[shard] = got.etag
        self.read_once = True

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.exchange()
            except Exception:
                log.exception("usage exchange failed")
            try:
                async with asyncio.timeout(self.interval_s):
                    await stop.wait()
            except TimeoutError:
                pass
