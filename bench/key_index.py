#!/usr/bin/env python3
"""Key index of streams keyed by header (issue 21): what 1M keys cost the compactor and a keyed read.

In one process, on this machine (no server, no store: the CPU and bytes the
format and the pure plan cost, which is what a pass and a lookup add to the
store's own latency):

1. builds ``--keys`` index entries (keys of ``--key-bytes``), encodes the
   index object (``key_index_file.encode``): seconds, object bytes, footer bytes;
2. decodes it whole (the compactor's read of the old index, every block checked);
3. plans a pass folding ``--updates`` new keyed appends of random existing keys
   into it (``header_keys.plan_index``) and encodes the merged index: seconds, holes;
4. times ``--lookups`` keyed lookups against the object in memory, footer cached
   (one block fetched and checked each): microseconds per lookup.

With ``--engine-keys N`` it then runs the real path in one in-process engine on the
local store (journal with fsync, the system clock, flusher and GC driven by hand): a
stream keyed by header gets ``--engine-updates`` keyed appends over N keys (``--concurrency``
in flight, so group commit batches them), is flushed, and one GC pass writes its first
key index; then as many updates again and a second pass (folding into the existing
index); then ``--lookups`` ``?key=`` reads through the service (index plus pending).

    python bench/key_index.py --keys 1000000 --engine-keys 100000 --json key_index.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import google_crc32c  # noqa: E402

from tiered.engine.streams import header_keys, key_index_file  # noqa: E402
from tiered.engine.streams.model import KeyedAppend, KeyIndexRef, Stream  # noqa: E402


async def engine_run(args: argparse.Namespace) -> dict[str, float | int]:
    import tempfile

    from tiered.core.clock import SystemClock
    from tiered.core.config import Config
    from tiered.core.errors import TieredError
    from tiered.engine.engine import Engine
    from tiered.engine.streams import key_reads
    from tiered.engine.streams.model import AppendRequest, CreateRequest

    out: dict[str, float | int] = {"engine_keys": args.engine_keys, "engine_updates": args.engine_updates}
    rng = random.Random(11)
    with tempfile.TemporaryDirectory(prefix="key-index-bench-") as tmp:
        config = Config(
            data_dir=tmp,
            flush_interval_s=3600.0,
            hot_retention_s=0.0,
            gc_interval_s=3600.0,
            reconcile_interval_s=3600.0,
            max_hot_bytes=1 << 30,
        )
        config.validate()
        node = Engine(config, SystemClock())
        await node.start(jobs=False)
        try:
            streams = node.streams
            create = CreateRequest("text/plain", None, None, None, False, b"", None, compaction_key="header")
            await streams.create("default", "hk", create)

            async def updates(n: int) -> float:
                sem = asyncio.Semaphore(args.concurrency)

                async def one(i: int) -> None:
                    key = f"user-{rng.randrange(args.engine_keys):08d}"
                    async with sem:
                        await streams.append(
                            "default", "hk", AppendRequest("text/plain", b"v%d;" % i, False, key=key)
                        )

                t = time.perf_counter()
                await asyncio.gather(*(one(i) for i in range(n)))
                return n / (time.perf_counter() - t)

            async def compact() -> float:
                while await node.flusher.flush_once():
                    pass
                await node.flusher.release_hot_copies()
                t = time.perf_counter()
                report = await node.gc.run_pass(now_ms=node.clock.now_ms())
                assert report.errors == [] and report.key_indexes_written == 1, report
                return time.perf_counter() - t

            out["appends_per_s"] = round(await updates(args.engine_updates))
            out["first_pass_s"] = round(await compact(), 3)
            out["appends_per_s_2"] = round(await updates(args.engine_updates))
            out["second_pass_s"] = round(await compact(), 3)
            s = streams.lookup("default", "hk")
            assert s.key_index is not None
            out["index_keys"] = s.key_index.keys
            out["index_bytes"] = s.key_index.size
            out["readable_bytes"] = s.tail - sum(b - a for a, b in s.holes)
            out["appended_bytes"] = s.tail
            t = time.perf_counter()
            misses = 0
            for _ in range(args.lookups // 10):
                try:
                    await streams.read_key(s, f"user-{rng.randrange(args.engine_keys):08d}")
                except TieredError:  # a key no update drew
                    misses += 1
            out["key_read_us"] = round((time.perf_counter() - t) / (args.lookups // 10) * 1e6, 1)
            out["key_read_misses"] = misses
            # The index's share of a key read: its lookup alone (footer cached, one block read from the store).
            t = time.perf_counter()
            for _ in range(args.lookups // 10):
                key = f"user-{rng.randrange(args.engine_keys):08d}"
                await key_reads._from_index(streams.reader, streams.key_footers, s, key)
            out["index_lookup_us"] = round((time.perf_counter() - t) / (args.lookups // 10) * 1e6, 1)
        finally:
            await node.stop()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--key-bytes", type=int, default=20)
    p.add_argument("--updates", type=int, default=100_000)
    p.add_argument("--lookups", type=int, default=20_000)
    p.add_argument("--engine-keys", type=int, default=0, help="also run the in-process engine (0: skip)")
    p.add_argument("--engine-updates", type=int, default=200_000)
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    rng = random.Random(7)
    width = args.key_bytes
    keys = sorted(f"{i:0{width}d}" for i in range(args.keys))
    entries = [KeyedAppend(i * 100, i * 100 + 100, k, False, 0) for i, k in enumerate(keys)]
    out: dict[str, float | int | str] = {"keys": args.keys, "key_bytes": width, "load_1m": os.getloadavg()[0]}

    t = time.perf_counter()
    data, footer_length = key_index_file.encode(entries)
    out["encode_s"] = round(time.perf_counter() - t, 3)
    out["object_bytes"] = len(data)
    out["footer_bytes"] = footer_length
    ref = KeyIndexRef(
        "data/bench.keys", len(data), google_crc32c.value(data), footer_length, 0, len(entries), 0
    )

    t = time.perf_counter()
    old = list(key_index_file.decode_all(ref, data))
    out["decode_s"] = round(time.perf_counter() - t, 3)

    tail = args.keys * 100
    s = Stream(1, "b", "p", "text/plain", None, None, None, 0, None, 0, None, tail, compaction_key="header")
    pending = []
    for _ in range(args.updates):
        pending.append(KeyedAppend(tail, tail + 100, keys[rng.randrange(args.keys)], False, 0))
        tail += 100
    s.pending_keys, s.tail, s.cold_end = pending, tail, tail
    t = time.perf_counter()
    plan, entries = header_keys.plan_index(s, old, now_ms=0, tombstone_delay_ms=1)
    key_index_file.encode(entries)  # the merge streams out as the new object is encoded
    out["plan_and_encode_s"] = round(time.perf_counter() - t, 3)
    out["plan_updates"] = args.updates
    out["plan_holes"] = len(plan.removed)

    async def fetch(a: int, b: int) -> bytes:
        return data[a:b]

    async def lookups() -> float:
        cache = key_index_file.FooterCache()
        await key_index_file.lookup(ref, fetch, keys[0], cache)
        probe = [keys[rng.randrange(args.keys)] for _ in range(args.lookups)]
        t = time.perf_counter()
        for k in probe:
            assert await key_index_file.lookup(ref, fetch, k, cache) is not None
        return (time.perf_counter() - t) / len(probe)

    out["lookup_us"] = round(asyncio.run(lookups()) * 1e6, 1)
    if args.engine_keys:
        out.update(asyncio.run(engine_run(args)))
    out["load_1m_after"] = os.getloadavg()[0]
    print(json.dumps(out, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
