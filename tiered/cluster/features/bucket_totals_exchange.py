"""Publishing and reading every shard's usage summary, so quotas hold per bucket (the shell of ``usage.py``).

Each shard's quota gate reads the other shards' usage through
``others_of(shard)``, given to its engine's constructor as the
``quota_others`` hook (``tiered/cluster/compose.py``): live for the shards
served here, as published for the rest.

One pass (``exchange``) every ``cluster_usage_interval_s``:

1. list the summaries and read the ones whose ETag changed (until the first
   complete read, writes a size quota governs are refused with a retry hint);
2. for each shard this node may acknowledge in, publish its per-bucket
   (streams, retained bytes) when they changed since its last publication
   (a compare-and-set on the object's ETag, so two holders during a handoff
   never interleave half-written bodies; a lost race is settled next pass).
3. exchange the catch-up reads this node answered from the store for
   streams other nodes own (``tiered/cluster/gateway/cold_reads.py``; their owners never see them):
   running totals per bucket in ``served/<node>.json``, continued from that
   object after a restart; ``GET /v1/admin/usage`` adds every node's totals
   (``usage.add_served``) to the read requests and cold egress.

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

from tiered.cluster.features.bucket_totals import (
    SERVED,
    USAGE,
    Served,
    ServedSummary,
    Summary,
    Totals,
    UsageBoard,
    decode_served,
    decode_summary,
    encode_served,
    encode_summary,
    node_of_served_key,
    nonzero,
    served_key,
    shard_of_usage_key,
    sum_served,
    usage_key,
)
from tiered.cluster.membership.cas import CasError, CasStore
from tiered.core.clock import Clock
from tiered.core.errors import ErrorCode, TieredError
from tiered.engine.engine import Engine

__all__ = ["UsageExchange"]

log = logging.getLogger(__name__)


class UsageExchange:
    def __init__(
        self,
        store: CasStore,
        node_id: str,
        clock: Clock,
        engines: Callable[[], Mapping[int, Engine]],
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
        # Catch-up reads this node served from the store (other nodes' streams): counted here, published
        # as running totals (``served/<node>.json``), continued from that object after a restart.
        self._served_new: dict[str, list[int]] = {}  # bucket -> [reads, egress bytes] not yet in a base
        self._served_base: dict[str, Served] | None = None  # our published totals (None: not read yet)
        self._served_sent: dict[str, Served] = {}
        self._served_others: dict[str, tuple[str, dict[str, Served]]] = {}  # node -> (etag, totals)

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

    def count_served(self, bucket: str, egress_bytes: int, request_counted: bool = False) -> None:
        """One catch-up read answered here from the store for a stream another node owns.

        ``request_counted``: its owner counted the request (it gave the locator for this very read,
        without bytes): only the bytes are counted here.
        """
        row = self._served_new.setdefault(bucket, [0, 0])
        row[0] += 0 if request_counted else 1
        row[1] += egress_bytes

    def _served_mine(self) -> dict[str, Served]:
        base = self._served_base or {}
        return sum_served([base, {b: (r[0], r[1]) for b, r in self._served_new.items()}])

    def served_totals(self) -> dict[str, Served]:
        """Every node's catch-up reads per bucket: the others' as last read, ours live."""
        return sum_served([*(totals for _, totals in self._served_others.values()), self._served_mine()])

    async def _exchange_served(self) -> None:
        """Read the other nodes' served totals; publish ours (continuing our own object after a restart).

        Only this node writes its object, so our totals in memory are the
        truth once the object was read at start: counts move into them before
        each write, and a failed write is simply repeated with the then-current
        ETag (never counted twice, never lost while the process lives).
        """
        own_etag: str | None = None
        for item in await self.store.list(SERVED):
            node = node_of_served_key(item.key)
            if node is None:
                continue
            if node == self.node_id:
                own_etag = item.etag
                if self._served_base is None:
                    got = await self.store.get(item.key)
                    summary = decode_served(got.data) if got is not None else None
                    self._served_base = dict(summary.buckets) if summary is not None else {}
                    own_etag = got.etag if got is not None else None
                continue
            known = self._served_others.get(node)
            if known is not None and known[0] == item.etag:
                continue
            got = await self.store.get(item.key)
            summary = decode_served(got.data) if got is not None else None
            if got is not None and summary is not None:
                self._served_others[node] = (got.etag, dict(summary.buckets))
        if self._served_base is None:
            self._served_base = {}  # never published: start from nothing
        mine = self._served_mine()
        self._served_base, self._served_new = mine, {}
        if mine == self._served_sent:
            return
        body = encode_served(ServedSummary(self.node_id, self.clock.now_ms(), mine, secrets.token_hex(8)))
        key = served_key(self.node_id)
        if own_etag is None:
            await self.store.put_if_absent(key, body)
        else:
            await self.store.put_if_match(key, body, own_etag)
        self._served_sent = mine

    async def exchange(self) -> None:
        """One pass: read the others' summaries, then publish ours (each goes on if the other failed)."""
        ok = True
        try:
            await self._read()
        except CasError as exc:
            ok = False
            log.info("usage summaries not read this pass: %s", exc)
        try:
            await self._exchange_served()
        except CasError as exc:
            ok = False
            log.info("catch-up read totals not exchanged this pass: %s", exc)
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
