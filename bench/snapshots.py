#!/usr/bin/env python3
"""Snapshot encode and decode time, and size, on a state of N streams (in process, no server).

Builds a state as a server holds it (every extension registered, the collector
settings ``serve`` runs with): N streams, each created with 5 bytes and
appended to twice (so three hot chunks), a third with a TTL, half with an
idempotent producer. Then encodes and decodes its snapshot ``--rounds`` times
and prints the medians and minima. Snapshots run on the server's event loop
(encode) and at every start and snapshot write (decode: the written file is
read back), so both are worth keeping short.

    python bench/snapshots.py --streams 100000 --rounds 5

Issue 19 (the state's types as their own snapshot form), 100k streams, on two
shared cores (load 3-8), side by side in one process with the codec of e092d99,
medians of 5-7 rounds over four runs: encode 0.8-1.5 s -> 0.24-0.39 s, decode
1.8-2.5 s -> 1.05-1.4 s; size 263 -> 264 B per stream; the live state's memory
unchanged (1.52 KB per stream, traced).
"""

from __future__ import annotations

import argparse
import statistics
import time

from tiered.cli.heap import tune_collector
from tiered.engine.engine import new_state
from tiered.engine.snapshot import decode_snapshot, encode_snapshot
from tiered.engine.streams.model import AppendRequest, CreateRequest
from tiered.engine.streams.state import StreamState
from tiered.hot.log import LogPosition

T0 = 1_700_000_000_000


def build(n: int) -> StreamState:
    state = new_state()
    position = 0
    for i in range(n):
        path = f"streams/s{i:07d}"
        created, _ = state.decide_create(
            "default",
            path,
            CreateRequest(
                "application/octet-stream", 3600 if i % 3 == 0 else None, None, None, False, b"hello"
            ),
            T0 + i,
        )
        for r in created:
            position += 100
            state.apply(r, (1 + position // 10_000_000, position))
        for k in range(2):
            req = AppendRequest(None, b"x" * 50, False, f"p{i % 7}" if i % 2 else None, 0, k)
            appended = state.decide_append("default", path, req, T0 + i + k + 1)
            position += 100
            state.apply(appended, (1 + position // 10_000_000, position))
    return state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    tune_collector()
    state = build(args.streams)
    encode, decode, size = [], [], 0
    for _ in range(args.rounds):
        start = time.perf_counter()
        data = encode_snapshot(state, LogPosition(9, 9))
        encode.append(time.perf_counter() - start)
        start = time.perf_counter()
        restored, _ = decode_snapshot(data, new_state)
        decode.append(time.perf_counter() - start)
        assert len(restored.streams) == args.streams
        size = len(data)
    print(
        f"{args.streams} streams: {size / 1e6:.2f} MB ({size / args.streams:.0f} B/stream); "
        f"encode median {statistics.median(encode) * 1000:.0f} ms (min {min(encode) * 1000:.0f}); "
        f"decode median {statistics.median(decode) * 1000:.0f} ms (min {min(decode) * 1000:.0f})"
    )


if __name__ == "__main__":
    main()
