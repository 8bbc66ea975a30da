#!/usr/bin/env python3
"""What issue 22's navigation costs, in process: a listing page, and record ordinals' upkeep per append.

* ``listing``: one page (``limit`` 1000 and 10) of a bucket holding N streams, as
  ``StreamService.list_streams`` computes it from the sorted ``StreamDirectory`` (a bisect,
  then the page's paths), and for comparison by a pass over every stream and a heap of
  ``limit + 1``, for N in ``--streams``.
* ``ordinals``: applying an append to the state with the engine's extensions, with the record
  index (``RecordsState``) registered and without it: a byte append (one message) and a JSON
  batch of 10 messages. The difference is what the index adds to each append's apply step
  (the journal write and fsync, which dominate an append, are not in either).

Bounded: ``--rounds`` rounds of fixed counts; the best round is printed (the least disturbed
by other processes on a loaded machine). Run: ``python bench/navigation.py``.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from functools import partial

from tiered.core.content import encode_json_messages
from tiered.core.ids import DEFAULT_BUCKET
from tiered.engine.auth.state import AuthState
from tiered.engine.engine import new_state
from tiered.engine.groups.state import GroupsState
from tiered.engine.streams import listing
from tiered.engine.streams.model import CreateRequest
from tiered.engine.streams.records import Appended
from tiered.engine.streams.state import StreamState
from tiered.engine.subscriptions.state import SubscriptionState
from tiered.engine.tenants.state import TenantState


def best(rounds: int, fn: Callable[[], int]) -> float:
    """Seconds per operation of the best round (``fn`` runs one round and says how many operations)."""
    out = float("inf")
    for _ in range(rounds):
        gc.collect()
        started = time.perf_counter()
        n = fn()
        out = min(out, (time.perf_counter() - started) / n)
    return out


def state_with(n: int) -> StreamState:
    state = new_state()
    for i in range(n):
        records, _ = state.decide_create(
            DEFAULT_BUCKET,
            f"tenant-{i % 97:02d}/stream-{i:07d}",
            CreateRequest(None, None, None, None, False, b""),
            0,
        )
        for r in records:
            state.apply(r)
    return state


def page_of(state: StreamState, limit: int, directory: bool) -> dict[str, object]:
    """What ``StreamService.list_streams`` computes (minus the visibility view: the tail is the state's).

    ``directory``: from the sorted ``StreamDirectory`` (what the engine does); else a pass over every stream.
    """
    streams, held = state.streams, state.paths

    def live(path: str) -> bool:
        uid = held.get((DEFAULT_BUCKET, path))
        return uid is not None and not (s := streams[uid]).soft_deleted and not s.expired(0)

    def describe(path: str) -> listing.Entry:
        s = streams[held[(DEFAULT_BUCKET, path)]]
        return listing.Entry(path, s.content_type, s.tail, s.retained_from, s.created_ms, s.closed)

    query = listing.ListQuery("", "tenant-50", limit)
    if directory:
        found = state.extensions[listing.StreamDirectory.name]
        assert isinstance(found, listing.StreamDirectory)
        return listing.page_sorted(found.paths_of(DEFAULT_BUCKET, state), query, None, live, describe)
    every = (p for (b, p) in held if b == DEFAULT_BUCKET and live(p))
    return listing.page(every, query, None, describe)


def one_page(state: StreamState, limit: int, directory: bool) -> int:
    page_of(state, limit, directory)
    return 1


def bench_listing(counts: list[int], rounds: int) -> None:
    for n in counts:
        state = state_with(n)
        for directory in (False, True):
            for limit in (1000, 10):
                per = best(rounds, partial(one_page, state, limit, directory))
                how = "directory" if directory else "full scan"
                print(f"listing  streams={n:>9,}  limit={limit:>4}  {how:9}  {per * 1000:8.2f} ms/page")


def apply_appends(with_index: bool, ct: str, data: bytes, appends: int) -> int:
    """Apply ``appends`` appends of ``data`` to a fresh stream; with or without the record index."""
    if with_index:
        state = new_state()
    else:
        state = StreamState([GroupsState(), SubscriptionState(), AuthState(), TenantState()])
    records, _ = state.decide_create(DEFAULT_BUCKET, "s", CreateRequest(ct, None, None, None, False, b""), 0)
    for r in records:
        state.apply(r)
    uid = state.paths[(DEFAULT_BUCKET, "s")]
    offset = 0
    for i in range(appends):
        state.apply(Appended(uid, offset, i, None, 0, 0, None, False, data), (1, offset))
        offset += len(data)
    return appends


def bench_ordinals(appends: int, rounds: int) -> None:
    batch = encode_json_messages(
        b"[" + b",".join(b'{"n": %d}' % i for i in range(10)) + b"]", allow_empty_array=False
    )
    cases = (("bytes x1", "application/octet-stream", b"x" * 256), ("json x10", "application/json", batch))
    for label, ct, data in cases:
        without = best(rounds, partial(apply_appends, False, ct, data, appends))
        with_index = best(rounds, partial(apply_appends, True, ct, data, appends))
        extra = with_index - without
        print(
            f"ordinals {label}: apply {without * 1e6:6.2f} us without the index, "
            f"{with_index * 1e6:6.2f} us with it (+{extra * 1e6:.2f} us, {extra / without * 100:+.0f}%)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", default="10000,100000", help="comma-separated stream counts")
    parser.add_argument("--appends", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    bench_listing([int(n) for n in args.streams.split(",")], args.rounds)
    bench_ordinals(args.appends, args.rounds)


if __name__ == "__main__":
    main()
