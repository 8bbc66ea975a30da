#!/usr/bin/env python3
"""Keyed compaction benchmark (issue 21): storage reclaimed, compaction throughput, appends alongside.

One in-process engine per store (``--stores local,moto``; moto's S3 server in a
child process of its own, on loopback, as ``bench/compaction.py`` starts it), the
journal with fsync, the system clock; the flusher and GC driven by hand. A JSON
stream created with ``Stream-Compaction-Key: /id`` gets ``--updates`` messages
(``--batch`` per append) of ``--value-bytes`` of random hex each (so zstd does not
hide the sizes), keys 0 .. ``--keys`` in round robin; the flusher runs every
``--flush-every`` appends (100: about 4.7 MB of messages, so a flush packs the
stream with its companion below into shared objects, as a server's 1 s flush
interval does with busy streams), and everything is flushed to the cold tier in
the end. Phases (``--phases``):

``storage``
    The stream alone. One GC pass compacts it (``compaction``: the holes
    journaled) and reclaims its storage (``compaction-reclaim``: objects holding
    removed records rewritten or, when every range they serve is removed,
    released); a pass after the grace deletes the old objects. Reported: the
    stream's readable bytes and the cold objects' stored bytes before and after,
    each task's seconds, and the record count after (it must equal ``--keys``).
``rewrite``
    The same stream with a plain companion stream appended alongside
    (``--companion-bytes`` per keyed append), so every cold object is shared and
    each one compaction touches is rewritten (the companion's rows copied byte-exact),
    not just released. Reported: the reclaim task's seconds and MB/s of old objects
    read, and of new objects written.
``appends``
    Append throughput in one run, side by side: ``--appenders`` writers of 1 KiB
    appends (each acknowledged after fsync) while a GC pass compacts and rewrites
    a fresh ``rewrite``-shaped stream (``--append-updates`` updates), then idle
    for as long; ``--repeat`` rounds; medians and every round's ratio. The rewrite
    is paced as a server paces it (``--rewrite-bytes-per-s``, default the server's).

The issue asks for 1M updates; ``--updates`` defaults to 1,000,000 for
``storage`` (the other phases use ``--rewrite-updates``). MB is 10**6 bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import compaction as rewrite_bench  # noqa: E402  (bench/compaction.py: moto, the append loop)

from tiered.core.clock import SystemClock  # noqa: E402
from tiered.core.config import Config  # noqa: E402
from tiered.engine.engine import Engine  # noqa: E402
from tiered.engine.jobs import rewrite  # noqa: E402
from tiered.engine.streams.model import AppendRequest, CreateRequest  # noqa: E402
from tiered.gc.context import GcPass  # noqa: E402

JSON = "application/json"
OCTET = "application/octet-stream"
GRACE_MS = 10_000


def make_config(
    data_dir: Path, store: str, moto: rewrite_bench.Moto | None, run: str, pace: int = 0
) -> Config:
    values: dict[str, Any] = {
        "data_dir": str(data_dir),
        "max_body_bytes": 4 << 20,
        "flush_interval_s": 3600.0,
        "hot_retention_s": 0.0,
        "gc_interval_s": 3600.0,
        "gc_grace_s": GRACE_MS / 1000,
        "reconcile_interval_s": 3600.0,
        "max_hot_bytes": 1 << 30,
        "rewrite_max_objects_per_pass": 10_000,
        "rewrite_bytes_per_s": pace,
    }
    if store == "moto":
        assert moto is not None
        values.update(
            cold_store="s3",
            s3_bucket=rewrite_bench.BUCKET,
            s3_prefix=f"keyed-bench-{os.getpid()}-{run}",
            s3_endpoint=moto.url,
            s3_region=rewrite_bench.REGION,
            s3_addressing_style="path",
        )
    config = Config(**values)
    config.validate()
    return config


async def fill(node: Engine, path: str, updates: int, args: argparse.Namespace, companion: int) -> None:
    """The keyed stream ``path`` (and, with ``companion`` bytes per append, ``path``-c), flushed cold."""
    streams = node.streams
    await streams.create(
        "default", path, CreateRequest(JSON, None, None, None, False, b"", None, compaction_key="/id")
    )
    if companion:
        await streams.create("default", f"{path}-c", CreateRequest(OCTET, None, None, None, False, b"", None))
    for first in range(0, updates, args.batch):
        batch = [
            {"id": i % args.keys, "v": i, "pad": os.urandom(args.value_bytes // 2).hex()}
            for i in range(first, min(updates, first + args.batch))
        ]
        await streams.append("default", path, AppendRequest(JSON, json.dumps(batch).encode(), False))
        if companion:
            await streams.append("default", f"{path}-c", AppendRequest(OCTET, os.urandom(companion), False))
        if (first // args.batch + 1) % args.flush_every == 0:  # as the flusher's interval would
            while await node.flusher.flush_once():
                pass
    while await node.flusher.flush_once():
        pass
    await node.flusher.release_hot_copies()


def stored(node: Engine) -> int:
    return sum(o.size for o in node.state.cold_objects.values())


def live_stored(node: Engine) -> int:
    return sum(o.size for o in node.state.cold_objects.values() if o.refs > 0)


async def run_task(node: Engine, name: str) -> tuple[float, Any]:
    """One GC task alone (``compaction`` or ``compaction-reclaim``): its seconds and report."""
    [task] = [t for t in node.gc.tasks if t.name == name]
    gc_pass = GcPass(now=node.clock.now_ms(), dry_run=False, reconcile=False)
    t0 = time.perf_counter()
    await task.run(node.gc.ctx, gc_pass)
    return time.perf_counter() - t0, gc_pass.report


async def warm_worker() -> None:
    """The rewrite worker process starts (and imports pyarrow) on first use: not part of any timing."""
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(rewrite._worker_pool(), rewrite.rewrite_bytes, "warm", b"", (0, 0), (), None)


async def phase_storage(
    store: str, moto: rewrite_bench.Moto | None, args: argparse.Namespace
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="keyed-bench-") as tmp:
        node = Engine(make_config(Path(tmp), store, moto, "storage"), SystemClock())
        await node.start(jobs=False)
        try:
            await warm_worker()
            t0 = time.perf_counter()
            await fill(node, "k", args.updates, args, 0)
            fill_s = time.perf_counter() - t0
            s = node.streams.lookup("default", "k")
            readable_before = s.tail - s.retained_from
            before, objects_before = stored(node), len(node.state.cold_objects)
            scan_s, scan = await run_task(node, "compaction")
            reclaim_s, reclaim = await run_task(node, "compaction-reclaim")
            assert not scan.errors and not reclaim.errors and not reclaim.integrity_errors, (scan, reclaim)
            await node.gc.run_pass(now_ms=node.clock.now_ms() + GRACE_MS + 1)  # the old objects deleted
            removed = sum(b - a for a, b in s.holes)
            records = node.streams.records(s, node.streams.view(s).tail)
            return {
                "phase": "storage",
                "store": store,
                "keys": args.keys,
                "updates": args.updates,
                "fill_s": round(fill_s, 1),
                "readable_bytes_before": readable_before,
                "readable_bytes_after": readable_before - removed,
                "stored_bytes_before": before,
                "stored_bytes_after": stored(node),
                "objects_before": objects_before,
                "objects_after": len(node.state.cold_objects),
                "objects_compacted": reclaim.objects_compacted,
                "compaction_scan_s": round(scan_s, 3),
                "reclaim_s": round(reclaim_s, 3),
                "scan_mb_per_s": round(readable_before / scan_s / 1e6, 1),
                "messages_removed": scan.messages_compacted,
                "records_after": None if records is None else records.count,
            }
        finally:
            await node.stop()


async def phase_rewrite(
    store: str, moto: rewrite_bench.Moto | None, args: argparse.Namespace
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="keyed-bench-") as tmp:
        node = Engine(make_config(Path(tmp), store, moto, "rewrite"), SystemClock())
        await node.start(jobs=False)
        try:
            await warm_worker()
            await fill(node, "k", args.rewrite_updates, args, args.companion_bytes)
            before, objects_before = stored(node), len(node.state.cold_objects)
            scan_s, scan = await run_task(node, "compaction")
            reclaim_s, reclaim = await run_task(node, "compaction-reclaim")
            assert not scan.errors and not reclaim.errors and not reclaim.integrity_errors, (scan, reclaim)
            written = live_stored(node)
            return {
                "phase": "rewrite",
                "store": store,
                "updates": args.rewrite_updates,
                "stored_bytes_before": before,
                "stored_bytes_after": written,
                "objects_before": objects_before,
                "objects_compacted": reclaim.objects_compacted,
                "compaction_scan_s": round(scan_s, 3),
                "reclaim_s": round(reclaim_s, 3),
                "reclaim_read_mb_per_s": round(before / reclaim_s / 1e6, 1),
                "reclaim_written_mb_per_s": round(written / reclaim_s / 1e6, 1),
                "compaction_total_mb_per_s": round(before / (scan_s + reclaim_s) / 1e6, 1),
            }
        finally:
            await node.stop()


async def phase_appends(
    store: str, moto: rewrite_bench.Moto | None, args: argparse.Namespace
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="keyed-bench-") as tmp:
        node = Engine(make_config(Path(tmp), store, moto, "appends", args.rewrite_bytes_per_s), SystemClock())
        await node.start(jobs=False)
        try:
            await warm_worker()
            await node.streams.create_bucket("keep")
            for w in range(args.appenders):
                await node.streams.create(
                    "keep", f"w{w}", CreateRequest(OCTET, None, None, None, False, b"", None)
                )
            await rewrite_bench.timed_appends(node, args, seconds=1.0)  # warm-up
            windows, busy, idle = [], [], []
            for rep in range(args.repeat):
                while await node.flusher.flush_once():  # the appenders' hot bytes first, on their own
                    pass
                await fill(node, f"k{rep}", args.append_updates, args, args.companion_bytes)
                stop = asyncio.Event()
                count = [0]
                t0 = time.perf_counter()
                appends = asyncio.create_task(rewrite_bench.append_loop(node, stop, args, count))
                report = await node.gc.run_pass(now_ms=node.clock.now_ms())
                stop.set()
                await appends
                busy_s = time.perf_counter() - t0
                assert report.objects_compacted >= 1 and not report.errors, report
                windows.append(busy_s)
                busy.append(count[0] / busy_s)
                idle.append(await rewrite_bench.timed_appends(node, args, seconds=busy_s))
            ratios = [b / i for b, i in zip(busy, idle, strict=True) if i]
            return {
                "phase": "appends",
                "store": store,
                "window_s": round(statistics.median(windows), 2),
                "appends_idle_per_s": round(statistics.median(idle), 1),
                "appends_compacting_per_s": round(statistics.median(busy), 1),
                "ratio_median": round(statistics.median(ratios), 3) if ratios else None,
                "ratios": [round(r, 2) for r in ratios],
            }
        finally:
            await node.stop()


PHASES = {"storage": phase_storage, "rewrite": phase_rewrite, "appends": phase_appends}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stores", default="local,moto")
    parser.add_argument("--phases", default="storage,rewrite,appends")
    parser.add_argument("--storage-stores", default="local", help="stores of the storage phase")
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--updates", type=int, default=1_000_000, help="updates of the storage phase")
    parser.add_argument("--rewrite-updates", type=int, default=200_000)
    parser.add_argument("--append-updates", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=500, help="messages per append")
    parser.add_argument("--value-bytes", type=int, default=64)
    parser.add_argument(
        "--flush-every",
        type=int,
        default=100,
        help="appends between flushes (small flushes pack streams together)",
    )
    parser.add_argument("--companion-bytes", type=int, default=4096, help="per keyed append, rewrite/appends")
    parser.add_argument("--appenders", type=int, default=16)
    parser.add_argument("--append-bytes", type=int, default=1024)
    parser.add_argument("--max-appends", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--rewrite-bytes-per-s",
        type=int,
        default=Config().rewrite_bytes_per_s,
        help="the appends phase's rewrite pace (default: the server's; storage and rewrite run unpaced)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    stores = [s for s in args.stores.split(",") if s]
    phases = [p for p in args.phases.split(",") if p]
    os.environ.update(rewrite_bench.AWS_ENV)
    needs_moto = "moto" in stores or ("storage" in phases and "moto" in args.storage_stores)
    moto = rewrite_bench.Moto() if needs_moto else None
    results: list[dict[str, Any]] = []
    try:
        for phase in phases:
            for store in args.storage_stores.split(",") if phase == "storage" else stores:
                result = asyncio.run(PHASES[phase](store, moto, args))
                results.append(result)
                print(json.dumps(result), file=sys.stderr, flush=True)
    finally:
        if moto is not None:
            moto.stop()
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for r in results:
            print(" ".join(f"{k}={v}" for k, v in r.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
