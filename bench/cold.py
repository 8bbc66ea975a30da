#!/usr/bin/env python3
"""Cold-tier benchmark for ``tiered``: PUT economy, cold catch-up throughput, cold first-byte latency.

Everything runs on loopback. By default the object store is moto's S3 server
(``moto.server.ThreadedMotoServer``), started in a child process of its own so
that it does not share a GIL with the load generator; ``--stores local`` (or
``s3,local``) also measures the embedded local-directory store. Each phase
starts real ``tiered serve`` processes on a temporary data dir and drives them
over HTTP with aiohttp.

Phases (``--phases``, default all three):

``puts``
    ``--streams`` (1,000) streams receive ``--rounds`` appends of
    ``--record-bytes`` (1 KiB) each from ``--clients`` concurrent clients, with
    ``--flush-interval-s 1``. The script waits until every byte is in cold
    objects (it opens the objects and checks every stream's highest offset),
    then counts the objects (bucket listing / ``<data-dir>/cold/data``) and
    compares with ``ceil(bytes / --cold-object-bytes)``. Also reported: the
    S3 write requests seen by moto (objects above 8 MiB are multipart uploads:
    create + parts + complete) and per-MiB rates. One run per
    ``--put-variants`` entry: target object size, optionally flush bytes and
    flush interval (default: 16 MiB and 4 MiB at the 1 s interval, then both
    again size-driven: flush bytes = target, 30 s interval).

``reads``
    ``--read-streams`` (8) streams x ``--read-stream-mib`` (16 MiB) are
    preloaded with ``--hot-retention-s 0``, once per ``--preload`` layout
    (``concurrent``: all streams written at once, so each flush packs them
    into shared objects; ``sequential``: one after the other, so they get
    objects of their own). Once everything is cold and hot copies are trimmed,
    ``--repeat`` (5) rounds run, each: restart the server (empty cache), read
    every stream from ``offset=-1`` to the end over HTTP following
    ``Stream-Next-Offset`` (one reader per stream, all at once, content
    checked by sha256), then run the raw loops against the same endpoint with
    the same concurrency: (a) "replay": exactly the GETs this round's tiered
    read issued (recorded by the moto wrapper: same keys, same ranges), and
    (b) fixed ``--raw-range-bytes`` ranges over the same objects. Medians and
    the median per-round ratio are reported, one row per
    ``--read-chunk-bytes`` value. ``--profile py-spy|cprofile`` adds one more
    (untimed) read under a profiler and prints where the server's event loop
    spends its time.

``latency``
    ``--latency-streams`` small streams (``--latency-stream-bytes`` each,
    packed into shared objects by the flusher) plus the big streams of
    ``reads`` are read once each, sequentially, on a warm keep-alive
    connection, after a restart: time from sending ``GET ?offset=-1`` to the
    first body byte. Measured twice: with ``--read-cache-bytes 0`` (every
    request misses: footer and row groups are fetched) and with the default
    cache after a fresh restart (later streams may find a shared object's
    footer cached).

Notes on moto: its ranged GET copies the *whole* object out of its storage
and slices it, so one GET costs in proportion to the object size, not the
range size; and werkzeug closes the connection after every response, so each
GET is a new TCP connection. Both hit tiered and the raw loops alike, which is
why the raw baseline replays tiered's own GETs; the fixed range loop is shown
for reference. MB means 10**6 bytes, MiB 2**20.

The server's sources are copied at start and every ``tiered serve`` of the run
imports that copy (``--live-sources`` to disable), so edits to the working
tree during a run cannot mix versions. Results go to stdout as tables (progress
on stderr) and, with ``--json``, to a file.

Example::

    python bench/cold.py --json bench/results/cold.json
    python bench/cold.py --stores s3,local --phases reads --profile py-spy
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import os
import platform
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import aiohttp

MiB = 1024 * 1024
MB = 1_000_000
BUCKET = "tiered-bench"
REGION = "us-east-1"
CONTENT_TYPE = "application/octet-stream"

#: Fake credentials and an isolated AWS config, exactly like tests/support/s3_server.py.
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}
AWS_CLEARED = (
    "AWS_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
)

REQUEST_TIMEOUT_S = 120.0
MAX_READ_REQUESTS = 100_000
SERVER_START_TIMEOUT_S = 60.0
#: S3 requests billed in the PUT/COPY/POST/LIST class that a flush issues.
WRITE_OPS = ("PutObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload")


class BenchError(RuntimeError):
    """A phase could not complete (server died, timeout, wrong bytes, ...)."""


def log(msg: str) -> None:
    """Progress on stderr; tables and JSON go to stdout."""
    print(f"[cold] {msg}", file=sys.stderr, flush=True)


def parse_size(text: str) -> int:
    """``4MiB``, ``512KiB``, ``1M``, ``1048576`` -> bytes (K/M/G are binary)."""
    t = text.strip().lower().replace("ib", "").replace("b", "")
    mult = 1
    for suffix, m in (("k", 1024), ("m", MiB), ("g", 1024 * MiB)):
        if t.endswith(suffix):
            t, mult = t[:-1], m
            break
    try:
        value = float(t) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive: {text!r}")
    return int(value)


def fmt_size(n: int) -> str:
    if n % MiB == 0:
        return f"{n // MiB}MiB"
    if n % 1024 == 0:
        return f"{n // 1024}KiB"
    return str(n)


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0..100) of a sorted list (same rule as bench/run.py)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), math.ceil(q * len(sorted_values) / 100)))
    return sorted_values[rank - 1]


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process (all threads) from /proc, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields_ = f.read().rsplit(")", 1)[1].split()
        return (int(fields_[11]) + int(fields_[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def self_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def kill_group(proc: subprocess.Popen[bytes], grace_s: float = 20.0) -> int | None:
    """SIGTERM the child's process group, then SIGKILL it if it lingers."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(10)
    return proc.returncode


# =============================================================================
# moto S3 in a child process, with a request-counting WSGI wrapper


def classify_s3(method: str, path: str, query: dict[str, list[str]]) -> str:
    """Name the S3 operation of a path-style request (good enough for counting)."""
    has_key = "/" in path.strip("/")
    if method == "GET":
        return "GetObject" if has_key else "ListObjects"
    if method == "PUT":
        if "partNumber" in query and "uploadId" in query:
            return "UploadPart"
        return "PutObject" if has_key else "CreateBucket"
    if method == "POST":
        if "uploads" in query:
            return "CreateMultipartUpload"
        if "uploadId" in query:
            return "CompleteMultipartUpload"
        return "DeleteObjects" if "delete" in query else "Post"
    if method == "HEAD":
        return "HeadObject" if has_key else "HeadBucket"
    if method == "DELETE":
        return "AbortMultipartUpload" if "uploadId" in query else "DeleteObject"
    return method


