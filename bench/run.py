#!/usr/bin/env python3
"""Load driver for any Durable Streams server.

All phases run against the *base stream URL* given with ``--url`` (stream
``name`` lives at ``{url}/{name}``):

1. **Append** – create ``--streams`` streams (``PUT``), then drive
   ``POST {url}/{name}`` appends of ``--size`` bytes for ``--duration`` seconds
   over ``--connections`` keep-alive connections, streams chosen round-robin.
   Driver ``wrk`` runs ``wrk --latency -s bench/wrk/append.lua`` (the lua
   ``done()`` hook prints counts and latency percentiles as JSON); driver
   ``python`` is an aiohttp closed-loop client with the same parameters.
   Reported: successful appends/s, latency p50/p90/p99/p99.9/max, non-2xx
   responses by status, socket errors.
2. **Catch-up after append** – read every stream of phase 1 once from
   ``offset=-1`` to the end (following ``Stream-Next-Offset`` until
   ``Stream-Up-To-Date``) with ``--readers`` concurrent readers; reports MB/s
   and checks the bytes read against the appends acknowledged in phase 1.
   The amount of data depends on how fast the server appended.
3. **Small-record reads** – fixed data: ``--small-read-streams`` fresh streams
   preloaded with ``--small-read-records`` records of ``--size`` bytes, then
   read in full (-1 to up-to-date), repeatedly, by ``--readers`` readers for
   ``--read-duration`` seconds.  Same bytes on every server, so comparable.
4. **Large-record reads** – ``--read-streams`` fresh streams preloaded with
   ``--read-stream-bytes`` each in ``--preload-chunk`` appends, read back the
   same way.

MB means 10**6 bytes.  Results are printed as a table and as JSON (also
written to a file with ``--json out.json``).  Only the Python standard
library and aiohttp are used.  Example::

    python bench/run.py --url http://127.0.0.1:8080/v1/stream \\
        --streams 100 --size 256 --connections 64 --duration 10
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

BENCH_DIR = Path(__file__).resolve().parent
WRK_SCRIPT = BENCH_DIR / "wrk" / "append.lua"
CONTENT_TYPE = "application/octet-stream"
MB = 1_000_000

#: Safety bound on GET requests for one full read of one stream.
MAX_READ_REQUESTS_PER_STREAM = 100_000
#: Per-HTTP-request timeout (seconds) for the Python paths.
REQUEST_TIMEOUT_S = 60.0


class BenchError(RuntimeError):
    """A benchmark phase could not run (server unreachable, bad status, ...)."""


@dataclass
class BenchConfig:
    """Parameters of one benchmark run (see ``--help`` for the meaning)."""

    url: str
    streams: int = 100
    size: int = 256
    connections: int = 64
    threads: int = 2
    duration: float = 10.0
    driver: str = "auto"
    readers: int = 8
    small_read_streams: int = 50
    small_read_records: int = 200
    read_streams: int = 8
    read_stream_bytes: int = 4 * 1024 * 1024
    preload_chunk: int = 64 * 1024
    read_duration: float = 5.0
    skip_catchup: bool = False
    skip_read: bool = False
    name_prefix: str = ""
    phase_timeout: float = 600.0
    wrk_path: str = "wrk"
    verbose: bool = False
    #: Sample machine-wide CPU use for 1 s before the run (compare.py samples
    #: before starting the server instead, so server start-up is not counted).
    measure_busy: bool = True
    #: ``Authorization`` header value every request carries (a bearer token for a
    #: server with ``--auth``); never a flag, so it stays out of process lists.
    #: Standalone runs take it from ``$BENCH_AUTHORIZATION``.
    authorization: str = field(default_factory=lambda: os.environ.get("BENCH_AUTHORIZATION", ""))

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        if not self.name_prefix:
            self.name_prefix = f"bench-{secrets.token_hex(4)}-"

    def validate(self) -> None:
        """Raise :class:`ValueError` on nonsensical parameters."""
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--url must be an http(s) URL, got {self.url!r}")
        checks = {
            "--streams": self.streams >= 1,
            "--size": self.size >= 1,
            "--connections": self.connections >= 1,
            "--threads": self.threads >= 1,
            "--duration": 0 < self.duration <= 3600,
            "--readers": self.readers >= 1,
            "--small-read-streams": self.small_read_streams >= 1,
            "--small-read-records": self.small_read_records >= 0,
            "--read-streams": self.read_streams >= 1,
            "--read-stream-bytes": self.read_stream_bytes >= 1,
            "--preload-chunk": self.preload_chunk >= 1,
            "--read-duration": 0 < self.read_duration <= 3600,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"invalid value for {', '.join(bad)}")
        if self.driver not in ("auto", "wrk", "python"):
            raise ValueError(f"--driver must be auto, wrk or python, got {self.driver!r}")
        if not re.fullmatch(r"[A-Za-z0-9._-]+", self.name_prefix):
            raise ValueError("--name-prefix may only contain letters, digits, '.', '_' and '-'")


@dataclass
class LatencySummary:
    """Latency distribution in milliseconds."""

    mean: float = 0.0
    p50: float = 0.0
    p90: float = 0.0
    p99: float = 0.0
    p999: float = 0.0
    max: float = 0.0


@dataclass
class AppendResult:
    """Outcome of the append phase."""

    driver: str
    duration_s: float
    requests: int
    ok: int
    appends_per_s: float
    latency_ms: LatencySummary
    non2xx: int = 0
    non2xx_by_status: dict[str, int] = field(default_factory=dict)
    socket_errors: dict[str, int] = field(default_factory=dict)


# --------------------------------------------------------------------------- helpers


def make_body(size: int) -> bytes:
    """Deterministic printable body of ``size`` bytes (same pattern as append.lua)."""
    alphabet = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    n = len(alphabet)
    return bytes(alphabet[(i * 7) % n] for i in range(1, size + 1))


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0..100) of an already sorted list."""
    if not sorted_values:
        return 0.0
    rank = max(1, min(len(sorted_values), int(-(-q * len(sorted_values) // 100))))
    return sorted_values[rank - 1]


def summarize_latencies(latencies_ms: list[float]) -> LatencySummary:
    """Build a :class:`LatencySummary` from raw latencies (ms)."""
    if not latencies_ms:
        return LatencySummary()
    s = sorted(latencies_ms)
    return LatencySummary(
        mean=sum(s) / len(s),
        p50=percentile(s, 50),
        p90=percentile(s, 90),
        p99=percentile(s, 99),
        p999=percentile(s, 99.9),
        max=s[-1],
    )


def stream_urls(cfg: BenchConfig, names: list[str]) -> list[str]:
    """Full stream URLs for ``names`` under the base URL."""
    return [f"{cfg.url}/{name}" for name in names]


def make_session(limit: int, authorization: str = "") -> aiohttp.ClientSession:
    """A client session with ``limit`` pooled connections and bounded timeouts."""
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=limit, ttl_dns_cache=300)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S, connect=10.0)
    # Identity encoding: we measure raw stream bytes, not compression.
    headers = {"Accept-Encoding": "identity"}
    if authorization:
        headers["Authorization"] = authorization
    return aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers, auto_decompress=False)


def log(cfg: BenchConfig, msg: str) -> None:
    """Progress message on stderr (tables and JSON go to stdout)."""
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- setup


async def create_streams(session: aiohttp.ClientSession, urls: list[str], concurrency: int = 16) -> None:
    """``PUT`` every URL (201 or 200 accepted); raises :class:`BenchError` otherwise."""
    sem = asyncio.Semaphore(concurrency)

    async def one(url: str) -> None:
        async with sem:
            try:
                async with session.put(url, headers={"Content-Type": CONTENT_TYPE}) as resp:
                    text = await resp.text(errors="replace")
                    if resp.status not in (200, 201):
                        raise BenchError(f"PUT {url} -> {resp.status}: {text[:200]}")
            except (TimeoutError, aiohttp.ClientError) as exc:
                raise BenchError(
                    f"cannot create stream {url}: {type(exc).__name__}: {exc} (is the server running?)"
                ) from exc

    await asyncio.gather(*(one(u) for u in urls))


# --------------------------------------------------------------------------- append: wrk


#: Process groups of load generators (wrk) that may still run; see :func:`kill_children`.
_LIVE_PGIDS: set[int] = set()


def kill_children() -> None:
    """SIGKILL every load-generator process group that has not been reaped yet."""
    for pgid in list(_LIVE_PGIDS):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        _LIVE_PGIDS.discard(pgid)


def wrk_available(wrk_path: str = "wrk") -> str | None:
    """Absolute path of the wrk binary, or ``None``."""
    return shutil.which(wrk_path)


def parse_wrk_output(stdout: str) -> dict[str, Any]:
    """Extract the ``BENCH_RESULT {json}`` line printed by append.lua's ``done()``."""
    for line in stdout.splitlines():
        if line.startswith("BENCH_RESULT "):
            data: dict[str, Any] = json.loads(line[len("BENCH_RESULT ") :])
            return data
    raise BenchError("wrk output has no BENCH_RESULT line:\n" + stdout[-2000:])


def wrk_result_to_append(data: dict[str, Any]) -> AppendResult:
    """Convert append.lua's JSON into an :class:`AppendResult`."""
    duration_s = data["duration_us"] / 1e6
    pct = data["latency_us"]["percentiles"]
    lat = LatencySummary(
        mean=data["latency_us"]["mean"] / 1000,
        p50=pct["50"] / 1000,
        p90=pct["90"] / 1000,
        p99=pct["99"] / 1000,
        p999=pct["99.9"] / 1000,
        max=data["latency_us"]["max"] / 1000,
    )
    errors = {k: int(v) for k, v in data["socket_errors"].items() if k != "status" and v}
    return AppendResult(
        driver="wrk",
        duration_s=duration_s,
        requests=int(data["requests"]),
        ok=int(data["ok"]),
        appends_per_s=data["ok"] / duration_s if duration_s > 0 else 0.0,
        latency_ms=lat,
        non2xx=int(data["non2xx"]),
        non2xx_by_status={str(k): int(v) for k, v in data["non2xx_by_status"].items()},
        socket_errors=errors,
    )


async def run_wrk_append(cfg: BenchConfig) -> AppendResult:
    """Run the append phase with wrk + append.lua (streams must exist).

    wrk runs in its own process group; it is killed if this coroutine is
    cancelled or times out (``duration + 60`` s).
    """
    wrk = wrk_available(cfg.wrk_path)
    if wrk is None:
        raise BenchError(
            f"wrk not found ({cfg.wrk_path!r}); install it (apt-get install -y wrk) or use --driver python"
        )
    threads = max(1, min(cfg.threads, cfg.connections))
    cmd = [
        wrk,
        f"-t{threads}",
        f"-c{cfg.connections}",
        f"-d{max(1, round(cfg.duration))}s",
        "--timeout",
        "30s",
        "--latency",
        "-s",
        str(WRK_SCRIPT),
        cfg.url,
        "--",
        f"streams={cfg.streams}",
        f"size={cfg.size}",
        f"prefix={cfg.name_prefix}",
        f"threads={threads}",
    ]
    log(cfg, "running: " + " ".join(cmd))
    proc = await asyncio.create_subprocess_exec(
        *cmd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, "BENCH_AUTHORIZATION": cfg.authorization},
    )
    _LIVE_PGIDS.add(proc.pid)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=cfg.duration + 60)
    except TimeoutError as exc:
        raise BenchError(f"wrk did not finish within {cfg.duration + 60:.0f}s") from exc
    finally:
        if proc.returncode is None:  # cancelled or timed out: do not leave wrk running
            kill_children()
        _LIVE_PGIDS.discard(proc.pid)
    stdout = out.decode(errors="replace")
    stderr = err.decode(errors="replace")
    if cfg.verbose:
        print(stdout, file=sys.stderr)
    if proc.returncode != 0:
        raise BenchError(f"wrk exited with {proc.returncode}: {stderr.strip()[-2000:]}")
    return wrk_result_to_append(parse_wrk_output(stdout))


