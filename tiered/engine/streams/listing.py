"""Listing a bucket's streams: one page in path order, after a cursor, within the caller's prefixes (pure).

``GET /v1/buckets/{bucket}/streams?prefix=&after=&limit=`` (and ``GET
/v1/stream?...`` for the default bucket) pages through a bucket's live
streams in the byte order of their paths. The cursor is the last path of the
previous page (``after``, S2's ``start_after``): it names no server state, so
it never expires, any node answers it, and a cluster merges the shards'
pages by the same key (``tiered.cluster.gateway.scatter.merge_stream_list``).

What a client can rely on, whatever is created or deleted while it pages
(the guarantee of S3's and S2's listings): paths come strictly increasing
across pages, so none is listed twice; every stream that lives from the first
page to the last is listed; a stream created or deleted meanwhile may or may
not be. ``limit`` is at most ``MAX_LIMIT`` (also the default, as S2's).

A caller sees only the streams its grants cover (``prefixes``: the
whole-segment prefixes of its grants on the bucket, ``None`` for every path:
the operator, a grant without a prefix, a public-read bucket), so a
prefix-limited token learns no name outside its prefix, not even how many.

The engine pages from its ``StreamDirectory`` (every bucket's paths kept
sorted, derived from the records the state applies): a bisect to the cursor
and the page's own paths (``page_sorted``), whatever the bucket holds
(``docs/navigation.md``). ``page`` does the same over unsorted paths (a pass
and a heap of ``limit + 1``), for a state without the directory.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tiered.core.errors import bad_request
from tiered.core.ids import format_offset
from tiered.core.parsing import query_uint
from tiered.engine.streams.records import BucketErased, StreamCreated, StreamDeleted, StreamExpired

__all__ = [
    "MAX_LIMIT",
    "MAX_PREFIX_CHARS",
    "ListQuery",
    "covered",
    "page",
    "parse_list_query",
]

#: The most entries one page holds, and the page size when ``limit`` is not given (S2's default and cap).
MAX_LIMIT = 1000
#: Longer ``prefix`` or ``after`` values match no stream path (paths are bounded far below) and are refused.
MAX_PREFIX_CHARS = 4096


@dataclass(frozen=True, slots=True)
class ListQuery:
    """A listing's query, parsed: ``prefix`` to match, ``after`` (exclusive) to start from, page size."""

    prefix: str = ""
    after: str = ""
    limit: int = MAX_LIMIT


def parse_list_query(query: Mapping[str, str]) -> ListQuery:
    """``prefix``, ``after`` and ``limit`` (1 to ``MAX_LIMIT``) from a decoded query; 400 when out of range."""
    prefix = query.get("prefix", "")
    after = query.get("after", "")
    for name, value in (("prefix", prefix), ("after", after)):
        if len(value) > MAX_PREFIX_CHARS:
            raise bad_request(f"query parameter {name} is longer than {MAX_PREFIX_CHARS} characters")
        if not value.isprintable():
            raise bad_request(f"query parameter {name} must be printable text")
    limit = query_uint(query, "limit", maximum=MAX_LIMIT)
    if limit == 0:
        raise bad_request(f"query parameter limit must be between 1 and {MAX_LIMIT}")
    return ListQuery(prefix, after, MAX_LIMIT if limit is None else limit)


def covered(path: str, prefixes: Sequence[str] | None) -> bool:
    """Whether a grant prefix covers ``path`` (whole segments: ``app1`` covers ``app1/x``, not ``app10``)."""
    if prefixes is None:
        return True
    for p in prefixes:
        if path == p or (path.startswith(p) and path[len(p) : len(p) + 1] == "/"):
            return True
    return False


@dataclass(frozen=True, slots=True)
class Entry:
    """One listed stream, as the service saw it (visible tail and closed state, not in-flight ones)."""

    path: str
    content_type: str
    next_offset: int  # the tail: ``Stream-Next-Offset``
    retained_offset: int  # the low-water mark: the first readable offset (``Stream-Retained-Offset``)
    created_ms: int
    closed: bool
    ttl_s: int | None = None
    expires_at: str | None = None
    # Record ordinals (``tiered.engine.streams.ordinals``) when the stream keeps them: (first, next, count).
    records: tuple[int, int, int] | None = None
    # Keyed compaction (``keyed``): the first offset still readable (past any hole); None: the retained one.
    low_water_mark: int | None = None

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "path": self.path,
            "content_type": self.content_type,
            "next_offset": format_offset(self.next_offset),
            "retained_offset": format_offset(self.retained_offset),
            "size_bytes": self.next_offset - self.retained_offset,
            "created_ms": self.created_ms,
            "closed": self.closed,
        }
        if self.ttl_s is not None:
            out["ttl_s"] = self.ttl_s
        if self.expires_at is not None:
            out["expires_at"] = self.expires_at
        if self.records is not None:
            out["first_record"], out["next_record"], out["records"] = self.records
        low = self.retained_offset if self.low_water_mark is None else self.low_water_mark
        out["low_water_mark"], out["high_water_mark"] = format_offset(low), format_offset(self.next_offset)
        return out