class CountingApp:
    """WSGI middleware: counts requests and bytes per S3 operation, logs ranged GETs.

    ``GET /_bench/stats`` returns the counters as JSON (``?log=1`` adds the GET
    log: ``[path, range, bytes]``); ``POST /_bench/reset`` clears them. Bucket
    names cannot start with ``_``, so these never collide with S3 paths.
    """

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.counts: Counter[str] = Counter()
        self.bytes_out: Counter[str] = Counter()
        self.bytes_in: Counter[str] = Counter()
        self.busy_s: dict[str, float] = {}
        self.get_log: list[tuple[str, str, int]] = []
        self.peers: dict[str, set[str]] = {}  # op -> client (addr:port) seen: new TCP connections

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path: str = environ.get("PATH_INFO", "")
        if path.startswith("/_bench/"):
            return self._control(path, environ, start_response)
        query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        op = classify_s3(environ["REQUEST_METHOD"], path, query)
        t0 = time.perf_counter()
        body = self.app(environ, start_response)
        try:
            chunks = list(body)
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()
        n = sum(len(c) for c in chunks)
        with self.lock:
            self.counts[op] += 1
            self.bytes_out[op] += n
            self.bytes_in[op] += int(environ.get("CONTENT_LENGTH") or 0)
            self.busy_s[op] = self.busy_s.get(op, 0.0) + time.perf_counter() - t0
            self.peers.setdefault(op, set()).add(f"{environ.get('REMOTE_ADDR')}:{environ.get('REMOTE_PORT')}")
            if op == "GetObject":
                self.get_log.append((path, environ.get("HTTP_RANGE", ""), n))
        return chunks

    def _control(self, path: str, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        with self.lock:
            if path == "/_bench/reset":
                self.reset()
                payload: dict[str, Any] = {"ok": True}
            else:
                payload = {
                    "counts": dict(self.counts),
                    "bytes_out": dict(self.bytes_out),
                    "bytes_in": dict(self.bytes_in),
                    "busy_s": dict(self.busy_s),
                    "connections": {op: len(v) for op, v in self.peers.items()},
                }
                if "log=1" in environ.get("QUERY_STRING", ""):
                    payload["get_log"] = list(self.get_log)
        data = json.dumps(payload).encode()
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
        return [data]


def moto_child_main() -> int:
    """Entry point of the moto child process: serve until killed, print the port first."""
    import logging

    from moto.server import ThreadedMotoServer
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)

    class CountingMotoServer(ThreadedMotoServer):
        """ThreadedMotoServer whose WSGI app is wrapped in :class:`CountingApp`."""

        def _server_entry(self) -> None:
            from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

            app = CountingApp(DomainDispatcherApplication(create_backend_app))
            self._server = make_server(self._ip_address, self._port, app, True)
            self._server_ready_event.set()
            self._server.serve_forever()

    server = CountingMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    print(f"MOTO_PORT {port}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass
    server.stop()
    return 0


class MotoProcess:
    """moto's S3 server in a child process (own session, so its group can be killed)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, timeout_s: float = 60.0) -> MotoProcess:
        err = open(self.workdir / "moto.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--moto-child"],
            stdout=subprocess.PIPE,
            stderr=err,
            start_new_session=True,
            env={**os.environ, **AWS_ENV},
        )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        line = b""
        while time.monotonic() < deadline and not line.endswith(b"\n"):
            if self.proc.poll() is not None:
                raise BenchError(f"moto exited with {self.proc.returncode}: see {self.workdir / 'moto.log'}")
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.5)
            if ready:
                line += os.read(self.proc.stdout.fileno(), 256)
        if not line.startswith(b"MOTO_PORT "):
            raise BenchError(f"moto did not start: {line!r}")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"
        self._create_bucket()
        return self

    def _create_bucket(self) -> None:
        import boto3

        boto3.client("s3", endpoint_url=self.url, region_name=REGION).create_bucket(Bucket=BUCKET)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def _call(self, path: str, method: str = "GET") -> dict[str, Any]:
        req = urllib.request.Request(self.url + path, method=method, data=b"" if method == "POST" else None)
        with urllib.request.urlopen(req, timeout=30) as resp:
            result: dict[str, Any] = json.loads(resp.read())
            return result

    def reset(self) -> None:
        self._call("/_bench/reset", "POST")

    def stats(self, with_log: bool = False) -> dict[str, Any]:
        return self._call("/_bench/stats" + ("?log=1" if with_log else ""))

    def stop(self) -> None:
        if self.proc is not None:
            kill_group(self.proc, grace_s=5)


# =============================================================================
# the tiered server under test


class TieredServer:
    """``tiered serve`` as a child process in its own session, on a free loopback port."""

    def __init__(self, data_dir: Path, args: list[str], env: dict[str, str], label: str) -> None:
        self.data_dir = data_dir
        self.args = args
        self.env = env
        self.label = label
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}-server.log"
        self.wrapper: list[str] = []  # e.g. ["-m", "cProfile", "-o", FILE]

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> TieredServer:
        self.port = free_port()
        cmd = [
            sys.executable, *self.wrapper, "-m", "tiered.cli", "serve",
            "--host", "127.0.0.1", "--port", str(self.port), "--data-dir", str(self.data_dir),
            "--log-level", "warning", *self.args,
        ]  # fmt: skip
        logf = open(self.log_path, "ab")
        logf.write(f"\n=== {self.label}: {' '.join(cmd)}\n".encode())
        logf.flush()
        self.proc = subprocess.Popen(
            cmd, stdout=logf, stderr=subprocess.STDOUT, env={**os.environ, **self.env}, start_new_session=True
        )
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(f"tiered exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.base + "/healthz", timeout=1) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                time.sleep(0.05)
        raise BenchError(f"tiered did not come up in {SERVER_START_TIMEOUT_S}s:\n{self.log_tail()}")

    def stop(self) -> None:
        """Graceful stop (SIGTERM to the group: the server snapshots and exits)."""
        if self.proc is not None:
            rc = kill_group(self.proc)
            if rc not in (0, -signal.SIGTERM, None):
                log(f"warning: tiered ({self.label}) exited with {rc}:\n{self.log_tail()}")
            self.proc = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""


# =============================================================================
# looking into the object store from outside


class StoreProbe:
    """Lists and reads the objects one server wrote (an S3 prefix or a local dir)."""

    def __init__(
        self, kind: str, *, moto_url: str = "", prefix: str = "", data_dir: Path | None = None
    ) -> None:
        self.kind = kind
        self.moto_url = moto_url
        self.prefix = prefix
        self.data_dir = data_dir
        self._s3: Any = None

    def _client(self) -> Any:
        if self._s3 is None:
            import boto3

            self._s3 = boto3.client("s3", endpoint_url=self.moto_url, region_name=REGION)
        return self._s3

    def list_objects(self) -> list[tuple[str, int]]:
        """``[(key or path, size)]`` of every data object, sorted by key."""
        if self.kind == "local":
            assert self.data_dir is not None
            root = self.data_dir / "cold" / "data"
            return sorted((str(p), p.stat().st_size) for p in root.glob("*.parquet")) if root.exists() else []
        out: list[tuple[str, int]] = []
        token: str | None = None
        for _ in range(10_000):
            kwargs: dict[str, Any] = {"Bucket": BUCKET, "Prefix": self.prefix + "/data/"}
            if token:
                kwargs["ContinuationToken"] = token
            page = self._client().list_objects_v2(**kwargs)
            out.extend((o["Key"], int(o["Size"])) for o in page.get("Contents", []))
            token = page.get("NextContinuationToken")
            if not token:
                break
        return sorted(out)

    def read_object(self, key: str) -> bytes:
        if self.kind == "local":
            return Path(key).read_bytes()
        data: bytes = self._client().get_object(Bucket=BUCKET, Key=key)["Body"].read()
        return data

    def stream_ends(self, key: str) -> dict[str, tuple[int, int]]:
        """Per stream path in one object: (highest end offset, payload bytes)."""
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        table = pq.read_table(
            pa.BufferReader(self.read_object(key)), columns=["stream", "start_offset", "end_offset"]
        )
        table = table.append_column("len", pc.subtract(table["end_offset"], table["start_offset"]))
        agg = table.group_by("stream").aggregate([("end_offset", "max"), ("len", "sum")])
        return {
            s: (int(e), int(n))
            for s, e, n in zip(
                agg["stream"].to_pylist(),
                agg["end_offset_max"].to_pylist(),
                agg["len_sum"].to_pylist(),
                strict=True,
            )
        }

    def wait_all_cold(self, expected: dict[str, int], timeout_s: float) -> dict[str, Any]:
        """Poll until every stream's highest cold offset reaches its expected length.

        Opens each new object once. Returns layout facts (objects, streams per
        object, objects per stream).
        """
        seen: dict[str, dict[str, tuple[int, int]]] = {}
        cover: dict[str, int] = {}
        deadline = time.monotonic() + timeout_s
        t0 = time.monotonic()
        while True:
            for key, _size in self.list_objects():
                if key not in seen:
                    seen[key] = self.stream_ends(key)
                    for s, (end, _n) in seen[key].items():
                        cover[s] = max(cover.get(s, 0), end)
            missing = [s for s, n in expected.items() if cover.get(s, 0) < n]
            if not missing:
                break
            if time.monotonic() > deadline:
                raise BenchError(
                    f"{len(missing)} streams not fully cold after {timeout_s:.0f}s (e.g. {missing[0]}: "
                    f"{cover.get(missing[0], 0)} of {expected[missing[0]]} bytes)"
                )
            time.sleep(0.5)
        per_stream: Counter[str] = Counter()
        for ends in seen.values():
            per_stream.update(s for s in ends if s in expected)
        streams_per_obj = [len(v) for v in seen.values()]
        return {
            "wait_s": time.monotonic() - t0,
            "objects_seen": len(seen),
            "streams_per_object_mean": statistics.fmean(streams_per_obj) if streams_per_obj else 0.0,
            "objects_per_stream_mean": statistics.fmean(per_stream.values()) if per_stream else 0.0,
        }


# =============================================================================
# HTTP client helpers


def make_session(limit: int) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=limit)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S, connect=10.0)
    return aiohttp.ClientSession(
        connector=connector, timeout=timeout, headers={"Accept-Encoding": "identity"}, auto_decompress=False
    )


async def create_streams(session: aiohttp.ClientSession, urls: list[str], concurrency: int) -> None:
    sem = asyncio.Semaphore(concurrency)

    async def one(url: str) -> None:
        async with sem, session.put(url, headers={"Content-Type": CONTENT_TYPE}) as resp:
            if resp.status not in (200, 201):
                raise BenchError(f"PUT {url} -> {resp.status}: {(await resp.text())[:200]}")

    await asyncio.gather(*(one(u) for u in urls))


async def append(session: aiohttp.ClientSession, url: str, body: bytes) -> None:
    """One POST; retries (bounded) on 503 back-pressure."""
    for attempt in range(50):
        async with session.post(url, data=body, headers={"Content-Type": CONTENT_TYPE}) as resp:
            if resp.status in (200, 204):
                return
            text = await resp.text()
            if resp.status != 503:
                raise BenchError(f"POST {url} -> {resp.status}: {text[:200]}")
            await asyncio.sleep(min(float(resp.headers.get("Retry-After", "1")), 2.0) * (1 + attempt / 10))
    raise BenchError(f"POST {url}: still 503 after 50 attempts")


class RandomPool:
    """Incompressible payloads: slices of a random buffer at varying offsets."""

    def __init__(self, size: int = 8 * MiB, seed: int = 1) -> None:
        import random

        self.buf = random.Random(seed).randbytes(size)
        self.size = size

    def body(self, i: int, n: int) -> bytes:
        off = (i * 7919 * 64) % (self.size - n)
        return self.buf[off : off + n]


async def run_appends(session: aiohttp.ClientSession, jobs: list[tuple[str, bytes]], clients: int) -> float:
    """POST every ``(url, body)`` in order with ``clients`` workers; returns seconds."""
    it = iter(jobs)

    async def worker() -> None:
        for url, body in it:
            await append(session, url, body)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    return time.perf_counter() - t0


@dataclass
class ReadOutcome:
    bytes: int = 0
    requests: int = 0
    sha256: str = ""
    first_byte_s: float = 0.0


async def read_fully(session: aiohttp.ClientSession, url: str) -> ReadOutcome:
    """Catch-up read from ``offset=-1`` until ``Stream-Up-To-Date``; hashes the bytes."""
    out = ReadOutcome()
    h = hashlib.sha256()
    offset = "-1"
    t0 = time.perf_counter()
    for _ in range(MAX_READ_REQUESTS):
        async with session.get(url, params={"offset": offset}) as resp:
            if resp.status != 200:
                raise BenchError(f"GET {url}?offset={offset} -> {resp.status}: {(await resp.text())[:200]}")
            got = 0
            async for chunk in resp.content.iter_any():
                if out.requests == 0 and got == 0:
                    out.first_byte_s = time.perf_counter() - t0
                got += len(chunk)
                h.update(chunk)
            out.requests += 1
            out.bytes += got
            next_offset = resp.headers.get("Stream-Next-Offset", "")
            if resp.headers.get("Stream-Up-To-Date", "").lower() == "true":
                out.sha256 = h.hexdigest()
                return out
        if not next_offset or (next_offset == offset and got == 0):
            raise BenchError(f"GET {url}?offset={offset}: no progress")
        offset = next_offset
    raise BenchError(f"{url}: not up to date after {MAX_READ_REQUESTS} requests")


async def first_byte_latency(session: aiohttp.ClientSession, url: str) -> tuple[float, int]:
    """Seconds from sending ``GET ?offset=-1`` to the first body byte; and body size."""
    t0 = time.perf_counter()
    async with session.get(url, params={"offset": "-1"}) as resp:
        if resp.status != 200:
            raise BenchError(f"GET {url}?offset=-1 -> {resp.status}: {(await resp.text())[:200]}")
        first = await resp.content.readany()
        ttfb = time.perf_counter() - t0
        rest = await resp.read()
    return ttfb, len(first) + len(rest)


# =============================================================================
# raw ranged-GET loops (the baseline)


async def raw_s3_loop(moto_url: str, jobs: list[tuple[str, str]], concurrency: int) -> tuple[int, float]:
    """GET every ``(key, "bytes=a-b")`` with ``concurrency`` workers via aiobotocore; (bytes, s)."""
    import aioboto3
    from aiobotocore.config import AioConfig

    config = AioConfig(
        max_pool_connections=max(concurrency, 10),
        retries={"mode": "standard", "total_max_attempts": 1},
        s3={"addressing_style": "path"},
        connect_timeout=3,
        read_timeout=60,
    )
    async with aioboto3.Session(region_name=REGION).client("s3", endpoint_url=moto_url, config=config) as s3:
        # No warm-up: like the freshly restarted server, the timed loop opens its own connections.
        it = iter(jobs)
        total = 0

        async def worker() -> None:
            nonlocal total
            for key, rng in it:
                resp = await s3.get_object(Bucket=BUCKET, Key=key, Range=rng)
                async with resp["Body"] as body:
                    n = len(await body.read())
                total += n  # not `total += len(await ...)`: that loads total before the await

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return total, time.perf_counter() - t0


async def raw_local_loop(jobs: list[tuple[str, str]], concurrency: int) -> tuple[int, float]:
    """pread every ``(path, "bytes=a-b")`` in worker threads, ``concurrency`` at a time; (bytes, s)."""

    def one(path: str, rng: str) -> int:
        lo, hi = (int(x) for x in rng.removeprefix("bytes=").split("-"))
        fd = os.open(path, os.O_RDONLY)
        try:
            return len(os.pread(fd, hi + 1 - lo, lo))
        finally:
            os.close(fd)

    it = iter(jobs)
    total = 0

    async def worker() -> None:
        nonlocal total
        for path, rng in it:
            n = await asyncio.to_thread(one, path, rng)
            total += n

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return total, time.perf_counter() - t0


def fixed_range_jobs(objects: list[tuple[str, int]], range_bytes: int) -> list[tuple[str, str]]:
    """Every object cut into consecutive ``range_bytes`` ranges, object after object."""
    jobs = []
    for key, size in objects:
        for lo in range(0, size, range_bytes):
            jobs.append((key, f"bytes={lo}-{min(lo + range_bytes, size) - 1}"))
    return jobs


# =============================================================================
# profiling the server


def summarize_pyspy(raw_path: Path, top: int = 25) -> dict[str, Any]:
    """Where the server's busy samples went, from py-spy ``--threads --format raw`` output.

    Per thread: sample counts. For the event-loop thread (``MainThread``,
    where request handling, Parquet decoding and the S3 client run): self and
    inclusive shares per function. py-spy drops idle samples (threads
    sleeping in epoll or on a lock), so shares are of busy time.
    """
    threads: Counter[str] = Counter()
    self_c: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    for line in raw_path.read_text(errors="replace").splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        n = int(count_s)
        parts = stack.split(";")
        thread = "?"
        if parts and parts[0].startswith(("thread (", "process ")):
            thread = parts[0].split(": ", 1)[-1]
            parts = parts[1:]
        threads[thread] += n
        if thread != "MainThread" or not parts:
            continue
        frames = [_frame_key(f) for f in parts]
        self_c[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    main = threads.get("MainThread", 0)

    def share(c: int) -> float:
        return round(100.0 * c / main, 1) if main else 0.0

    return {
        "samples_by_thread": dict(threads.most_common()),
        "self_pct": [(f, share(c)) for f, c in self_c.most_common(top)],
        "inclusive_pct": [(f, share(c)) for f, c in incl.most_common(top * 2)],
    }


def _frame_key(frame: str) -> str:
    """``func (path/to/file.py:123)`` -> ``func (file.py)``; thread labels kept."""
    name, _, where = frame.partition(" (")
    if not where:
        return frame
    file = where.rstrip(")").rsplit(":", 1)[0]
    parts = file.split("/")
    short = "/".join(parts[-2:]) if len(parts) > 1 else file
    return f"{name} ({short})"


def summarize_cprofile(path: Path, top: int = 25) -> dict[str, Any]:
    import pstats

    st = pstats.Stats(str(path))
    stats: dict[Any, Any] = st.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in stats.values()) or 1.0
    rows = [(f"{fn[2]} ({'/'.join(fn[0].split('/')[-2:])}:{fn[1]})", v[2], v[3]) for fn, v in stats.items()]
    by_self = sorted(rows, key=lambda r: -r[1])[:top]
    by_cum = sorted(rows, key=lambda r: -r[2])[: top * 2]
    return {
        "total_self_s": round(total, 3),
        "self_pct": [(n, round(100 * s / total, 1)) for n, s, _ in by_self],
        "inclusive_pct": [(n, round(100 * c / total, 1)) for n, _, c in by_cum],
        "note": "cProfile sees the main thread only (the event loop); to_thread work is not included",
    }


# =============================================================================
# the benchmark


@dataclass
class Params:
    """Everything that shapes a run (mirrors the command-line flags)."""

    stores: list[str]
    phases: list[str]
    streams: int
    record_bytes: int
    rounds: int
    clients: int
    put_variants: list[tuple[int, int | None, float | None]]
    flush_interval_s: float
    read_streams: int
    read_stream_bytes: int
    read_record_bytes: int
    read_chunk_bytes: list[int]
    raw_range_bytes: list[int]
    read_concurrency: int
    latency_streams: int
    latency_stream_bytes: int
    repeat: int
    preload: list[str]
    profile: str
    flush_timeout_s: float
    fsync: str
    workdir: Path
    keep: bool
    extra_server_args: list[str] = field(default_factory=list)


class ColdBench:
    """Runs the phases for each store and collects a JSON-able result dict."""

    def __init__(self, p: Params) -> None:
        self.p = p
        self.moto: MotoProcess | None = None
        self.servers: list[TieredServer] = []
        self.pool = RandomPool()
        self.results: dict[str, Any] = {"stores": {}}

    # ------------------------------------------------------------------ plumbing

    def server(self, store: str, data_dir: Path, prefix: str, args: list[str], label: str) -> TieredServer:
        base = ["--fsync", self.p.fsync]
        if "--flush-interval-s" not in args:
            base += ["--flush-interval-s", str(self.p.flush_interval_s)]
        if store == "s3":
            assert self.moto is not None
            base += [
                "--cold-store", "s3", "--s3-bucket", BUCKET, "--s3-prefix", prefix,
                "--s3-endpoint", self.moto.url, "--s3-path-style", "true", "--s3-region", REGION,
            ]  # fmt: skip
        else:
            base += ["--cold-store", "local"]
        srv = TieredServer(data_dir, base + args + self.p.extra_server_args, AWS_ENV, label)
        self.servers.append(srv)
        return srv

    def probe(self, store: str, data_dir: Path, prefix: str) -> StoreProbe:
        if store == "s3":
            assert self.moto is not None
            return StoreProbe("s3", moto_url=self.moto.url, prefix=prefix)
        return StoreProbe("local", data_dir=data_dir)

    def cleanup(self) -> None:
        for srv in self.servers:
            try:
                srv.stop()
            except Exception as exc:  # keep cleaning up the rest
                log(f"could not stop {srv.label}: {exc}")
        if self.moto is not None:
            self.moto.stop()

    def run(self) -> dict[str, Any]:
        try:
            if "s3" in self.p.stores:
                self.moto = MotoProcess(self.p.workdir).start()
                log(f"moto S3 at {self.moto.url} (pid {self.moto.pid})")
            for store in self.p.stores:
                res: dict[str, Any] = {}
                self.results["stores"][store] = res
                if "puts" in self.p.phases:
                    res["puts"] = [self.phase_puts(store, t, fb, iv) for t, fb, iv in self.p.put_variants]
                if "reads" in self.p.phases or "latency" in self.p.phases:
                    res["reads"] = [self.phase_reads(store, layout) for layout in self.p.preload]
        finally:
            self.cleanup()
        return self.results

    # ------------------------------------------------------------------ phase 1

    def phase_puts(
        self, store: str, target: int, flush_bytes: int | None, interval: float | None
    ) -> dict[str, Any]:
        p = self.p
        interval = interval or p.flush_interval_s
        label = (
            f"{fmt_size(target)}" + (f"-fb{fmt_size(flush_bytes)}" if flush_bytes else "") + f"-{interval:g}s"
        )
        data_dir = p.workdir / f"{store}-puts-{label}"
        args = ["--cold-object-bytes", str(target), "--flush-interval-s", str(interval)]
        if flush_bytes:
            args += ["--flush-bytes", str(flush_bytes)]
        srv = self.server(store, data_dir, label, args, label)
        probe = self.probe(store, data_dir, label)
        log(f"[{store}] {label}: {p.streams} streams x {p.rounds} x {p.record_bytes} B, {p.clients} clients")
        if self.moto is not None and store == "s3":
            self.moto.reset()
        srv.start()
        try:
            names = [f"p{i:05d}" for i in range(p.streams)]
            urls = [f"{srv.base}/v1/stream/{n}" for n in names]
            jobs = [
                (urls[s], self.pool.body(r * p.streams + s, p.record_bytes))
                for r in range(p.rounds)
                for s in range(p.streams)
            ]
            total = len(jobs) * p.record_bytes

            async def drive() -> float:
                async with make_session(p.clients) as session:
                    await create_streams(session, urls, 64)
                    return await run_appends(session, jobs, p.clients)

            append_s = asyncio.run(drive())
            log(f"  appended {total / MiB:.1f} MiB in {append_s:.1f}s; waiting for the flusher")
            layout = probe.wait_all_cold(
                {n: p.rounds * p.record_bytes for n in names}, p.flush_timeout_s + interval
            )
            time.sleep(min(interval, 5.0) + 0.5)  # let a straggler pass (if any) land before counting
            objects = probe.list_objects()
            moto_stats = self.moto.stats() if (self.moto is not None and store == "s3") else None
        finally:
            srv.stop()
        flushed_mib = total / MiB
        ideal = math.ceil(total / target)
        intervals = math.ceil(append_s / interval)
        sizes = sorted(s for _, s in objects)
        out: dict[str, Any] = {
            "label": label,
            "cold_object_bytes": target,
            "flush_bytes": flush_bytes or 8 * MiB,
            "flush_interval_s": interval,
            "streams": p.streams,
            "record_bytes": p.record_bytes,
            "appends": len(jobs),
            "payload_bytes": total,
            "append_s": round(append_s, 3),
            "append_mib_s": round(flushed_mib / append_s, 2),
            "flush_wait_s": round(layout["wait_s"], 2),
            "objects": len(objects),
            "ideal_objects": ideal,
            "objects_vs_ideal": round(len(objects) / ideal, 2),
            "flush_intervals_during_appends": intervals,
            "objects_per_mib": round(len(objects) / flushed_mib, 4),
            "object_bytes_total": sum(sizes),
            "object_mib_min_median_max": [round(sizes[0] / MiB, 2), round(statistics.median(sizes) / MiB, 2),
                                          round(sizes[-1] / MiB, 2)] if sizes else [],
            "streams_per_object_mean": round(layout["streams_per_object_mean"], 1),
            "objects_per_stream_mean": round(layout["objects_per_stream_mean"], 2),
        }  # fmt: skip
        if moto_stats is not None:
            counts = moto_stats["counts"]
            writes = {op: counts.get(op, 0) for op in WRITE_OPS}
            out["s3_write_requests"] = sum(writes.values())
            out["s3_write_requests_by_op"] = writes
            out["s3_write_requests_per_mib"] = round(out["s3_write_requests"] / flushed_mib, 4)
            out["s3_other_requests"] = {k: v for k, v in counts.items() if k not in WRITE_OPS}
        log(
            f"  {len(objects)} objects (ideal {ideal}); {out.get('s3_write_requests', '-')} S3 write requests"
        )
        return out

    # ------------------------------------------------------------------ phases 2 + 3

    def phase_reads(self, store: str, layout: str) -> dict[str, Any]:
        p = self.p
        prefix = f"reads-{layout}"
        data_dir = p.workdir / f"{store}-{prefix}"
        base_args = ["--hot-retention-s", "0"]
        srv = self.server(store, data_dir, prefix, base_args, "reads-preload")
        probe = self.probe(store, data_dir, prefix)
        big = [f"big-{i:02d}" for i in range(p.read_streams)]
        small = [f"small-{i:03d}" for i in range(p.latency_streams if "latency" in p.phases else 0)]
        expected = {n: p.read_stream_bytes for n in big} | {n: p.latency_stream_bytes for n in small}
        digests: dict[str, str] = {}
        out: dict[str, Any] = {}

        # --- preload: one writer per stream, all at once; then wait until all is cold
        log(f"[{store}] {layout} preload {len(big)} x {p.read_stream_bytes / MiB:.0f} MiB + {len(small)} x "
            f"{p.latency_stream_bytes / 1024:.0f} KiB in {p.read_record_bytes // 1024} KiB appends")  # fmt: skip
        srv.start()
        try:
            jobs_by_stream: dict[str, list[bytes]] = {}
            for si, n in enumerate(big + small):
                bodies = []
                for k in range(0, expected[n], p.read_record_bytes):
                    size = min(p.read_record_bytes, expected[n] - k)
                    bodies.append(self.pool.body(si * 100_003 + k // 64, size))
                jobs_by_stream[n] = bodies
                digests[n] = hashlib.sha256(b"".join(bodies)).hexdigest()

            async def preload() -> float:
                async with make_session(len(jobs_by_stream)) as session:
                    await create_streams(session, [f"{srv.base}/v1/stream/{n}" for n in jobs_by_stream], 32)

                    async def writer(n: str) -> None:
                        for b in jobs_by_stream[n]:
                            await append(session, f"{srv.base}/v1/stream/{n}", b)

                    t0 = time.perf_counter()
                    if layout == "sequential":
                        for n in jobs_by_stream:
                            await writer(n)
                    else:
                        await asyncio.gather(*(writer(n) for n in jobs_by_stream))
                    return time.perf_counter() - t0

            preload_s = asyncio.run(preload())
            placed = probe.wait_all_cold(expected, p.flush_timeout_s)
            time.sleep(p.flush_interval_s * 2 + 0.5)  # the pass after the last flush trims hot copies
        finally:
            srv.stop()
        objects = probe.list_objects()
        out["dataset"] = {
            "big_streams": len(big),
            "big_stream_bytes": p.read_stream_bytes,
            "small_streams": len(small),
            "small_stream_bytes": p.latency_stream_bytes,
            "record_bytes": p.read_record_bytes,
            "preload": layout,
            "preload_s": round(preload_s, 2),
            "objects": len(objects),
            "object_bytes_total": sum(s for _, s in objects),
            "objects_per_big_stream_mean": round(placed["objects_per_stream_mean"], 2),
            "streams_per_object_mean": round(placed["streams_per_object_mean"], 1),
        }
        log(f"  {len(objects)} objects, {sum(s for _, s in objects) / MiB:.1f} MiB; all cold")

        if "latency" in p.phases:
            out["latency"] = [
                self._latency(store, data_dir, prefix, base_args, big, small, cache) for cache in ("0", None)
            ]
        if "reads" in p.phases:
            out["throughput"] = [
                self._throughput(store, data_dir, prefix, base_args, big, digests, chunk)
                for chunk in p.read_chunk_bytes
            ]
            if p.profile != "none":
                out["profile"] = self._profile(
                    store, data_dir, prefix, base_args, big, p.read_chunk_bytes[0], layout
                )
        return out

    def _latency(
        self, store: str, data_dir: Path, prefix: str, base_args: list[str],
        big: list[str], small: list[str], cache: str | None,
    ) -> dict[str, Any]:  # fmt: skip
        args = list(base_args) + (["--read-cache-bytes", cache] if cache is not None else [])
        label = "latency-nocache" if cache == "0" else "latency-defaultcache"
        srv = self.server(store, data_dir, prefix, args, label)
        srv.start()
        try:
            if self.moto is not None and store == "s3":
                self.moto.reset()

            async def measure() -> dict[str, list[float]]:
                res: dict[str, list[float]] = {"small": [], "big": []}
                async with make_session(1) as session:
                    async with session.get(srv.base + "/healthz") as r:  # warm the one connection
                        await r.read()
                    for kind, names in (("small", small), ("big", big)):
                        for n in names:
                            ttfb, _ = await first_byte_latency(session, f"{srv.base}/v1/stream/{n}")
                            res[kind].append(ttfb * 1000)
                return res

            lat = asyncio.run(measure())
            gets = self.moto.stats()["counts"].get("GetObject", 0) if (self.moto and store == "s3") else None
        finally:
            srv.stop()
        summary: dict[str, Any] = {
            "read_cache_bytes": "0" if cache == "0" else "default (64MiB)",
            "s3_gets": gets,
            # The first cold read after a restart also pays for the S3 client's connection pool.
            "first_request_ms": round((lat["small"] or lat["big"])[0], 2),
        }
        for kind in ("small", "big"):
            values = lat[kind]
            s = sorted(values)
            summary[kind] = {
                "n": len(s),
                "p50_ms": round(percentile(s, 50), 2),
                "p99_ms": round(percentile(s, 99), 2),
                "max_ms": round(s[-1], 2) if s else None,
                "mean_ms": round(statistics.fmean(s), 2) if s else None,
            }
        log(f"  TTFB ({summary['read_cache_bytes']} cache): small p50 {summary['small']['p50_ms']} ms "
            f"p99 {summary['small']['p99_ms']} ms; big p50 {summary['big']['p50_ms']} ms")  # fmt: skip
        return summary

    def _tiered_read(
        self, store: str, data_dir: Path, prefix: str, args: list[str], big: list[str],
        digests: dict[str, str], label: str, wrapper: list[str] | None = None,
        on_start: Callable[[TieredServer], None] | None = None, on_done: Callable[[], None] | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Restart (cold cache), read every big stream concurrently, return timings and store stats."""
        p = self.p
        srv = self.server(store, data_dir, prefix, args, label)
        if wrapper:
            srv.wrapper = wrapper
        srv.start()
        try:
            if self.moto is not None and store == "s3":
                self.moto.reset()
            cpu_srv0 = cpu_seconds(srv.pid)
            cpu_moto0 = cpu_seconds(self.moto.pid) if (self.moto and store == "s3") else None
            cpu_self0 = self_cpu_seconds()

            async def read_all() -> tuple[float, list[ReadOutcome]]:
                async with make_session(p.read_concurrency) as session:
                    sem = asyncio.Semaphore(p.read_concurrency)

                    async def one(n: str) -> ReadOutcome:
                        async with sem:
                            return await read_fully(session, f"{srv.base}/v1/stream/{n}")

                    t0 = time.perf_counter()
                    res = await asyncio.gather(*(one(n) for n in big))
                    return time.perf_counter() - t0, res

            if on_start is not None:
                on_start(srv)
            seconds, outcomes = asyncio.run(read_all())
            if on_done is not None:
                on_done()
            cpu = {
                "server_s": _delta(cpu_seconds(srv.pid), cpu_srv0),
                "moto_s": _delta(cpu_seconds(self.moto.pid), cpu_moto0)
                if (self.moto and store == "s3")
                else None,
                "client_s": round(self_cpu_seconds() - cpu_self0, 2),
            }
            stats = self.moto.stats(with_log=True) if (self.moto and store == "s3") else None
        finally:
            srv.stop()
        for n, o in zip(big, outcomes, strict=True):
            if digests and o.sha256 != digests[n]:
                raise BenchError(f"{n}: read {o.bytes} bytes with the wrong content (sha256 mismatch)")
        total = sum(o.bytes for o in outcomes)
        res: dict[str, Any] = {
            "bytes": total,
            "seconds": seconds,
            "mb_s": total / MB / seconds,
            "http_requests": sum(o.requests for o in outcomes),
            "cpu": cpu,
        }
        if stats is not None:
            res["s3_gets"] = stats["counts"].get("GetObject", 0)
            res["s3_get_bytes"] = stats["bytes_out"].get("GetObject", 0)
            res["s3_connections"] = stats.get("connections", {}).get("GetObject", 0)
            res["moto_busy_s"] = round(stats["busy_s"].get("GetObject", 0.0), 2)
            res["get_log"] = stats["get_log"]
        return res

    def _throughput(
        self, store: str, data_dir: Path, prefix: str, base_args: list[str],
        big: list[str], digests: dict[str, str], chunk: int,
    ) -> dict[str, Any]:  # fmt: skip
        """``--repeat`` rounds of: tiered read (after a restart), then each raw loop once.

        Interleaving keeps slow drifts (moto's heap, page cache, other load)
        from favouring one side; the replay of a round uses the GETs that
        round's tiered read issued.
        """
        p = self.p
        args = base_args + ["--read-chunk-bytes", str(chunk)]
        objects_all = self.probe(store, data_dir, prefix).list_objects()
        sizes = dict(objects_all)
        tiered_runs: list[dict[str, Any]] = []
        raw_runs: dict[str, list[dict[str, Any]]] = {}
        for r in range(p.repeat):
            run = self._tiered_read(
                store, data_dir, prefix, args, big, digests, f"read-{fmt_size(chunk)}-{r}"
            )
            tiered_runs.append(run)
            msg = f"  [{store}] read_chunk={fmt_size(chunk)} round {r + 1}: tiered {run['mb_s']:.1f} MB/s"
            loops: list[tuple[str, list[tuple[str, str]]]] = []
            if store == "s3":
                replay = [(path.split("/", 2)[2], rng) for path, rng, _ in run["get_log"]]
                loops.append(("replay", replay))
                objects = [(k, sizes[k]) for k in sorted({k for k, _ in replay})]
            else:
                objects = objects_all
            for rb in p.raw_range_bytes:
                loops.append((f"ranges-{fmt_size(rb)}", fixed_range_jobs(objects, rb)))
            for name, jobs in loops:
                raw = self._raw(store, jobs)
                raw["ratio"] = run["mb_s"] / raw["mb_s"]
                raw_runs.setdefault(name, []).append(raw)
                msg += f"; {name} {raw['mb_s']:.1f} MB/s ({raw['ratio'] * 100:.0f}%)"
            log(msg)
        ref = tiered_runs[0]
        tiered_mb_s = statistics.median(r["mb_s"] for r in tiered_runs)
        server_cpu = [r["cpu"]["server_s"] for r in tiered_runs if r["cpu"]["server_s"] is not None]
        out: dict[str, Any] = {
            "read_chunk_bytes": chunk,
            "tiered_mb_s": round(tiered_mb_s, 1),
            "tiered_runs_mb_s": [round(r["mb_s"], 1) for r in tiered_runs],
            "tiered_seconds_median": round(statistics.median(r["seconds"] for r in tiered_runs), 3),
            "bytes": ref["bytes"],
            "http_requests": ref["http_requests"],
            "tiered_cpu": [r["cpu"] for r in tiered_runs],
            "server_cpu_s_median": statistics.median(server_cpu) if server_cpu else None,
        }
        if store == "s3":
            log_entries = ref["get_log"]
            if ref["s3_get_bytes"] < 0.9 * ref["bytes"]:
                log(
                    f"  WARNING: only {ref['s3_get_bytes']} bytes came from S3 for {ref['bytes']} read: hot copies?"
                )
            out["s3_gets"] = ref["s3_gets"]
            out["s3_connections"] = ref["s3_connections"]
            out["s3_get_bytes"] = ref["s3_get_bytes"]
            out["s3_get_mean_bytes"] = round(ref["s3_get_bytes"] / max(1, ref["s3_gets"]))
            out["s3_bytes_per_payload_byte"] = round(ref["s3_get_bytes"] / ref["bytes"], 3)
            out["s3_small_gets"] = sum(1 for _, _, n in log_entries if n < 64 * 1024)  # footers mostly
            fetched: set[tuple[str, str]] = set()
            dup_gets = dup_bytes = 0
            for path, rng, n in log_entries:  # the same range fetched again (concurrent misses, evictions)
                if (path, rng) in fetched:
                    dup_gets, dup_bytes = dup_gets + 1, dup_bytes + n
                fetched.add((path, rng))
            out["s3_repeated_gets"] = dup_gets
            out["s3_repeated_get_bytes"] = dup_bytes
            out["moto_busy_s"] = ref["moto_busy_s"]
            if p.keep:
                (p.workdir / f"{prefix}-getlog-{fmt_size(chunk)}.json").write_text(json.dumps(log_entries))
        out["raw"] = {}
        for name, runs in raw_runs.items():
            mb_s = statistics.median(x["mb_s"] for x in runs)
            out["raw"][name] = {
                "gets": runs[0]["gets"],
                "bytes": runs[0]["bytes"],
                "mb_s": round(mb_s, 1),
                "runs_mb_s": [round(x["mb_s"], 1) for x in runs],
                "moto_cpu_s": [x["moto_cpu_s"] for x in runs],
                "tiered_vs_raw": round(tiered_mb_s / mb_s, 3),
                "round_ratios": [round(x["ratio"], 3) for x in runs],
                "round_ratio_median": round(statistics.median(x["ratio"] for x in runs), 3),
            }
        return out

    def _raw(self, store: str, jobs: list[tuple[str, str]]) -> dict[str, Any]:
        """One raw ranged-GET loop over ``jobs`` with the readers' concurrency."""
        conc = self.p.read_concurrency
        if store == "s3":
            assert self.moto is not None
            cpu0 = cpu_seconds(self.moto.pid)
            nbytes, secs = asyncio.run(raw_s3_loop(self.moto.url, jobs, conc))
            cpu = _delta(cpu_seconds(self.moto.pid), cpu0)
        else:
            nbytes, secs = asyncio.run(raw_local_loop(jobs, conc))
            cpu = None
        return {
            "gets": len(jobs),
            "bytes": nbytes,
            "seconds": secs,
            "mb_s": nbytes / MB / secs,
            "moto_cpu_s": cpu,
        }

    def _profile(
        self, store: str, data_dir: Path, prefix: str, base_args: list[str], big: list[str], chunk: int,
        layout: str,
    ) -> dict[str, Any]:  # fmt: skip
        """One more (untimed) cold read with the server under a profiler."""
        p = self.p
        args = base_args + ["--read-chunk-bytes", str(chunk)]
        prof_dir = p.workdir / f"{store}-profile-{layout}"
        prof_dir.mkdir(parents=True, exist_ok=True)
        log(f"  [{store}] profiling one cold read (read_chunk={fmt_size(chunk)}) with {p.profile}")
        if p.profile == "cprofile":
            out_file = prof_dir / "server.pstats"
            run = self._tiered_read(
                store,
                data_dir,
                prefix,
                args,
                big,
                {},
                "profile",
                wrapper=["-m", "cProfile", "-o", str(out_file)],
            )
            summary = summarize_cprofile(out_file)
            summary.update(file=str(out_file), read_s=round(run["seconds"], 2), mb_s=round(run["mb_s"], 1))
            return summary
        if shutil.which("py-spy") is None:
            return {"error": "py-spy not found on PATH (pip install py-spy)"}
        raw = prof_dir / "server.pyspy.txt"
        holder: dict[str, subprocess.Popen[bytes]] = {}

        def start_spy(srv: TieredServer) -> None:
            holder["spy"] = subprocess.Popen(
                ["py-spy", "record", "--pid", str(srv.pid), "--format", "raw", "-o", str(raw),
                 "--rate", "250", "--threads", "--nonblocking"],
                stdout=subprocess.DEVNULL, stderr=open(prof_dir / "py-spy.log", "ab"), start_new_session=True,
            )  # fmt: skip
            time.sleep(1.0)  # let py-spy attach before the read starts

        def stop_spy() -> None:
            spy = holder.get("spy")
            if spy is not None and spy.poll() is None:
                spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
                try:
                    spy.wait(30)
                except subprocess.TimeoutExpired:
                    kill_group(spy, 1)

        try:
            run = self._tiered_read(store, data_dir, prefix, args, big, {}, "profile", on_start=start_spy,
                                    on_done=stop_spy)  # fmt: skip
        finally:
            stop_spy()
        if not raw.exists():
            return {"error": f"py-spy wrote nothing; see {prof_dir / 'py-spy.log'}"}
        summary = summarize_pyspy(raw)
        summary.update(
            file=str(raw),
            read_s=round(run["seconds"], 2),
            mb_s=round(run["mb_s"], 1),
            rate_hz=250,
            cpu=run["cpu"],
        )
        return summary


def _delta(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else round(after - before, 2)


# =============================================================================
# output


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def render_puts(store: str, puts: list[dict[str, Any]]) -> list[str]:
    rows = []
    for v in puts:
        rows.append([
            v["label"], f"{v['payload_bytes'] / MiB:.1f}", f"{v['append_s']:.1f}",
            str(v["flush_intervals_during_appends"]),
            str(v["objects"]), str(v["ideal_objects"]), f"{v['objects_vs_ideal']:.2f}",
            f"{v['objects_per_mib']:.3f}", str(v.get("s3_write_requests", "-")),
            f"{v['s3_write_requests_per_mib']:.3f}" if "s3_write_requests_per_mib" in v else "-",
            f"{v['streams_per_object_mean']:.0f}", "/".join(f"{x:g}" for x in v["object_mib_min_median_max"]),
        ])  # fmt: skip
    headers = ["object-flushbytes-interval", "MiB", "append s", "intervals", "objects", "ideal", "obj/ideal", "obj/MiB", "S3 writes",
               "writes/MiB", "streams/obj", "obj MiB min/med/max"]  # fmt: skip
    return [f"\n== {store}: PUTs per flushed MiB ({puts[0]['streams']} streams) ==", table(headers, rows)]


def render_reads(store: str, r: dict[str, Any]) -> list[str]:
    d = r["dataset"]
    out = [
        f"\n== {store}, {d['preload']} preload: {d['big_streams']} x {d['big_stream_bytes'] / MiB:.0f} MiB "
        f"+ {d['small_streams']} x {d['small_stream_bytes'] / 1024:.0f} KiB in {d['objects']} objects "
        f"({d['object_bytes_total'] / MiB:.1f} MiB), {d['objects_per_big_stream_mean']} objects per big stream"
    ]
    if "throughput" in r:
        out.append("cold catch-up read throughput, MB/s (median of runs):")
        rows = []
        for t in r["throughput"]:
            for name, raw in t["raw"].items():
                rows.append([
                    fmt_size(t["read_chunk_bytes"]), f"{t['tiered_mb_s']:.1f}", str(t.get("s3_gets", "-")),
                    f"{t.get('s3_bytes_per_payload_byte', float('nan')):.2f}", name, str(raw["gets"]),
                    f"{raw['mb_s']:.1f}", f"{raw['tiered_vs_raw'] * 100:.0f}%",
                    f"{raw['round_ratio_median'] * 100:.0f}%",
                ])  # fmt: skip
        out.append(table(["read chunk", "tiered", "tiered GETs", "S3 B/B read", "raw loop", "raw GETs",
                          "raw", "tiered/raw", "per-round"], rows))  # fmt: skip
    if "latency" in r:
        out.append("cold first-byte latency, GET ?offset=-1 after a restart, sequential (ms):")
        rows = []
        for lat in r["latency"]:
            for kind in ("small", "big"):
                v = lat[kind]
                if v["n"]:
                    rows.append([lat["read_cache_bytes"], kind, str(v["n"]), f"{v['p50_ms']:.1f}",
                                 f"{v['p99_ms']:.1f}", f"{v['max_ms']:.1f}"])  # fmt: skip
        out.append(table(["read cache", "streams", "n", "p50", "p99", "max"], rows))
        firsts = ", ".join(
            f"{lat['read_cache_bytes']}: {lat['first_request_ms']:.1f}" for lat in r["latency"]
        )
        out.append(f"first request after each restart (ms; includes opening S3 connections): {firsts}")
    prof = r.get("profile")
    if prof:
        out.append(f"server profile during one more cold read ({d['preload']} preload):")
        if "error" in prof:
            out.append(prof["error"])
        else:
            if "samples_by_thread" in prof:
                rate = prof.get("rate_hz", 250)
                busy = ", ".join(f"{t} {n / rate:.2f}s" for t, n in prof["samples_by_thread"].items())
                cpu = prof.get("cpu", {})
                out.append(f"read took {prof.get('read_s')}s, server CPU {cpu.get('server_s')}s (/proc); "
                           f"running-or-runnable per thread (py-spy samples): {busy}")  # fmt: skip
            else:
                out.append(f"read took {prof.get('read_s')}s; cProfile of the whole server process "
                           f"(start-up included, main thread only): {prof.get('total_self_s')}s")  # fmt: skip
            out.append("event loop (MainThread) self, top 15 (% of its running-or-runnable samples):")
            out.extend(f"  {pct:5.1f}%  {name}" for name, pct in prof["self_pct"][:15])
            out.append("event loop inclusive, top 25:")
            out.extend(f"  {pct:5.1f}%  {name}" for name, pct in prof["inclusive_pct"][:25])
    return out


def render(results: dict[str, Any]) -> str:
    out: list[str] = []
    for store, res in results["stores"].items():
        if res.get("puts"):
            out.extend(render_puts(store, res["puts"]))
        for r in res.get("reads", []):
            out.extend(render_reads(store, r))
    return "\n".join(out)


#: Source directory -> package inside ``tiered`` (pyproject's package-dir mapping).
SOURCE_DIRS = {"tiered": "", "hot": "hot", "cold": "cold", "gc": "gc"}
REPO_ROOT = Path(__file__).resolve().parent.parent


def source_fingerprint(root: Path = REPO_ROOT) -> str:
    """sha256 over the server's sources: a change during a run means mixed-code results."""
    h = hashlib.sha256()
    for d in SOURCE_DIRS:
        for f in sorted((root / d).glob("*.py")):
            h.update(f"{d}/{f.name}".encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def freeze_sources(dst: Path) -> Path:
    """Copy the server's sources to ``dst/tiered`` (as the installed package lays them out).

    Every ``tiered serve`` of the run then imports this copy (``PYTHONPATH``
    comes before the editable install's finder), so edits to the working tree
    during a long run cannot mix two versions, or make a restart read a
    snapshot written by another version.
    """
    for d, sub in SOURCE_DIRS.items():
        target = dst / "tiered" / sub
        target.mkdir(parents=True, exist_ok=True)
        for f in (REPO_ROOT / d).glob("*.py"):
            shutil.copy2(f, target / f.name)
    return dst


def environment() -> dict[str, Any]:
    import pyarrow

    try:
        import moto

        moto_version = moto.__version__
    except ImportError:
        moto_version = None
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "moto": moto_version,
        "pyarrow": pyarrow.__version__,
        "aiohttp": aiohttp.__version__,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def parse_variant(text: str) -> tuple[int, int | None, float | None]:
    """``4MiB``, ``16MiB:16MiB`` or ``16MiB:16MiB:30``: cold object bytes[:flush bytes[:flush interval s]]."""
    target, _, rest = text.partition(":")
    fb, _, interval = rest.partition(":")
    return parse_size(target), (parse_size(fb) if fb else None), (float(interval) if interval else None)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="bench/cold.py",
        description="Benchmark tiered's cold tier on loopback: PUTs per flushed MiB, cold catch-up read "
        "throughput vs raw ranged GETs, cold first-byte latency.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    csv = lambda conv: lambda s: [conv(x) for x in s.split(",") if x]  # noqa: E731
    ap.add_argument(
        "--stores", type=csv(str), default="s3", help="comma list of: s3 (moto on loopback), local"
    )
    ap.add_argument("--phases", type=csv(str), default="puts,reads,latency", help="comma list of phases")
    g = ap.add_argument_group("puts")
    g.add_argument("--streams", type=int, default=1000, help="streams appended to")
    g.add_argument("--record-bytes", type=parse_size, default="1KiB", help="bytes per append")
    g.add_argument("--rounds", type=int, default=40, help="appends per stream")
    g.add_argument("--clients", type=int, default=64, help="concurrent appending clients")
    g.add_argument("--put-variants", type=csv(parse_variant), default="16MiB,4MiB,16MiB:16MiB:30,4MiB:4MiB:30",
                   metavar="SIZE[:FLUSH[:SECS]],...",
                   help="one run per entry: --cold-object-bytes, optionally :--flush-bytes and :--flush-interval-s")  # fmt: skip
    g.add_argument("--flush-interval-s", type=float, default=1.0, help="passed to the server")
    g.add_argument("--fsync", default="always", choices=["always", "interval"], help="passed to the server")
    g = ap.add_argument_group("reads / latency")
    g.add_argument("--read-streams", type=int, default=8, help="big streams read back")
    g.add_argument("--read-stream-mib", type=float, default=16.0, help="MiB per big stream")
    g.add_argument(
        "--read-record-bytes", type=parse_size, default="16KiB", help="append size for the preload"
    )
    g.add_argument("--read-chunk-bytes", type=csv(parse_size), default="4MiB,16MiB",
                   help="server --read-chunk-bytes values to measure")  # fmt: skip
    g.add_argument("--raw-range-bytes", type=csv(parse_size), default="1MiB",
                   help="range sizes for the fixed-range raw loop (in addition to the replay)")  # fmt: skip
    g.add_argument(
        "--read-concurrency", type=int, default=0, help="readers and raw GET workers (0: one per stream)"
    )
    g.add_argument("--latency-streams", type=int, default=50, help="small streams for first-byte latency")
    g.add_argument("--latency-stream-bytes", type=parse_size, default="64KiB", help="bytes per small stream")
    g.add_argument(
        "--repeat", type=int, default=5, help="rounds per throughput measurement (medians reported)"
    )
    g.add_argument(
        "--preload",
        type=csv(str),
        default="concurrent,sequential",
        help="comma list of preload layouts to measure; concurrent: all streams written at once (each flush "
        "packs every stream's new bytes into shared objects); sequential: one stream after the other "
        "(objects of its own)",
    )
    g.add_argument("--profile", choices=["none", "py-spy", "cprofile"], default="none",
                   help="profile the server during one extra cold read")  # fmt: skip
    ap.add_argument("--flush-timeout-s", type=float, default=180.0, help="max wait for data to become cold")
    ap.add_argument(
        "--server-arg", action="append", default=[], help="extra flag for every tiered serve (repeatable)"
    )
    ap.add_argument("--workdir", type=Path, default=None, help="where data dirs go (default: a new temp dir)")
    ap.add_argument(
        "--keep", action="store_true", help="keep the work dir (data dirs, server logs, profiles)"
    )
    ap.add_argument("--json", type=Path, default=None, help="also write results as JSON to this file")
    ap.add_argument(
        "--live-sources",
        action="store_true",
        help="run servers from the working tree instead of a copy frozen at start (edits during the run then "
        "take effect at the next restart)",
    )
    ap.add_argument("--moto-child", action="store_true", help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.moto_child:
        return moto_child_main()
    for pl in args.preload:
        if pl not in ("concurrent", "sequential"):
            raise SystemExit(f"unknown preload layout {pl!r}")
    for s in args.stores:
        if s not in ("s3", "local"):
            raise SystemExit(f"unknown store {s!r}")
    for ph in args.phases:
        if ph not in ("puts", "reads", "latency"):
            raise SystemExit(f"unknown phase {ph!r}")
    os.environ.update(AWS_ENV)
    for name in AWS_CLEARED:
        os.environ.pop(name, None)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tiered-cold-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    params = Params(
        stores=args.stores,
        phases=args.phases,
        streams=args.streams,
        record_bytes=args.record_bytes,
        rounds=args.rounds,
        clients=args.clients,
        put_variants=args.put_variants,
        flush_interval_s=args.flush_interval_s,
        read_streams=args.read_streams,
        read_stream_bytes=int(args.read_stream_mib * MiB),
        read_record_bytes=args.read_record_bytes,
        read_chunk_bytes=args.read_chunk_bytes,
        raw_range_bytes=args.raw_range_bytes,
        read_concurrency=args.read_concurrency or args.read_streams,
        latency_streams=args.latency_streams,
        latency_stream_bytes=args.latency_stream_bytes,
        repeat=max(1, args.repeat),
        preload=args.preload,
        profile=args.profile,
        flush_timeout_s=args.flush_timeout_s,
        fsync=args.fsync,
        workdir=workdir,
        keep=args.keep,
        extra_server_args=args.server_arg,
    )
    log(f"work dir {workdir}")
    fingerprint = source_fingerprint()
    if not args.live_sources:
        frozen = freeze_sources(workdir / "src")
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(frozen), os.environ.get("PYTHONPATH")]))
        log(f"server sources frozen at {fingerprint} in {frozen}")
    bench = ColdBench(params)
    t0 = time.monotonic()
    try:
        results = bench.run()
    except BenchError as exc:
        print(f"cold bench failed: {exc}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    results["environment"] = environment()
    results["environment"]["server_source_sha256"] = fingerprint
    results["environment"]["server_sources"] = "live working tree" if args.live_sources else "frozen copy"
    if source_fingerprint() != fingerprint:
        if args.live_sources:
            results["environment"]["warning"] = "server sources changed during the run"
            log("WARNING: the server's source files changed during the run; figures may mix two versions")
        else:
            log(
                f"note: the working tree changed during the run; all servers ran the frozen copy {fingerprint}"
            )
    results["params"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(params).items()}
    results["wall_s"] = round(time.monotonic() - t0, 1)
    print(render(results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