# --------------------------------------------------------------------------- append: python


async def run_python_append(cfg: BenchConfig, urls: list[str]) -> AppendResult:
    """Closed-loop aiohttp append driver: ``--connections`` workers, each with one request in flight.

    Worker ``w`` starts at stream ``w*N/C`` and then walks the streams round-robin.
    Requests still in flight at the deadline are completed and counted; the
    rate is computed over the time until the last one finished.
    """
    body = make_body(cfg.size)
    headers = {"Content-Type": CONTENT_TYPE}
    n = len(urls)
    latencies: list[float] = []
    statuses: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    ok = 0

    async with make_session(cfg.connections, cfg.authorization) as session:
        start = time.perf_counter()
        deadline = start + cfg.duration

        async def worker(w: int) -> None:
            nonlocal ok
            i = (w * n // cfg.connections) % n
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                try:
                    async with session.post(urls[i], data=body, headers=headers) as resp:
                        await resp.read()
                        status = resp.status
                except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                    errors[type(exc).__name__] += 1
                    await asyncio.sleep(0.01)  # do not spin on a dead server
                    continue
                latencies.append((time.perf_counter() - t0) * 1000)
                if 200 <= status < 300:
                    ok += 1
                else:
                    statuses[str(status)] += 1
                i = (i + 1) % n

        await asyncio.wait_for(
            asyncio.gather(*(worker(w) for w in range(cfg.connections))),
            timeout=cfg.duration + REQUEST_TIMEOUT_S + 30,
        )
        elapsed = time.perf_counter() - start

    return AppendResult(
        driver="python",
        duration_s=elapsed,
        requests=len(latencies),
        ok=ok,
        appends_per_s=ok / elapsed if elapsed > 0 else 0.0,
        latency_ms=summarize_latencies(latencies),
        non2xx=sum(statuses.values()),
        non2xx_by_status=dict(statuses),
        socket_errors=dict(errors),
    )


# --------------------------------------------------------------------------- reads


async def read_stream_fully(session: aiohttp.ClientSession, url: str) -> tuple[int, int]:
    """Catch-up read of one stream from ``offset=-1`` to the end.

    Follows ``Stream-Next-Offset`` until a response carries
    ``Stream-Up-To-Date: true`` (or ``Stream-Closed: true``).  Returns
    ``(bytes, requests)``.  Bounded by :data:`MAX_READ_REQUESTS_PER_STREAM`;
    raises :class:`BenchError` on a non-200 status or when a partial response
    makes no progress.
    """
    offset = "-1"
    total = 0
    for requests in range(1, MAX_READ_REQUESTS_PER_STREAM + 1):
        async with session.get(url, params={"offset": offset}) as resp:
            if resp.status != 200:
                text = await resp.text(errors="replace")
                raise BenchError(f"GET {url}?offset={offset} -> {resp.status}: {text[:200]}")
            got = 0
            async for chunk in resp.content.iter_any():
                got += len(chunk)
            total += got
            up_to_date = resp.headers.get("Stream-Up-To-Date", "").lower() == "true"
            closed = resp.headers.get("Stream-Closed", "").lower() == "true"
            next_offset = resp.headers.get("Stream-Next-Offset")
        if up_to_date or closed:
            return total, requests
        if not next_offset:
            raise BenchError(f"GET {url}?offset={offset}: no Stream-Next-Offset and not up to date")
        if next_offset == offset and got == 0:
            raise BenchError(f"GET {url}?offset={offset}: no progress and not up to date")
        offset = next_offset
    raise BenchError(f"{url}: not up to date after {MAX_READ_REQUESTS_PER_STREAM} requests")


async def run_catchup_read(
    cfg: BenchConfig, urls: list[str], expected_bytes: int, max_extra: int
) -> dict[str, Any]:
    """Read every stream once from -1 to the end with ``cfg.readers`` readers.

    ``expected_bytes`` is what the append phase had acknowledged; up to
    ``max_extra`` more bytes are tolerated (appends in flight when wrk stopped).
    """
    queue: asyncio.Queue[str] = asyncio.Queue()
    for u in urls:
        queue.put_nowait(u)
    total_bytes = 0
    total_requests = 0

    async with make_session(cfg.readers, cfg.authorization) as session:

        async def reader() -> None:
            nonlocal total_bytes, total_requests
            while True:
                try:
                    url = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                b, r = await read_stream_fully(session, url)
                total_bytes += b
                total_requests += r

        start = time.perf_counter()
        await asyncio.wait_for(
            asyncio.gather(*(reader() for _ in range(cfg.readers))), timeout=cfg.phase_timeout
        )
        elapsed = time.perf_counter() - start

    consistent = expected_bytes <= total_bytes <= expected_bytes + max_extra
    return {
        "streams": len(urls),
        "readers": cfg.readers,
        "bytes": total_bytes,
        "expected_bytes": expected_bytes,
        "consistent": consistent,
        "requests": total_requests,
        "seconds": elapsed,
        "mb_per_s": total_bytes / MB / elapsed if elapsed > 0 else 0.0,
    }


async def preload_streams(
    session: aiohttp.ClientSession,
    urls: list[str],
    bytes_per_stream: int,
    chunk_size: int,
    concurrency: int,
    timeout_s: float,
) -> float:
    """Append ``bytes_per_stream`` to every stream in ``chunk_size`` pieces; returns seconds.

    The appends are interleaved across streams and issued by ``concurrency``
    closed-loop workers.
    """
    chunk = make_body(chunk_size)
    headers = {"Content-Type": CONTENT_TYPE}
    pieces = [min(chunk_size, bytes_per_stream - off) for off in range(0, bytes_per_stream, chunk_size)]
    jobs: asyncio.Queue[tuple[str, int]] = asyncio.Queue()
    for n in pieces:
        for u in urls:
            jobs.put_nowait((u, n))

    async def worker() -> None:
        while True:
            try:
                url, n = jobs.get_nowait()
            except asyncio.QueueEmpty:
                return
            body = chunk if n == len(chunk) else chunk[:n]
            async with session.post(url, data=body, headers=headers) as resp:
                await resp.read()
                if not 200 <= resp.status < 300:
                    raise BenchError(f"preload POST {url} -> {resp.status}")

    start = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(concurrency))), timeout=timeout_s)
    return time.perf_counter() - start


