#!/usr/bin/env python3
"""Cluster benchmark: 1, 2 and 3 ``tiered serve`` nodes side by side, in both durability modes.

For each durability mode (``local``, ``object-store``) and node count (1, 2,
3), in one run on this machine, the script

1. starts a moto S3 server in this process (one bucket; a fresh prefix per
   configuration) and the nodes (``--shards`` shards, lease TTL ``--ttl``),
   waits until every shard is served;
2. creates ``--streams`` streams and appends ``--body`` bytes from
   ``--concurrency`` client tasks through random nodes for ``--seconds``;
3. prints appends/s, append latency p50/p99 (client-measured, ms), and the CPU
   time the node processes used per append (user + system, from /proc);
4. with 2 or more nodes, SIGKILLs the owner of one stream and measures the
   takeover time: from the kill to the first acknowledged append to that
   stream through another node.

All processes share the machine's cores with moto and the load generator, so
throughput cannot scale with nodes here; the per-append CPU cost is the figure
to extrapolate from. Heavy: take /tmp/tiered-bench.lock first (docs/benchmarks.md).

    python bench/cluster.py --seconds 8 --json cluster.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

BUCKET = "tiered-bench"
REGION = "us-east-1"
ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}
TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def group_cpu_s(pgid: int) -> float:
    """User + system CPU seconds of every live process in a process group."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields[0] is the state: pgrp is the 5th field overall
            total += int(fields[11]) + int(fields[12])
    return total / TICKS


def get_json(url: str) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return dict(json.loads(resp.read()))
    except urllib.error.HTTPError as exc:
        return dict(json.loads(exc.read()))


class NodeProc:
    def __init__(
        self,
        base: Path,
        node: str,
        s3_url: str,
        prefix: str,
        args: argparse.Namespace,
        mode: str,
        extra: tuple[str, ...] = (),
    ):
        self.node = node
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(base / f"{node}.log", "ab")
        cmd = [
            sys.executable, "-m", "tiered.cli", "serve",
            "--host", "127.0.0.1", "--port", str(self.port), "--data-dir", str(base / node),
            "--cold-store", "s3", "--s3-bucket", BUCKET, "--s3-prefix", prefix,
            "--s3-endpoint", s3_url, "--s3-region", REGION, "--s3-addressing-style", "path",
            "--cluster-node-id", node, "--cluster-shards", str(args.shards),
            "--cluster-lease-ttl-s", str(args.ttl), "--durability", mode,
            "--cluster-wal-interval-ms", str(args.wal_interval_ms), "--log-level", "warning",
            *extra,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **ENV}, start_new_session=True
        )

    def wait_up(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"node {self.node} exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"node {self.node} did not come up")

    def serving(self) -> set[int]:
        try:
            return set(get_json(self.url + "/readyz")["checks"]["serving"])
        except OSError:
            return set()

    def cpu_s(self) -> float:
        return group_cpu_s(self.proc.pid)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(timeout=15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


@dataclass
class Result:
    mode: str
    nodes: int
    appends: int
    errors: int
    appends_per_s: float
    p50_ms: float
    p99_ms: float
    node_cpu_ms_per_append: float
    takeover_s: float | None


async def load(urls: list[str], streams: list[str], args: argparse.Namespace) -> tuple[list[float], int]:
    latencies: list[float] = []
    errors = 0
    body = os.urandom(args.body)
    deadline = time.monotonic() + args.seconds
    rng = random.Random(7)

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal errors
        while time.monotonic() < deadline:
            url = f"{rng.choice(urls)}/v1/stream/{rng.choice(streams)}"
            t0 = time.perf_counter()
            async with session.post(
                url, data=body, headers={"Content-Type": "application/octet-stream"}
            ) as r:
                await r.read()
                if r.status == 204:
                    latencies.append(time.perf_counter() - t0)
                else:
                    errors += 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(worker(session) for _ in range(args.concurrency)))
    return latencies, errors


def takeover(nodes: list[NodeProc], stream: str, shard_owner: NodeProc, timeout: float) -> float | None:
    """SIGKILL ``shard_owner``; seconds until an append to ``stream`` is acknowledged through another node."""
    other = next(n for n in nodes if n is not shard_owner)
    url = f"{other.url}/v1/stream/{stream}"
    killed = time.monotonic()
    os.killpg(shard_owner.proc.pid, signal.SIGKILL)
    while time.monotonic() - killed < timeout:
        req = urllib.request.Request(
            url, data=b"x", method="POST", headers={"Content-Type": "application/octet-stream"}
        )
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                if resp.status == 204:
                    return time.monotonic() - killed
        except (urllib.error.HTTPError, OSError):
            pass
        time.sleep(0.02)
    return None


def owner_of(nodes: list[NodeProc], stream: str) -> NodeProc | None:
    """The node that answers an append to ``stream`` locally (a 307 request names it)."""
    req = urllib.request.Request(
        f"{nodes[0].url}/v1/stream/{stream}?offset=-1", headers={"Tiered-Redirect": "307"}
    )

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *a: Any, **k: Any) -> None:
            return None

    try:
        urllib.request.build_opener(NoRedirect).open(req, timeout=5)
        return nodes[0]  # answered locally: the first node owns it
    except urllib.error.HTTPError as exc:
        location = exc.headers.get("Location", "")
        return next((n for n in nodes if location.startswith(n.url)), None)


