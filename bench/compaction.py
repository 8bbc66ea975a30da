#!/usr/bin/env python3
"""Cold-object rewrite benchmark: the machinery compaction and erasure share (``tiered/engine/jobs/rewrite.py``).

Per store (``--stores local,moto``; moto's S3 server runs in a child process
of its own, on loopback) one in-process engine (journal with fsync, the real
store, the system clock; the flusher and GC driven by hand):

``rewrite``
    ``--objects`` (8) cold objects of about ``--object-mib`` (8 MiB) each, every
    one shared half and half by a stream of bucket ``keep`` and one of bucket
    ``gone`` (64 KiB appends, incompressible bytes). ``gone`` is erased and one
    GC pass (paced to ``--rewrite-bytes-per-s``; 0, the default here: unpaced) rewrites every object without its rows (read whole and checksummed,
    decoded, re-encoded, uploaded, journaled). Reported: the pass's time, MB/s
    of old objects read and of new objects written, and the stored bytes
    before the erasure and after the old objects' deletion.
``appends``
    Append throughput in one run, side by side: ``--appenders`` (16) concurrent
    writers of ``--append-bytes`` (1 KiB) appends to ``keep`` streams (each
    acknowledged after fsync), first while the store is idle, then while a GC
    pass rewrites another ``--objects`` objects. Each window lasts as long as
    that rewrite pass (the idle one the same length, measured right after),
    bounded by ``--max-appends``; ``--repeat`` (3) rounds. Reported: median
    appends/s of each, the median of the rounds' ratios, and every ratio.

Keyed compaction (newest message per key) is not built yet, so the issue's
"1,000-key stream after 1M updates" storage figure is not measured here.
MB is 10**6 bytes. Results go to stdout as a table (``--json`` for JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tiered.core.clock import SystemClock  # noqa: E402
from tiered.core.config import Config  # noqa: E402
from tiered.engine.engine import Engine  # noqa: E402
from tiered.engine.jobs import rewrite  # noqa: E402
from tiered.engine.streams.model import AppendRequest, CreateRequest  # noqa: E402

OCTET = "application/octet-stream"
RECORD = 64 * 1024
BUCKET = "tiered-bench"
REGION = "us-east-1"
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}


class Moto:
    """moto's S3 server in a child process on a free loopback port (killed by its pid at the end)."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, **AWS_ENV},
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        else:
            raise SystemExit("moto did not start")
        import boto3

        boto3.client("s3", endpoint_url=self.url, region_name=REGION).create_bucket(Bucket=BUCKET)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def make_config(data_dir: Path, store: str, moto: Moto | None, args: argparse.Namespace, run: int) -> Config:
    values: dict[str, Any] = {
        "data_dir": str(data_dir),
        "max_body_bytes": 1 << 20,
        "cold_object_bytes": 2 * (args.object_mib << 20),  # each half stays "small": packed with the other
        "flush_bytes": 4 * (args.object_mib << 20),
        "max_hot_bytes": 8 * (args.object_mib << 20) * args.objects,
        "flush_interval_s": 3600.0,
        "hot_retention_s": 0.0,
        "gc_interval_s": 3600.0,
        "gc_grace_s": 10.0,
        "reconcile_interval_s": 3600.0,
        "rewrite_max_objects_per_pass": args.objects,
        "rewrite_bytes_per_s": args.rewrite_bytes_per_s,
    }
    if store == "moto":
        assert moto is not None
        values.update(
            cold_store="s3",
            s3_bucket=BUCKET,
            s3_prefix=f"bench-{os.getpid()}-{run}",
            s3_endpoint=moto.url,
            s3_region=REGION,
            s3_addressing_style="path",
        )
    config = Config(**values)
    config.validate()
    return config