async def run_read_benchmark(
    cfg: BenchConfig, tag: str, streams: int, bytes_per_stream: int, chunk_size: int
) -> dict[str, Any]:
    """Preload fresh streams, then catch-up-read them in full, repeatedly, for ``cfg.read_duration`` s.

    ``cfg.readers`` readers each walk the streams round-robin (reader ``r``
    starts at stream ``r``); every full read goes from ``offset=-1`` to
    ``Stream-Up-To-Date`` and is checked to return exactly ``bytes_per_stream``.
    """
    names = [f"{cfg.name_prefix}{tag}-{k}" for k in range(streams)]
    urls = stream_urls(cfg, names)
    concurrency = max(1, min(cfg.connections, 64))
    async with make_session(max(cfg.readers, concurrency), cfg.authorization) as session:
        await create_streams(session, urls)
        log(cfg, f"{tag}: preloading {streams} streams x {bytes_per_stream} B in {chunk_size} B appends")
        preload_s = await preload_streams(
            session, urls, bytes_per_stream, chunk_size, concurrency, cfg.phase_timeout
        )

        # One untimed pass over every stream, so the timed reads do not pay
        # alone for lazy index builds or a cold cache.
        for u in urls:
            await read_stream_fully(session, u)

        log(cfg, f"{tag}: reading with {cfg.readers} readers for {cfg.read_duration}s")
        total_bytes = 0
        total_requests = 0
        full_reads = 0
        wrong_size = 0
        read_latencies: list[float] = []
        start = time.perf_counter()
        deadline = start + cfg.read_duration

        async def reader(r: int) -> None:
            nonlocal total_bytes, total_requests, full_reads, wrong_size
            j = r
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                b, n = await read_stream_fully(session, urls[j % len(urls)])
                read_latencies.append((time.perf_counter() - t0) * 1000)
                total_bytes += b
                total_requests += n
                full_reads += 1
                if b != bytes_per_stream:
                    wrong_size += 1
                j += 1

        await asyncio.wait_for(
            asyncio.gather(*(reader(r) for r in range(cfg.readers))),
            timeout=cfg.read_duration + cfg.phase_timeout,
        )
        elapsed = time.perf_counter() - start

    return {
        "streams": streams,
        "bytes_per_stream": bytes_per_stream,
        "append_size": chunk_size,
        "preload_s": preload_s,
        "preload_appends_per_s": streams * len(range(0, bytes_per_stream, chunk_size)) / preload_s
        if preload_s > 0
        else 0.0,
        "preload_mb_per_s": streams * bytes_per_stream / MB / preload_s if preload_s > 0 else 0.0,
        "readers": cfg.readers,
        "full_reads": full_reads,
        "wrong_size_reads": wrong_size,
        "requests": total_requests,
        "bytes": total_bytes,
        "seconds": elapsed,
        "mb_per_s": total_bytes / MB / elapsed if elapsed > 0 else 0.0,
        "full_read_latency_ms": asdict(summarize_latencies(read_latencies)),
    }


