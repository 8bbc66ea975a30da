"""Consumer groups over streams of every shard: the other shards' streams, as the group coordinator sees them.

A group lives in the shard of ``(default, "__groups/<name>")``; its streams
may be in any shard. The coordinator's decisions (``tiered/engine/groups/state.py``)
read four things of the streams: which buckets exist, which ``(bucket, path)``
names a live stream (and its uid), each stream's tail, and its retained offset
(a cursor behind it moves there, reported as skipped). In cluster mode
the group's engine decides on a **view**: its own shard's streams plus the
live streams of the group's bucket in every other shard, as their engines
list them (``listing``), each under a cluster-wide uid
``(shard + 1) << 40 | uid`` (a shard's own uids stay below 2^40, so its
streams keep their uids and no two shards' streams share one). The decision
and its journal records are then exactly a single server's: only the view is
built differently.

A view is refreshed before a decision when it is older than ``MAX_AGE_S``, and
always before one that checks commits against tails (a member commits what it
just read, from the stream's owner). A shard that cannot be asked (no
owner, the owner unreachable) makes the decision wait: 503 ``UNAVAILABLE``
with a retry hint, never a plan on partial knowledge (which would drop the
cursors of the streams it could not see).

Members read and long-poll their streams through any node, forwarded to
each stream's owner like any client (``tiered/cluster/gateway/shard_router.py``).
The other shards answer through the node route
``GET /v1/cluster/shards/{shard}/streams?bucket=B`` (signed by the asking node with the cluster secret: ``tiered/cluster/membership/secret.py``).
"""

from __future__ import annotations

import asyncio
from collections import ChainMap
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from tiered.core.clock import Clock
from tiered.core.errors import ErrorCode, TieredError
from tiered.engine.streams.model import Stream
from tiered.engine.streams.state import StreamState

if TYPE_CHECKING:
    from tiered.engine.engine import Engine

__all__ = [
    "MAX_AGE_S",
    "ClusterStreams",
    "Listing",
    "ShardDirectory",
    "global_uid",
    "listing",
    "remote_stream",
]

MAX_AGE_S = 0.5
_UID_BITS = 40

#: One shard's live streams of one bucket: (path, uid in that shard, visible tail, retained offset).
Listing = list[tuple[str, int, int, int]]


def global_uid(shard: int, uid: int) -> int:
    """A uid no stream of any other shard has (the group's own shard keeps its uids: they are below 2^40)."""
    if uid >= 1 << _UID_BITS:
        raise TieredError(ErrorCode.UNAVAILABLE, f"stream uid {uid} of shard {shard} is out of range")
    return ((shard + 1) << _UID_BITS) | uid


def listing(state: StreamState, tail: Callable[[Stream], int], bucket: str, now_ms: int) -> Listing:
    """The live streams of ``bucket`` in one engine (what a client can read), sorted by path."""
    out = []
    for (b, path), uid in state.paths.items():
        if b != bucket:
            continue
        s = state.streams.get(uid)
        if s is None or s.soft_deleted or s.expired(now_ms):
            continue
        out.append((path, uid, tail(s), s.retained_from))
    return sorted(out)


def remote_stream(shard: int, bucket: str, path: str, uid: int, tail: int, retained: int = 0) -> Stream:
    """A stand-in for a stream of another shard: what the group coordinator reads of it (name, uid, tail, retained).

    Its creation time is unknown (0): a stream of another shard new to a group
    starts at its retained offset as the group first sees it.
    """
    s = Stream(global_uid(shard, uid), bucket, path, "", None, None, None, 0, None, 0, None, tail)
    s.retained_from = retained
    return s


class ClusterStreams:
    """The streams a group's decisions see: this shard's, and the other shards' of the listed buckets.

    It has what ``GroupsState`` and the group views read of a ``StreamState``
    (``buckets``, ``paths``, ``streams``), nothing else.
    """

    def __init__(self, local: StreamState, remote: Mapping[int, Mapping[str, Listing]]) -> None:
        self.buckets = local.buckets
        paths: dict[tuple[str, str], int] = {}
        streams: dict[int, Stream] = {}
        for shard, by_bucket in remote.items():
            for bucket, rows in by_bucket.items():
                for path, uid, tail, retained in rows:
                    s = remote_stream(shard, bucket, path, uid, tail, retained)
                    paths[(bucket, path)] = s.uid
                    streams[s.uid] = s
        self.paths: ChainMap[tuple[str, str], int] = ChainMap(local.paths, paths)
        self.streams: ChainMap[int, Stream] = ChainMap(local.streams, streams)

    def as_state(self) -> StreamState:
        return cast(StreamState, self)


@dataclass
class _Cached:
    at: float
    rows: dict[int, Listing]


class ShardDirectory:
    """The other shards' streams, for one shard's group coordinator (its ``GroupService.directory``).

    ``ask(shard, bucket)`` lists one other shard's streams (served here: its
    engine; elsewhere: a request to its owner).
    """

    def __init__(
        self,
        shard: int,
        shard_count: Callable[[], int],
        ask: Callable[[int, str], Awaitable[Listing]],
        clock: Clock,
        *,
        max_age_s: float = MAX_AGE_S,
    ) -> None:
        self.shard = shard
        self.shard_count = shard_count
        self.ask = ask
        self.clock = clock
        self.max_age_s = max_age_s
        self._cache: dict[str, _Cached] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.refreshes = 0

    async def view(self, local: StreamState, buckets: Iterable[str], *, fresh: bool) -> StreamState:
        """The streams of ``buckets`` in every shard (this one's live), refreshed when old or ``fresh``."""
        remote: dict[int, dict[str, Listing]] = {}
        for bucket in sorted(set(buckets)):
            rows = await self._rows(bucket, fresh=fresh)
            for shard, listed in rows.items():
                remote.setdefault(shard, {})[bucket] = listed
        return ClusterStreams(local, remote).as_state()

    async def _rows(self, bucket: str, *, fresh: bool) -> dict[int, Listing]:
        asked_at = self.clock.monotonic()
        lock = self._locks.setdefault(bucket, asyncio.Lock())
        async with lock:
            cached = self._cache.get(bucket)
            if cached is not None and (
                cached.at >= asked_at or (not fresh and self.clock.monotonic() - cached.at < self.max_age_s)
            ):
                return cached.rows  # fresh enough, or refreshed by a concurrent caller since we asked
            started = self.clock.monotonic()
            others = [s for s in range(self.shard_count()) if s != self.shard]
            got = await asyncio.gather(*(self.ask(s, bucket) for s in others), return_exceptions=True)
            for outcome in got:
                if isinstance(outcome, BaseException):
                    if isinstance(outcome, TieredError):
                        raise TieredError(
                            ErrorCode.UNAVAILABLE,
                            f"the streams of another shard could not be listed ({outcome.message}); retry",
                            retry_after_s=1,
                        ) from outcome
                    raise outcome
            rows = {
                s: list(listed) for s, listed in zip(others, got, strict=True) if isinstance(listed, list)
            }
            self._cache[bucket] = _Cached(started, rows)
            self.refreshes += 1
            return rows


def engine_listing(engine: Engine, bucket: str) -> Listing:
    """One served engine's live streams of ``bucket``, their tails as readers see them."""
    return listing(engine.state, lambda s: engine.visibility.view(s).tail, bucket, engine.clock.now_ms())