def page(
    paths: Iterable[str],
    query: ListQuery,
    prefixes: Sequence[str] | None,
    describe: Callable[[str], Entry],
) -> dict[str, Any]:
    """The page ``query`` asks for among ``paths`` (a bucket's live streams, any order), as the answer's body.

    ``describe(path)`` gives a listed path's entry. ``has_more``: a next page
    holds at least one entry (as of this pass); ``next_after``: its cursor.
    """
    after, prefix = query.after, query.prefix
    candidates = (
        p for p in paths if p > after and p.startswith(prefix) and (prefixes is None or covered(p, prefixes))
    )
    chosen = heapq.nsmallest(query.limit + 1, candidates)
    more = len(chosen) > query.limit
    rows = [describe(path).as_json() for path in chosen[: query.limit]]
    return {
        "streams": rows,
        "has_more": more,
        "next_after": rows[-1]["path"] if more else None,
        "limit": query.limit,
    }


def page_sorted(
    paths: Sequence[str],
    query: ListQuery,
    prefixes: Sequence[str] | None,
    live: Callable[[str], bool],
    describe: Callable[[str], Entry],
) -> dict[str, Any]:
    """``page`` over a bucket's paths kept sorted (``StreamDirectory``): a bisect, then only the page's paths.

    ``live(path)``: whether the path holds a live stream (the directory also
    holds expired and soft-deleted ones until they are journaled gone).
    """
    after, prefix = query.after, query.prefix
    i = bisect_left(paths, prefix) if prefix > after else bisect_right(paths, after)
    chosen: list[str] = []
    want = query.limit + 1
    for j in range(i, len(paths)):  # by index: islice would step through the first i
        path = paths[j]
        if not path.startswith(prefix):
            break  # sorted: past every path with the prefix
        if (prefixes is None or covered(path, prefixes)) and live(path):
            chosen.append(path)
            if len(chosen) == want:
                break
    more = len(chosen) > query.limit
    rows = [describe(path).as_json() for path in chosen[: query.limit]]
    return {
        "streams": rows,
        "has_more": more,
        "next_after": rows[-1]["path"] if more else None,
        "limit": query.limit,
    }


class StreamDirectory:
    """Every bucket's stream paths, sorted: a state extension that observes creates and removals.

    Derived, not journal state of its own: nothing goes in snapshots. It is
    built from the state's paths on the first listing (``paths_of``), then
    kept current by the records the state applies, so a page costs a bisect
    and the page's own paths, not a pass over every stream. A create inserts
    into a sorted list (a ``memmove`` of the bucket's paths: about a
    millisecond at a million). A removal only counts: the listing skips paths
    the state no longer holds (``live``), and the directory is rebuilt once
    the removed paths are a quarter of it.
    """

    name = "stream-directory"
    record_types: tuple[type, ...] = ()
    observed_types: tuple[type, ...] = (StreamCreated, StreamDeleted, StreamExpired, BucketErased)

    def __init__(self) -> None:
        self._sorted: dict[str, list[str]] | None = None  # bucket -> paths; None: not built yet
        self._size = 0
        self._removed = 0

    def apply(self, record: Any) -> None:
        raise TypeError(f"the stream directory applies no record of its own ({type(record).__name__})")

    def observe(self, record: Any, state: Any) -> None:
        by_bucket = self._sorted
        if by_bucket is None:
            return  # built from the state when first asked
        if type(record) is StreamCreated:
            paths = by_bucket.setdefault(record.bucket, [])
            i = bisect_left(paths, record.path)
            if i == len(paths) or paths[i] != record.path:
                paths.insert(i, record.path)
                self._size += 1
        else:  # deleted, expired, erased: skipped by the listing until the next rebuild
            self._removed += 1

    def paths_of(self, bucket: str, state: Any) -> list[str]:
        """The bucket's paths, sorted (from ``state.paths`` the first time, and once many were removed)."""
        if self._sorted is None or self._removed * 4 > self._size + 64:
            built: dict[str, list[str]] = {}
            for b, p in state.paths:
                built.setdefault(b, []).append(p)
            for paths in built.values():
                paths.sort()
            self._sorted, self._size, self._removed = built, len(state.paths), 0
        return self._sorted.get(bucket, [])

    def snapshot(self) -> bytes:
        return b""

    def restore(self, data: bytes) -> None:
        self._sorted = None  # rebuilt from the restored state on the next listing