# --------------------------------------------------------------------------- orchestration


def _cpu_times() -> tuple[int, int] | None:
    """``(busy, total)`` jiffies from /proc/stat, or ``None`` off Linux."""
    try:
        with open("/proc/stat") as fh:
            fields = [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def cpu_busy_percent(interval_s: float = 1.0) -> float | None:
    """Machine-wide CPU busy % over ``interval_s`` (before a run: load from *other* processes)."""
    a = _cpu_times()
    time.sleep(interval_s)
    b = _cpu_times()
    if a is None or b is None or b[1] == a[1]:
        return None
    return 100.0 * (b[0] - a[0]) / (b[1] - a[1])


def environment_info(cfg: BenchConfig, driver: str) -> dict[str, Any]:
    """Machine and tool facts recorded next to the results."""
    info: dict[str, Any] = {
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "aiohttp": aiohttp.__version__,
        "driver": driver,
        "loadavg_before": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "cpu_busy_before_pct": cpu_busy_percent(1.0) if cfg.measure_busy else None,
    }
    busy = info["cpu_busy_before_pct"]
    if busy is not None and busy > 20:
        log(cfg, f"warning: the machine was {busy:.0f}% busy before the run; results will be noisy")
    if driver == "wrk":
        wrk = wrk_available(cfg.wrk_path)
        if wrk:
            try:
                out = subprocess.run(
                    [wrk, "--version"], capture_output=True, text=True, timeout=10, check=False
                )
                info["wrk"] = (out.stdout or out.stderr).splitlines()[0].strip()
            except (OSError, subprocess.TimeoutExpired, IndexError):
                info["wrk"] = wrk
    return info


def resolve_driver(cfg: BenchConfig) -> str:
    """``wrk`` or ``python`` for ``cfg.driver`` (``auto`` prefers wrk)."""
    if cfg.driver == "auto":
        return "wrk" if wrk_available(cfg.wrk_path) else "python"
    if cfg.driver == "wrk" and not wrk_available(cfg.wrk_path):
        raise BenchError(
            f"--driver wrk but wrk not found ({cfg.wrk_path!r}); apt-get install -y wrk, or --driver python"
        )
    return cfg.driver


async def run_benchmark_async(cfg: BenchConfig) -> dict[str, Any]:
    """Run all phases against ``cfg.url`` and return the JSON-able result."""
    cfg.validate()
    driver = resolve_driver(cfg)
    names = [f"{cfg.name_prefix}{i}" for i in range(cfg.streams)]
    urls = stream_urls(cfg, names)
    result: dict[str, Any] = {
        "url": cfg.url,
        "config": {k: v for k, v in asdict(cfg).items() if k != "authorization"},  # no credentials in results
        "environment": environment_info(cfg, driver),
    }

    log(cfg, f"creating {cfg.streams} streams under {cfg.url}/{cfg.name_prefix}*")
    async with make_session(16, cfg.authorization) as session:
        await asyncio.wait_for(create_streams(session, urls), timeout=cfg.phase_timeout)

    log(
        cfg,
        f"append phase: driver={driver} connections={cfg.connections} size={cfg.size} duration={cfg.duration}s",
    )
    if driver == "wrk":
        append = await run_wrk_append(cfg)
    else:
        append = await run_python_append(cfg, urls)
    result["append"] = asdict(append)

    if not cfg.skip_catchup:
        log(cfg, f"catch-up read of the {cfg.streams} appended streams with {cfg.readers} readers")
        expected = append.ok * cfg.size
        # wrk does not count requests still in flight when it stops; the server
        # may have applied them.  The python driver waits for all of them.
        extra = cfg.connections * cfg.size if driver == "wrk" else 0
        result["catchup"] = await run_catchup_read(cfg, urls, expected, extra)

    if not cfg.skip_read and cfg.small_read_records > 0:
        result["read_small"] = await run_read_benchmark(
            cfg, "small", cfg.small_read_streams, cfg.small_read_records * cfg.size, cfg.size
        )
    if not cfg.skip_read:
        result["read_large"] = await run_read_benchmark(
            cfg, "large", cfg.read_streams, cfg.read_stream_bytes, cfg.preload_chunk
        )
    if hasattr(os, "getloadavg"):
        result["environment"]["loadavg_after"] = list(os.getloadavg())
    return result


def run_benchmark(cfg: BenchConfig) -> dict[str, Any]:
    """Synchronous wrapper around :func:`run_benchmark_async`; HTTP/socket failures become :class:`BenchError`."""
    try:
        return asyncio.run(run_benchmark_async(cfg))
    except (aiohttp.ClientError, OSError) as exc:
        raise BenchError(f"HTTP/socket error against {cfg.url}: {exc!r}") from exc
    finally:
        kill_children()  # e.g. wrk still running in its thread after Ctrl-C


# --------------------------------------------------------------------------- reporting


def _fmt(value: Any, spec: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return format(value, spec)


def result_rows(res: dict[str, Any] | None) -> dict[str, str]:
    """Table cells (row label -> text) for one result; ``None`` gives blanks."""
    res = res or {}
    app = res.get("append") or {}
    lat = app.get("latency_ms") or {}
    cu = res.get("catchup") or {}
    rs = res.get("read_small") or {}
    rd = res.get("read_large") or {}
    non2xx = app.get("non2xx")
    sock = sum((app.get("socket_errors") or {}).values()) if app else None
    consistent = cu.get("consistent")
    return {
        "append driver": _fmt(app.get("driver"), ""),
        "appends/s": _fmt(app.get("appends_per_s"), ",.0f"),
        "append p50 (ms)": _fmt(lat.get("p50"), ".2f"),
        "append p90 (ms)": _fmt(lat.get("p90"), ".2f"),
        "append p99 (ms)": _fmt(lat.get("p99"), ".2f"),
        "append max (ms)": _fmt(lat.get("max"), ".1f"),
        "non-2xx / socket errors": "-" if not app else f"{int(non2xx or 0)} / {int(sock or 0)}",
        "catch-up after append (MB/s)": _fmt(cu.get("mb_per_s"), ",.1f"),
        "catch-up data read (MB)": _fmt(cu["bytes"] / MB if cu else None, ",.1f"),
        "catch-up bytes check": "-" if consistent is None else ("ok" if consistent else "MISMATCH"),
        "small-record reads (MB/s)": _fmt(rs.get("mb_per_s"), ",.1f"),
        "small-record stream read p50 (ms)": _fmt((rs.get("full_read_latency_ms") or {}).get("p50"), ".2f"),
        "small-record preload (appends/s)": _fmt(rs.get("preload_appends_per_s"), ",.0f"),
        "large-record reads (MB/s)": _fmt(rd.get("mb_per_s"), ",.1f"),
        "large-record stream read p50 (ms)": _fmt((rd.get("full_read_latency_ms") or {}).get("p50"), ".1f"),
        "large-record preload (MB/s)": _fmt(rd.get("preload_mb_per_s"), ",.1f"),
    }


def format_table(
    columns: dict[str, dict[str, Any] | None], extra_rows: dict[str, list[str]] | None = None
) -> str:
    """Render results side by side: one column per named result."""
    row_maps = {name: result_rows(res) for name, res in columns.items()}
    labels: list[str] = []
    for rows in row_maps.values():
        for label in rows:
            if label not in labels:
                labels.append(label)
    header = ["metric", *columns.keys()]
    body = [[label, *(row_maps[n].get(label, "-") for n in columns)] for label in labels]
    for label, cells in (extra_rows or {}).items():
        body.append([label, *cells])
    widths = [max(len(str(r[i])) for r in [header, *body]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        first = str(cells[0]).ljust(widths[0])
        rest = [str(c).rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest])

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), sep, *(line(r) for r in body)])


