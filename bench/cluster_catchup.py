#!/usr/bin/env python3
"""Catch-up read throughput in a cluster: through the owner, through a non-owner from the store, forwarded.

One run, one moto S3 server (its own process, so it does not share the load
generator's interpreter), three ``tiered serve`` nodes with local durability
(the first node owns every shard; the others own none):

* ``n1`` the owner: reads are answered by its engine from its cold tier;
* ``n2`` a non-owner serving catch-up reads from the store with cold locators
  (``cluster_locator_ttl_s`` > 0, the default);
* ``n3`` a non-owner with locators off (``--cluster-locator-ttl-s 0``): every
  read is forwarded to the owner, as before.

``--streams`` streams of ``--stream-mib`` MiB are appended through the owner
and flushed to Parquet objects (no hot retention, so every byte below the tail
is read from the cold tier); then for each node in turn ``--concurrency``
readers follow ``Stream-Next-Offset`` from random chunk-aligned offsets for
``--seconds``. Printed per node: reads/s, MiB/s, latency p50/p99, the share of
answers served from the store by that node (``Tiered-Served-By``), and the CPU
time of all node processes per read (and of the owner alone). Read caches are
``--read-cache-mib`` (each engine's, and a non-owner's one catch-up cache),
smaller than the data; with the default single shard the owner has one engine,
so both paths have the same cache. Heavy: take /tmp/tiered-bench.lock first.

    python bench/cluster_catchup.py --seconds 8 --json catchup.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster import BUCKET, ENV, REGION, NodeProc, free_port, get_json  # noqa: E402

from tiered.core.ids import format_offset  # noqa: E402

MiB = 1024 * 1024


@dataclass
class Row:
    via: str
    reads: int
    errors: int
    reads_per_s: float
    mib_per_s: float
    p50_ms: float
    p99_ms: float
    served_from_store: float
    node_cpu_ms_per_read: float
    owner_cpu_ms_per_read: float


async def read_load(
    url: str, streams: list[str], args: argparse.Namespace
) -> tuple[list[float], int, int, int]:
    """(latencies of 200s, bytes read, errors, answers served from the store by the node asked)."""
    latencies: list[float] = []
    nbytes = errors = served = 0
    chunk = args.chunk_kib * 1024
    size = args.stream_mib * MiB
    deadline = time.monotonic() + args.seconds
    rng = random.Random(11)
    statuses: dict[int, int] = {}
    samples: list[bytes] = []

    async def reader(session: aiohttp.ClientSession) -> None:
        nonlocal nbytes, errors, served
        while time.monotonic() < deadline:
            stream = rng.choice(streams)
            offset = format_offset(rng.randrange(0, size // chunk - 4) * chunk)
            for _ in range(4):  # a short catch-up run: four chunks, following Stream-Next-Offset
                t0 = time.perf_counter()
                async with session.get(f"{url}/v1/stream/{stream}", params={"offset": offset}) as r:
                    body = await r.read()
                    if r.status != 200:
                        errors += 1
                        statuses[r.status] = statuses.get(r.status, 0) + 1
                        if len(samples) < 3:
                            samples.append(body[:300])
                        break
                    latencies.append(time.perf_counter() - t0)
                    nbytes += len(body)
                    served += r.headers.get("Tiered-Served-By") is not None
                    offset = r.headers["Stream-Next-Offset"]

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(reader(session) for _ in range(args.concurrency)))
    if statuses:
        print(f"  {url}: errors by status {statuses}, e.g. {samples}", flush=True)
    return latencies, nbytes, errors, served


def fill(owner: str, streams: list[str], args: argparse.Namespace) -> None:
    piece = os.urandom(256 * 1024)
    for s in streams:
        req = urllib.request.Request(
            f"{owner}/v1/stream/{s}", method="PUT", headers={"Content-Type": "application/octet-stream"}
        )
        urllib.request.urlopen(req, timeout=30).close()
        for _ in range(args.stream_mib * 4):
            req = urllib.request.Request(
                f"{owner}/v1/stream/{s}",
                data=piece,
                method="POST",
                headers={"Content-Type": "application/octet-stream"},
            )
            urllib.request.urlopen(req, timeout=30).close()


def wait_cold(node: str, streams: list[str], args: argparse.Namespace, timeout: float) -> None:
    """Until a read near the end of every stream through ``node`` is served from the store."""
    near_end = format_offset(args.stream_mib * MiB - 3 * args.chunk_kib * 1024)
    deadline = time.monotonic() + timeout
    pending = list(streams)
    while pending and time.monotonic() < deadline:
        with urllib.request.urlopen(f"{node}/v1/stream/{pending[0]}?offset={near_end}", timeout=30) as r:
            if r.headers.get("Tiered-Served-By"):
                pending.pop(0)
                continue
        time.sleep(0.5)
    if pending:
        raise RuntimeError(f"streams never reached the cold tier: {pending}")


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    code = (
        "import logging, sys, time\n"
        "from moto.server import ThreadedMotoServer\n"
        "logging.getLogger('werkzeug').setLevel(logging.ERROR)\n"
        f"s = ThreadedMotoServer(ip_address='127.0.0.1', port={port}, verbose=False)\n"
        "s.start()\n"
        "sys.stdin.read()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, env={**os.environ, **ENV})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return proc, url
        except OSError as exc:
            if getattr(exc, "code", None) is not None:
                return proc, url  # an HTTP error: the server answers
            time.sleep(0.1)
    raise RuntimeError("moto did not start")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--stream-mib", type=int, default=16)
    parser.add_argument("--chunk-kib", type=int, default=256, help="read_chunk_bytes of the nodes")
    parser.add_argument("--read-cache-mib", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument(
        "--shards", type=int, default=1, help="1: the owner has one read cache, as the non-owner"
    )
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--wal-interval-ms", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import boto3

    for k, v in ENV.items():
        os.environ.setdefault(k, v)
    moto, s3_url = start_moto()
    rows: list[Row] = []
    try:
        boto3.client("s3", endpoint_url=s3_url, region_name=REGION).create_bucket(Bucket=BUCKET)
        prefix = f"bench-catchup-{uuid.uuid4().hex[:6]}"
        common = (
            "--flush-interval-s", "0.5", "--hot-retention-s", "0",
            "--read-chunk-bytes", str(args.chunk_kib * 1024),
            "--read-cache-bytes", str(args.read_cache_mib * MiB),
        )  # fmt: skip
        with tempfile.TemporaryDirectory(prefix="tiered-catchup-bench-") as tmp:
            nodes: list[NodeProc] = []
            try:
                for name, extra in (("n1", ()), ("n2", ()), ("n3", ("--cluster-locator-ttl-s", "0"))):
                    node = NodeProc(Path(tmp), name, s3_url, prefix, args, "local", (*common, *extra))
                    node.wait_up(60)
                    nodes.append(node)
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and nodes[0].serving() != set(range(args.shards)):
                    time.sleep(0.2)
                streams = [f"c{i}-{uuid.uuid4().hex[:6]}" for i in range(args.streams)]
                fill(nodes[0].url, streams, args)
                wait_cold(nodes[1].url, streams, args, 120)
                labels = {"n1": "owner", "n2": "non-owner, from the store", "n3": "non-owner, forwarded"}
                for node in nodes:
                    cpu0, owner0 = sum(n.cpu_s() for n in nodes), nodes[0].cpu_s()
                    t0 = time.monotonic()
                    lat, nbytes, errors, served = asyncio.run(read_load(node.url, streams, args))
                    took = time.monotonic() - t0
                    cpu1, owner1 = sum(n.cpu_s() for n in nodes), nodes[0].cpu_s()
                    lat.sort()
                    ok = len(lat)
                    row = Row(
                        via=labels[node.node],
                        reads=ok,
                        errors=errors,
                        reads_per_s=ok / took,
                        mib_per_s=nbytes / MiB / took,
                        p50_ms=1000 * statistics.median(lat) if lat else float("nan"),
                        p99_ms=1000 * lat[min(ok - 1, int(0.99 * ok))] if lat else float("nan"),
                        served_from_store=served / ok if ok else 0.0,
                        node_cpu_ms_per_read=1000 * (cpu1 - cpu0) / ok if ok else float("nan"),
                        owner_cpu_ms_per_read=1000 * (owner1 - owner0) / ok if ok else float("nan"),
                    )
                    rows.append(row)
                    print(
                        f"{row.via:>26}: {row.reads_per_s:7.0f} reads/s {row.mib_per_s:7.1f} MiB/s  "
                        f"p50 {row.p50_ms:6.1f} ms  p99 {row.p99_ms:6.1f} ms  "
                        f"from store {100 * row.served_from_store:5.1f} %  "
                        f"node CPU {row.node_cpu_ms_per_read:5.2f} ms/read "
                        f"(owner {row.owner_cpu_ms_per_read:5.2f})  errors {row.errors}",
                        flush=True,
                    )
                stats = get_json(nodes[1].url + "/readyz")["checks"]["catchup"]
                print(f"non-owner's catch-up counters: {stats}", flush=True)
            finally:
                for n in nodes:
                    n.stop()
    finally:
        if moto.stdin is not None:
            moto.stdin.close()
        moto.terminate()
        moto.wait(timeout=15)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