def create(url: str, timeout: float = 30) -> None:
    """PUT a stream, retrying while its shard is still being placed (503)."""
    deadline = time.monotonic() + timeout
    while True:
        req = urllib.request.Request(url, method="PUT", headers={"Content-Type": "application/octet-stream"})
        try:
            urllib.request.urlopen(req, timeout=10).close()
            return
        except urllib.error.HTTPError as exc:
            if exc.code != 503 or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def run_config(s3_url: str, mode: str, count: int, args: argparse.Namespace) -> Result:
    prefix = f"bench-{mode}-{count}-{uuid.uuid4().hex[:6]}"
    with tempfile.TemporaryDirectory(prefix="tiered-cluster-bench-") as tmp:
        nodes: list[NodeProc] = []
        try:
            for i in range(count):
                node = NodeProc(
                    Path(tmp), f"n{i + 1}", s3_url, prefix, args, mode, tuple(args.node_args.split())
                )
                node.wait_up(60)
                nodes.append(node)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and set().union(*(n.serving() for n in nodes)) != set(
                range(args.shards)
            ):
                time.sleep(0.2)
            urls = [n.url for n in nodes]
            streams = [f"s{i}-{uuid.uuid4().hex[:6]}" for i in range(args.streams)]
            for s in streams:
                create(f"{urls[0]}/v1/stream/{s}")
            cpu0 = sum(n.cpu_s() for n in nodes)
            latencies, errors = asyncio.run(load(urls, streams, args))
            cpu1 = sum(n.cpu_s() for n in nodes)
            took: float | None = None
            if count >= 2 and mode == "object-store":
                owner = owner_of(nodes, streams[0])
                if owner is not None:
                    took = takeover(nodes, streams[0], owner, 30)
        finally:
            for n in nodes:
                n.stop()
    ok = len(latencies)
    lat = sorted(latencies)
    return Result(
        mode=mode,
        nodes=count,
        appends=ok,
        errors=errors,
        appends_per_s=ok / args.seconds,
        p50_ms=1000 * statistics.median(lat) if lat else float("nan"),
        p99_ms=1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else float("nan"),
        node_cpu_ms_per_append=1000 * (cpu1 - cpu0) / ok if ok else float("nan"),
        takeover_s=took,
    )


@dataclass
class AgeResult:
    age: str
    simulated: bool
    load_s: float
    chain_entries: list[int]  # the killed owner's shards: chain positions reached (about one per ship)
    gaps_s: list[float | None]  # per killed-owner shard: SIGKILL -> first acknowledged append there
    restore_s: list[float]  # the new owners' tiered_cluster_restore_seconds for those shards
    restore_objects: list[int]


def chain_tip(s3: Any, prefix: str, shard: int) -> int:
    """The highest position in a shard's manifest chain (the chain is pruned below checkpoints: a short list)."""
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}/_tiered/cluster/manifests/{shard:04d}/")
    names = [o["Key"].rsplit("/", 1)[-1] for o in listed.get("Contents", [])]
    return max((int(n.split(".")[0]) for n in names if n.endswith(".json")), default=0)