# --------------------------------------------------------------------------- CLI


def add_benchmark_args(p: argparse.ArgumentParser, *, require_url: bool = True) -> None:
    """Benchmark parameters shared by run.py and compare.py."""
    if require_url:
        p.add_argument(
            "--url",
            required=True,
            help="base stream URL; stream NAME lives at URL/NAME (e.g. http://127.0.0.1:8080/v1/stream)",
        )
    p.add_argument("--streams", type=int, default=100, help="streams in the append phase (default 100)")
    p.add_argument("--size", type=int, default=256, help="append body size in bytes (default 256)")
    p.add_argument("--connections", type=int, default=64, help="concurrent append connections (default 64)")
    p.add_argument("--threads", type=int, default=2, help="wrk threads (default 2)")
    p.add_argument("--duration", type=float, default=10.0, help="append phase seconds (default 10)")
    p.add_argument(
        "--driver",
        choices=("auto", "wrk", "python"),
        default="auto",
        help="append load generator: wrk + bench/wrk/append.lua, or the aiohttp closed-loop driver "
        "(default auto: wrk if installed)",
    )
    p.add_argument(
        "--readers", type=int, default=8, help="concurrent readers in both read phases (default 8)"
    )
    p.add_argument(
        "--small-read-streams",
        type=int,
        default=50,
        help="small-record read benchmark: streams (default 50)",
    )
    p.add_argument(
        "--small-read-records",
        type=int,
        default=200,
        help="small-record read benchmark: --size-byte records preloaded per stream (default 200; 0 skips it)",
    )
    p.add_argument(
        "--read-streams", type=int, default=8, help="large-record read benchmark: streams (default 8)"
    )
    p.add_argument(
        "--read-stream-bytes",
        type=int,
        default=4 * 1024 * 1024,
        help="large-record read benchmark: bytes preloaded per stream (default 4 MiB)",
    )
    p.add_argument(
        "--preload-chunk",
        type=int,
        default=64 * 1024,
        help="large-record read benchmark: append size of the preload (default 64 KiB)",
    )
    p.add_argument(
        "--read-duration", type=float, default=5.0, help="seconds of each read benchmark (default 5)"
    )
    p.add_argument(
        "--skip-catchup", action="store_true", help="skip the catch-up read after the append phase"
    )
    p.add_argument(
        "--skip-read", action="store_true", help="skip both read benchmarks (preload + repeated reads)"
    )
    p.add_argument(
        "--name-prefix",
        default="",
        help="stream name prefix (default bench-<random>-, so reruns never reuse streams)",
    )
    p.add_argument("--wrk", dest="wrk_path", default="wrk", help="wrk binary (default: wrk on PATH)")
    p.add_argument("--verbose", action="store_true", help="echo wrk's own output to stderr")