async def shared_objects(node: Engine, tag: str, gone: str, n: int, object_bytes: int) -> None:
    """``n`` objects, each half ``keep/<tag><i>`` and half ``<gone>/<tag><i>`` (incompressible)."""
    streams = node.streams
    half = object_bytes // 2
    for i in range(n):
        for bucket in ("keep", gone):
            path = f"{tag}{i}"
            await streams.create(bucket, path, CreateRequest(OCTET, None, None, None, False, b"", None))
            for _ in range(max(1, half // RECORD)):
                await streams.append(bucket, path, AppendRequest(OCTET, os.urandom(RECORD), False))
        while await node.flusher.flush_once():
            pass
        await node.flusher.release_hot_copies()


def stored_bytes(node: Engine) -> int:
    return sum(o.size for o in node.state.cold_objects.values())


async def append_loop(node: Engine, stop: asyncio.Event, args: argparse.Namespace, count: list[int]) -> None:
    data = os.urandom(args.append_bytes)

    async def writer(w: int) -> None:
        path = f"w{w}"
        while not stop.is_set() and count[0] < args.max_appends:
            await node.streams.append("keep", path, AppendRequest(OCTET, data, False))
            count[0] += 1

    await asyncio.gather(*(writer(w) for w in range(args.appenders)))


async def bench_store(store: str, moto: Moto | None, args: argparse.Namespace) -> dict[str, Any]:
    clock = SystemClock()
    out: dict[str, Any] = {"store": store}
    with tempfile.TemporaryDirectory() as tmp:
        node = Engine(make_config(Path(tmp) / "data", store, moto, args, 0), clock)
        await node.start(jobs=False)
        try:
            for b in ("keep", "gone"):
                await node.streams.create_bucket(b)
            object_bytes = args.object_mib << 20
            # The worker process starts (and imports pyarrow) on first use: not part of the timing.
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(
                rewrite._worker_pool(), rewrite.rewrite_bytes, "warm", b"", (0, 0), (), None
            )
            await shared_objects(node, "r", "gone", args.objects, object_bytes)
            before = stored_bytes(node)
            await node.streams.erase_bucket("gone")
            t0 = time.perf_counter()
            report = await node.gc.run_pass(now_ms=clock.now_ms())
            seconds = time.perf_counter() - t0
            assert report.objects_rewritten == args.objects and not report.errors, report
            written = sum(o.size for o in node.state.cold_objects.values() if o.refs > 0)
            await node.gc.run_pass(now_ms=clock.now_ms() + 10_000)
            out.update(
                objects=args.objects,
                rewrite_s=round(seconds, 3),
                read_mb_s=round(before / seconds / 1e6, 1),
                written_mb_s=round(written / seconds / 1e6, 1),
                stored_before=before,
                stored_after=stored_bytes(node),
            )
            # Appends while a rewrite pass runs, then idle for the same length; --repeat rounds, medians.
            for w in range(args.appenders):
                await node.streams.create(
                    "keep", f"w{w}", CreateRequest(OCTET, None, None, None, False, b"", None)
                )
            await timed_appends(node, args, seconds=1.0)  # warm-up
            windows, busy_rates, idle_rates = [], [], []
            for rep in range(args.repeat):
                gone = f"gone-a{rep}"
                await node.streams.create_bucket(gone)
                while await node.flusher.flush_once():  # the appenders' hot bytes first, on their own
                    pass
                await shared_objects(node, f"a{rep}-", gone, args.objects, object_bytes)
                await node.streams.erase_bucket(gone)
                stop = asyncio.Event()
                count = [0]
                t0 = time.perf_counter()
                appends = asyncio.create_task(append_loop(node, stop, args, count))
                report = await node.gc.run_pass(now_ms=clock.now_ms())
                stop.set()
                await appends
                busy_s = time.perf_counter() - t0
                assert report.objects_rewritten >= 1 and not report.errors, report
                windows.append(busy_s)
                busy_rates.append(count[0] / busy_s)
                idle_rates.append(await timed_appends(node, args, seconds=busy_s))
            ratios = [b / i for b, i in zip(busy_rates, idle_rates, strict=True) if i]
            out.update(
                window_s=round(statistics.median(windows), 2),
                appends_idle_per_s=round(statistics.median(idle_rates), 1),
                appends_rewriting_per_s=round(statistics.median(busy_rates), 1),
                ratio_median=round(statistics.median(ratios), 3) if ratios else None,
                ratios=[round(r, 2) for r in ratios],
            )
        finally:
            await node.stop()
    return out


async def timed_appends(node: Engine, args: argparse.Namespace, seconds: float) -> float:
    """Appends/s of the append workload alone, for ``seconds``."""
    stop = asyncio.Event()
    count = [0]
    t0 = time.perf_counter()
    task = asyncio.create_task(append_loop(node, stop, args, count))
    await asyncio.sleep(seconds)
    stop.set()
    await task
    return count[0] / (time.perf_counter() - t0)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stores", default="local,moto")
    parser.add_argument("--objects", type=int, default=8)
    parser.add_argument("--object-mib", type=int, default=8)
    parser.add_argument("--appenders", type=int, default=16)
    parser.add_argument("--append-bytes", type=int, default=1024)
    parser.add_argument("--max-appends", type=int, default=200_000)
    parser.add_argument("--rewrite-bytes-per-s", type=int, default=0, help="the rewrite's pace (0: unpaced)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of the appends phase (medians)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    stores = [s for s in args.stores.split(",") if s]
    os.environ.update(AWS_ENV)
    moto = Moto() if "moto" in stores else None
    try:
        results = [asyncio.run(bench_store(store, moto, args)) for store in stores]
    finally:
        if moto is not None:
            moto.stop()
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    cols = list(results[0])
    print(" | ".join(cols))
    for r in results:
        print(" | ".join(str(r.get(c)) for c in cols))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