def stream_per_shard(shards: int) -> dict[int, str]:
    """One stream name per shard (the cluster's own hash)."""
    from tiered.cluster.membership.shards import shard_of
    from tiered.core.ids import DEFAULT_BUCKET

    out: dict[int, str] = {}
    i = 0
    while len(out) < shards:
        name = f"age-{i}"
        out.setdefault(shard_of(DEFAULT_BUCKET, name, shards), name)
        i += 1
    return out


def metric_samples(url: str, name: str) -> dict[str, float]:
    """``name``'s samples on a node's /metrics, by shard label."""
    out: dict[str, float] = {}
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return out
    for line in text.splitlines():
        if line.startswith(name + "{") and 'shard="' in line and 'kind="checkpoint"' not in line:
            shard = line.split('shard="', 1)[1].split('"', 1)[0]
            out[shard] = float(line.rsplit(" ", 1)[1])
    return out


async def probe_takeovers(urls: list[str], streams: list[str], timeout: float) -> list[float | None]:
    """Seconds from now until an append to each stream is acknowledged through a surviving node."""
    start = time.monotonic()

    async def one(session: aiohttp.ClientSession, i: int, stream: str) -> float | None:
        while time.monotonic() - start < timeout:
            url = f"{urls[i % len(urls)]}/v1/stream/{stream}"
            try:
                async with session.post(
                    url, data=b"x", headers={"Content-Type": "application/octet-stream"}
                ) as r:
                    await r.read()
                    if r.status == 204:
                        return time.monotonic() - start
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.02)
        return None

    timeout_cfg = aiohttp.ClientTimeout(total=5)
    async with aiohttp.ClientSession(timeout=timeout_cfg) as session:
        return list(await asyncio.gather(*(one(session, i, s) for i, s in enumerate(streams))))


def run_age(s3_url: str, s3: Any, label: str, args: argparse.Namespace) -> AgeResult:
    """One row: a fresh 3-node object-store cluster, loaded to the age, one owner SIGKILLed.

    ``Ns``: N seconds of load at the configured WAL interval. ``Nm*``/``Nh*``: simulated by chain
    length: appends to the victim's shards with a 5 ms WAL interval until their chains reached the ships
    N minutes or hours of steady appends make at the configured interval (for at most a fifth of the
    age, and --max-sim-s: the row reports the chain length reached).
    """
    simulated = label.endswith("*")
    unit = {"s": 1, "m": 60, "h": 3600}[label.rstrip("*")[-1]]
    age_s = float(label.rstrip("*")[:-1]) * unit
    target = int(age_s * 1000 / args.wal_interval_ms)
    prefix = f"bench-age-{label.rstrip('*')}-{uuid.uuid4().hex[:6]}"
    extra = (
        "--cluster-checkpoint-max-objects", str(args.checkpoint_max_objects),
        "--cluster-checkpoint-max-mib", str(args.checkpoint_max_mib),
    )  # fmt: skip
    sim_args = argparse.Namespace(**{**vars(args), "wal_interval_ms": 5}) if simulated else args
    per_shard = stream_per_shard(args.shards)
    kept = contextlib.nullcontext(tempfile.mkdtemp(prefix="age-", dir=args.keep)) if args.keep else None
    with kept or tempfile.TemporaryDirectory(prefix="tiered-cluster-age-") as tmp:
        nodes: list[NodeProc] = []
        try:
            for i in range(3):
                node = NodeProc(Path(tmp), f"n{i + 1}", s3_url, prefix, sim_args, "object-store", extra)
                node.wait_up(60)
                nodes.append(node)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and set().union(*(n.serving() for n in nodes)) != set(
                range(args.shards)
            ):
                time.sleep(0.2)
            urls = [n.url for n in nodes]
            streams = list(per_shard.values())
            for name in streams:
                create(
                    f"{urls[0]}/v1/stream/{name}", timeout=120
                )  # a loaded machine: placement settles slowly
            aged_shards = sorted(nodes[0].serving()) or list(range(args.shards))
            t0 = time.monotonic()
            if simulated:  # only one node's shards are aged (the ship rate is the store's, shared)
                aged = [per_shard[s] for s in aged_shards]
                while time.monotonic() - t0 < min(args.max_sim_s, age_s / 5):
                    load_args = argparse.Namespace(**{**vars(args), "seconds": 5.0})
                    asyncio.run(load(urls, aged, load_args))
                    if min(chain_tip(s3, prefix, shard) for shard in aged_shards) >= target:
                        break
            else:
                asyncio.run(load(urls, streams, argparse.Namespace(**{**vars(args), "seconds": age_s})))
            load_s = time.monotonic() - t0
            # The victim: the node holding most of the aged shards now (a loaded machine may have moved some).
            victim = max(nodes, key=lambda n: len(n.serving() & set(aged_shards)))
            shards = sorted(victim.serving())
            tips = [chain_tip(s3, prefix, shard) for shard in shards]
            survivors = [n for n in nodes if n is not victim]
            os.killpg(victim.proc.pid, signal.SIGKILL)
            gaps = asyncio.run(
                probe_takeovers([n.url for n in survivors], [per_shard[s] for s in shards], 60)
            )
            seconds: dict[str, float] = {}
            objects: dict[str, float] = {}
            for n in survivors:
                seconds.update(metric_samples(n.url, "tiered_cluster_restore_seconds"))
                objects.update(metric_samples(n.url, "tiered_cluster_restore_objects"))
            keys = [f"{s:04d}" for s in shards]
        finally:
            for n in nodes:
                n.stop()
    return AgeResult(
        label,
        simulated,
        load_s,
        tips,
        gaps,
        [seconds.get(k, float("nan")) for k in keys],
        [int(objects.get(k, -1)) for k in keys],
    )