def config_from_args(args: argparse.Namespace, url: str | None = None) -> BenchConfig:
    """Build a :class:`BenchConfig` from parsed arguments (``url`` overrides ``args.url``)."""
    return BenchConfig(
        url=url if url is not None else args.url,
        streams=args.streams,
        size=args.size,
        connections=args.connections,
        threads=args.threads,
        duration=args.duration,
        driver=args.driver,
        readers=args.readers,
        small_read_streams=args.small_read_streams,
        small_read_records=args.small_read_records,
        read_streams=args.read_streams,
        read_stream_bytes=args.read_stream_bytes,
        preload_chunk=args.preload_chunk,
        read_duration=args.read_duration,
        skip_catchup=args.skip_catchup,
        skip_read=args.skip_read,
        name_prefix=args.name_prefix,
        wrk_path=args.wrk_path,
        verbose=args.verbose,
    )


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the process exit code."""
    parser = argparse.ArgumentParser(
        description="Append and catch-up-read benchmark for any Durable Streams server.",
        epilog="Example: python bench/run.py --url http://127.0.0.1:8080/v1/stream --streams 100 "
        "--size 256 --connections 64 --duration 10 --json out.json",
    )
    add_benchmark_args(parser)
    parser.add_argument("--json", metavar="PATH", help="also write the full result as JSON to PATH")
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    try:
        cfg.validate()
        result = run_benchmark(cfg)
    except ValueError as exc:
        parser.error(str(exc))
    except (TimeoutError, BenchError) as exc:
        print(f"benchmark failed: {exc or type(exc).__name__}", file=sys.stderr)
        return 2
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        log(cfg, f"wrote {args.json}")
    try:
        print(format_table({cfg.url: result}))
        print()
        print(json.dumps(result, indent=2), flush=True)
    except BrokenPipeError:  # e.g. piped into `head`
        sys.stderr.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
