#!/usr/bin/env python3
"""What classifying and routing one append costs, in process: no HTTP server, no disk write.

An engine (``Node``, auth off, on a temporary data dir) is composed as ``tiered serve`` composes
it; its stream service's ``append`` is replaced by one that stores nothing, so what is timed is
what every append pays before and after the append logic proper: parsing the request's target,
classifying it (route, access, usage class), the auth and usage middleware, the router, and the
stream route's own header parsing. Two requests: an append to the default bucket
(``/v1/stream/...``) and to a named one (``/v1/buckets/{b}/stream/...``).

``--gateway`` also times what a cluster node's shard routing asks of every request before it
sends it on (scatter plan, shard key, bucket-wide writes), on a fresh request each time, and
those questions followed by the engine's chain on the same request (``gateway+chain``: a
cluster node serving the shard itself; in a route-table build the engine reads the
classification the gateway made).

``--streams N`` spreads the appends over N streams, round robin: past 8,192 (the size of the
target parser's address cache and of the route table's memo of classifications) every request
is parsed and classified afresh, as with many streams each appended to rarely.

Run it on two builds for a before/after figure::

    PYTHONPATH=/old/tree python bench/route_classify.py
    python bench/route_classify.py

Bounded: ``--rounds`` x ``--requests`` iterations; the best round's mean is printed (the least
disturbed by other processes on a loaded machine).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from tiered.api import app
from tiered.api.kit.types import Request
from tiered.core.config import Config
from tiered.engine.engine import Engine

BODY = b"x" * 256
HEADERS = {"Content-Type": "application/octet-stream", "Content-Length": "256"}
TARGETS = {"append /v1/stream": "/v1/stream/bench/s", "append /v1/buckets": "/v1/buckets/bench/stream/s"}


class _Appended:
    tail = 1024
    closed = False
    epoch = None
    seq = None
    stored = True


async def _append(*args: Any, **kwargs: Any) -> _Appended:
    return _Appended()


async def _read() -> bytes:
    return BODY


def _best(rounds: int, requests: int, one: Callable[[], Any], loop: asyncio.AbstractEventLoop) -> float:
    """Best round's mean microseconds per call of ``one`` (a coroutine function, or a plain one)."""

    async def round_() -> float:
        started = time.perf_counter()
        for _ in range(requests):
            got = one()
            if asyncio.iscoroutine(got):
                await got
        return (time.perf_counter() - started) / requests * 1e6

    gc.disable()  # a collection in one round and not in another is noise, not routing
    try:
        return min(loop.run_until_complete(round_()) for _ in range(rounds))
    finally:
        gc.enable()


def gateway_classifier() -> Callable[[Request], object]:
    """What shard routing asks of each request, in this build."""
    from tiered.cluster.gateway import routing, scatter

    fanout_bucket = getattr(routing, "fanout_bucket", None)
    if fanout_bucket is not None:  # the route table: classified once, every answer read from it
        plan_of = scatter.plan_of  # type: ignore[attr-defined]

        def classify(request: Request) -> object:
            return plan_of(request), routing.shard_key(request.target), fanout_bucket(request)

        return classify

    def classify_old(request: Request) -> object:
        parsed = request.target
        plan = scatter.scatter_plan(request.method, parsed.path)
        bucket = routing.bucket_write(request.method, parsed) or scatter.bucket_wide_write(
            request.method, parsed
        )
        return plan, routing.shard_key(parsed), bucket

    return classify_old


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--gateway", action="store_true", help="also time cluster shard routing's questions")
    parser.add_argument("--streams", type=int, default=1, help="spread the appends over this many streams")
    args = parser.parse_args()
    loop = asyncio.new_event_loop()
    with tempfile.TemporaryDirectory(prefix="tiered-bench-route-") as data:
        engine = Engine(Config(data_dir=data, auth="none"))
        loop.run_until_complete(engine.start(jobs=False))
        try:
            loop.run_until_complete(engine.streams.create_bucket("bench"))
            engine.streams.append = _append  # type: ignore[method-assign]
            chain = app.engine_chain(engine)
            for label, prefix in TARGETS.items():
                paths = itertools.cycle([f"{prefix}{n}" for n in range(args.streams)])

                def one(paths: Iterator[str] = paths) -> Any:
                    return chain(Request("POST", next(paths), "", HEADERS, _read))

                status = loop.run_until_complete(one()).status
                assert status == 204, status
                print(f"{label:24} {_best(args.rounds, args.requests, one, loop):7.2f} us/request (chain)")
            if args.gateway:
                classify = gateway_classifier()
                for label, prefix in TARGETS.items():
                    paths = itertools.cycle([f"{prefix}{n}" for n in range(args.streams)])

                    def ask(paths: Iterator[str] = paths) -> object:
                        return classify(Request("POST", next(paths), "", HEADERS, _read))

                    print(
                        f"{label:24} {_best(args.rounds, args.requests, ask, loop):7.2f} us/request (gateway)"
                    )

                    def both(paths: Iterator[str] = paths) -> Any:
                        request = Request("POST", next(paths), "", HEADERS, _read)
                        classify(request)
                        return chain(request)

                    print(
                        f"{label:24} {_best(args.rounds, args.requests, both, loop):7.2f} us/request (gateway+chain)"
                    )
        finally:
            loop.run_until_complete(engine.stop())
            loop.close()


if __name__ == "__main__":
    main()