def ages_main(s3_url: str, args: argparse.Namespace) -> list[AgeResult]:
    import boto3

    s3 = boto3.client("s3", endpoint_url=s3_url, region_name=REGION)
    results = []
    for _ in range(args.repeats):
        for label in args.ages.split(","):
            try:
                r = run_age(s3_url, s3, label, args)
            except (RuntimeError, OSError) as exc:  # a row that could not start (a churning cluster): said so
                print(f"age {label:>5}: not measured ({exc!r})", flush=True)
                continue
            results.append(r)
            if args.json:
                args.json.write_text(json.dumps([asdict(x) for x in results], indent=2))
            gaps = ", ".join("-" if g is None else f"{g:.2f}" for g in r.gaps_s)
            print(
                f"age {r.age:>5} (load {r.load_s:6.1f} s, chain {min(r.chain_entries, default=0)}-"
                f"{max(r.chain_entries, default=0)} entries): takeover gaps [{gaps}] s; restores "
                f"{', '.join(f'{x:.3f}' for x in r.restore_s)} s from {r.restore_objects} objects",
                flush=True,
            )
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", default="1,2,3")
    parser.add_argument("--modes", default="local,object-store")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--wal-interval-ms", type=int, default=200)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--body", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--ages",
        default="",
        help="takeover gap against shard age instead: e.g. 10s,100s,10m*,1h* (* simulated by chain length)",
    )
    parser.add_argument("--node-args", default="", help="more `tiered serve` options for every node")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--keep", help="put the age rows' node directories and logs here (kept)")
    parser.add_argument("--max-sim-s", type=float, default=600.0)
    parser.add_argument("--checkpoint-max-objects", type=int, default=16)
    parser.add_argument("--checkpoint-max-mib", type=int, default=32)
    args = parser.parse_args()

    import boto3
    from moto.server import ThreadedMotoServer

    for k, v in ENV.items():
        os.environ.setdefault(k, v)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access-log line per S3 request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    results: list[Result] = []
    try:
        host, port = server.get_host_and_port()
        s3_url = f"http://{host}:{port}"
        boto3.client("s3", endpoint_url=s3_url, region_name=REGION).create_bucket(Bucket=BUCKET)
        if args.ages:
            ages = ages_main(s3_url, args)
            if args.json:
                args.json.write_text(json.dumps([asdict(r) for r in ages], indent=2))
            return 0
        for mode in args.modes.split(","):
            for count in (int(n) for n in args.nodes.split(",")):
                r = run_config(s3_url, mode, count, args)
                results.append(r)
                print(
                    f"{r.mode:>12} {r.nodes} node(s): {r.appends_per_s:8.0f} appends/s  p50 {r.p50_ms:6.1f} ms  "
                    f"p99 {r.p99_ms:6.1f} ms  node CPU {r.node_cpu_ms_per_append:5.2f} ms/append  "
                    f"errors {r.errors}  takeover {'-' if r.takeover_s is None else f'{r.takeover_s:.2f} s'}",
                    flush=True,
                )
    finally:
        server.stop()
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
