#!/usr/bin/env python3
"""Keyed compaction benchmark (issue 21): a ``--keys`` (1,000) key stream after ``--updates`` updates.

One in-process engine on the local store (journal with fsync, the system
clock; the flusher and GC driven by hand). A JSON stream created with
``Stream-Compaction-Key: /id`` gets ``--updates`` messages (``--batch`` per
append) with ``--value-bytes`` of random hex each (so zstd does not hide the sizes), keys in round robin; everything is
flushed to the cold tier; one GC pass compacts it (``tiered.gc.compaction``).

Reported: the stream's readable bytes (what a replay from the low-water mark
reads) before and after, the cold objects' stored bytes before and after
(unchanged: compaction does not rewrite objects yet, docs/compaction.md), the
compaction pass's time and the MB/s of messages it scanned, and the record
count after (it must equal ``--keys``). MB is 10**6 bytes.

The issue asks for 1M updates; the default here is 100,000 (scaled down: the
machine is shared), ``--updates 1000000`` runs the full size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tiered.core.clock import SystemClock  # noqa: E402
from tiered.core.config import Config  # noqa: E402
from tiered.engine.engine import Engine  # noqa: E402
from tiered.engine.streams.model import AppendRequest, CreateRequest  # noqa: E402

JSON = "application/json"


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="keyed-bench-") as tmp:
        config = Config(
            data_dir=tmp,
            max_body_bytes=4 << 20,
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
            await streams.create(
                "default", "k", CreateRequest(JSON, None, None, None, False, b"", None, compaction_key="/id")
            )
            for first in range(0, args.updates, args.batch):
                batch = [
                    {"id": i % args.keys, "v": i, "pad": os.urandom(args.value_bytes // 2).hex()}
                    for i in range(first, min(args.updates, first + args.batch))
                ]
                await streams.append("default", "k", AppendRequest(JSON, json.dumps(batch).encode(), False))
            while await node.flusher.flush_once():
                pass
            await node.flusher.release_hot_copies()
            s = streams.lookup("default", "k")
            readable_before = s.tail - s.retained_from
            stored_before = sum(o.size for o in node.state.cold_objects.values())
            started = time.perf_counter()
            report = await node.gc.run_pass(now_ms=node.clock.now_ms())
            seconds = time.perf_counter() - started
            assert report.errors == [], report.errors
            removed = sum(b - a for a, b in s.holes)
            records = streams.records(s, streams.view(s).tail)
            return {
                "keys": args.keys,
                "updates": args.updates,
                "readable_bytes_before": readable_before,
                "readable_bytes_after": readable_before - removed,
                "stored_bytes_before": stored_before,
                "stored_bytes_after": sum(o.size for o in node.state.cold_objects.values()),
                "compaction_s": round(seconds, 3),
                "scanned_mb_per_s": round(readable_before / seconds / 1e6, 1),
                "messages_removed": report.messages_compacted,
                "records_after": None if records is None else records.count,
            }
        finally:
            await node.stop()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--updates", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=500, help="messages per append")
    parser.add_argument("--value-bytes", type=int, default=64)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = asyncio.run(run(args))
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:24} {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
