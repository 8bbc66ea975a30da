#!/usr/bin/env python3
"""Cost curves: how tiered's costs grow with the work (issue 10, "Cost curves").

Every point runs against a real ``tiered serve`` subprocess on 127.0.0.1 with a
fresh data dir (its own process group, always stopped in ``finally``). Curves,
by group (``--curves``, comma separated):

* ``streams`` — for N streams (1k … 1M): create them (``PUT``, 64 keep-alive
  connections, wrk with ``bench/wrk/curves.lua`` or an aiohttp fallback), then

  - ``memory``: the server's RSS (``VmRSS`` of its process group, from
    /proc) after creating them, and again after a restart from the snapshot;
  - ``snapshot``: the snapshot's size on disk after a clean stop (SIGTERM
    writes one), and how long that stop took;
  - ``restart-streams``: time from exec to ``/healthz`` 200 (and to the
    ``journal recovered`` log line) when restarting from that snapshot;
  - ``append-streams``: append p50/p99 and appends/s with 256-B appends
    spread at random over the N streams (64 connections, ``--append-s``).

* ``journal`` — ``restart-journal``: restart time against the journal bytes
  written since the last snapshot (``--snapshot-every-bytes`` larger than the
  run, 4-KiB appends over 100 streams, SIGKILL, restart).
* ``readers`` — ``append-readers``: append p99 over 100 streams while R
  long-poll or SSE readers are parked on R other streams.
* ``cold`` — ``cold-read``: time to read a whole stream from ``offset=-1``
  to up-to-date when it is spread over many small cold objects
  (``--cold-object-bytes 64 KiB``, ``--flush-interval-s 0.2``,
  ``--hot-retention-s 0``, local-directory store, ``--read-cache-bytes 0``),
  after a restart; against the stream's length.

Each curve is written to ``<out-dir>/curve-<name>.json`` (raw numbers, the
fitted growth) and ``<img-dir>/curve-<name>.png`` (matplotlib, the ``bench``
extra: ``pip install -e '.[bench]'``; without it only the JSON is written).
The growth fit is ``y = a + b·x^k`` (k on a grid, a and b by least squares):
k ≈ 0 flat, k ≈ 1 linear, k > 1.25 worse than linear; it is printed with the
linear cost per unit (``b`` of ``y = a + b·x``).

``--quick`` runs tiny points (a smoke run, well under a minute on an idle
machine). Every wait is bounded; ``--budget-min`` skips the points that
would start after the budget is spent. Example::

    python bench/curves.py --out-dir bench/results/curves --img-dir docs/img
    python bench/curves.py --quick --out-dir /tmp/curves
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import queue
import random
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

BENCH_DIR = Path(__file__).resolve().parent
WRK_SCRIPT = BENCH_DIR / "wrk" / "curves.lua"
KiB = 1024
MiB = 1024 * 1024
CONTENT_TYPE = "application/octet-stream"


def log(msg: str) -> None:
    print(f"[curves {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- parameters


@dataclass
class Params:
    """Points and sizes of one run (``--quick`` swaps in the small set)."""

    streams: list[int] = field(default_factory=lambda: [1_000, 10_000, 100_000, 300_000, 1_000_000])
    journal_mib: list[int] = field(default_factory=lambda: [16, 64, 256, 1024])
    journal_record: int = 4 * KiB
    readers: list[int] = field(default_factory=lambda: [0, 100, 1_000, 5_000])
    reader_kinds: list[str] = field(default_factory=lambda: ["sse", "long-poll"])
    cold_kib: list[int] = field(default_factory=lambda: [1_024, 4_096, 16_384, 65_536])
    cold_object: int = 64 * KiB
    cold_append: int = 16 * KiB
    cold_reads: int = 3
    append_s: float = 10.0
    append_size: int = 256
    connections: int = 64
    threads: int = 2

    @classmethod
    def quick(cls) -> Params:
        return cls(
            streams=[200, 2_000],
            journal_mib=[1, 4],
            readers=[0, 50],
            reader_kinds=["sse", "long-poll"],
            cold_kib=[128, 512],
            cold_reads=1,
            append_s=1.0,
            connections=16,
        )


# --------------------------------------------------------------------------- the server


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def group_rss_bytes(pgid: int) -> int:
    """Sum of VmRSS over every live process of process group ``pgid``."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                rest = fh.read().rsplit(")", 1)[1].split()
            if int(rest[2]) != pgid:
                continue
            with open(f"/proc/{entry}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        except (OSError, IndexError, ValueError):
            continue
    return total


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


class ServerError(RuntimeError):
    """The server did not start, answer or stop as expected."""


class Server:
    """``tiered serve`` on a fresh loopback port over one data dir; restartable."""

    def __init__(self, workdir: Path, args: list[str]) -> None:
        self.workdir = workdir
        self.data_dir = workdir / "data"
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.starts = 0
        self.log_path = workdir / "server-0.log"

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base(self) -> str:
        return f"{self.root}/v1/stream"

    def start(self, timeout_s: float = 300.0) -> dict[str, float | None]:
        """Start; returns seconds from exec to /healthz 200 and to the 'journal recovered' line."""
        self.port = free_port()
        self.log_path = self.workdir / f"server-{self.starts}.log"
        self.starts += 1
        argv = [
            sys.executable,
            "-m",
            "tiered.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
            *self.args,
        ]
        log_fh = open(self.log_path, "wb")  # noqa: SIM115  (the child keeps its own copy)
        t0 = time.monotonic()
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log_fh.close()
        recovered: float | None = None
        deadline = t0 + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            if recovered is None and b"journal recovered" in self.log_path.read_bytes():
                recovered = time.monotonic() - t0
            try:
                with urllib.request.urlopen(self.root + "/healthz", timeout=2) as resp:
                    if resp.status == 200:
                        ready = time.monotonic() - t0
                        if recovered is None and b"journal recovered" in self.log_path.read_bytes():
                            recovered = ready
                        return {"ready_s": ready, "recovered_s": recovered}
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.01)
        raise ServerError(f"no /healthz 200 within {timeout_s:.0f}s:\n{self.log_tail()}")

    def rss(self) -> int:
        assert self.proc is not None
        return group_rss_bytes(self.proc.pid)

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(self.root + "/metrics", timeout=30) as resp:
            text = resp.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                with contextlib.suppress(ValueError):
                    out[name] = float(value)
        return out

    def stop(self, grace_s: float = 300.0) -> float:
        """SIGTERM (the server writes a snapshot and exits); returns seconds until it exited."""
        if self.proc is None:
            return 0.0
        t0 = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired as exc:
            self.kill()
            raise ServerError(f"did not stop within {grace_s:.0f}s of SIGTERM") from exc
        took = time.monotonic() - t0
        self._reap_group()
        self.proc = None
        return took

    def kill(self) -> None:
        """SIGKILL the whole group: no snapshot, no goodbye."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)
        self.proc = None

    def _reap_group(self) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def snapshot_bytes(self) -> dict[str, int]:
        """Newest snapshot file's size and the snapshot directory's total."""
        snaps = [p for p in (self.data_dir / "snapshots").glob("*") if p.is_file()]
        newest = max(snaps, key=lambda p: p.stat().st_mtime) if snaps else None
        return {
            "newest": newest.stat().st_size if newest else 0,
            "total": sum(p.stat().st_size for p in snaps),
            "files": len(snaps),
        }

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@contextlib.contextmanager
def fresh_server(args: list[str], keep: bool = False) -> Iterator[Server]:
    """A Server over a new temporary data dir; killed and deleted afterwards, whatever happens."""
    workdir = Path(tempfile.mkdtemp(prefix="tiered-curves-"))
    srv = Server(workdir, args)
    try:
        yield srv
    finally:
        srv.kill()
        if keep:
            log(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


# --------------------------------------------------------------------------- load drivers


def pct(sorted_ms: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_ms:
        return float("nan")
    rank = max(1, math.ceil(q / 100.0 * len(sorted_ms)))
    return sorted_ms[min(rank, len(sorted_ms)) - 1]


class WrkDriver:
    """Load through wrk and bench/wrk/curves.lua (cheap on the CPU the server shares)."""

    name = "wrk"

    def __init__(self, connections: int, threads: int) -> None:
        self.connections = connections
        self.threads = threads

    def _run(self, base: str, params: list[str], duration_s: float, until_done: bool) -> dict[str, Any]:
        argv = [
            "wrk",
            f"-t{self.threads}",
            f"-c{self.connections}",
            f"-d{max(1, math.ceil(duration_s))}s",
            "--timeout",
            "30s",
            "--latency",
            "-s",
            str(WRK_SCRIPT),
            base,
            "--",
            f"threads={self.threads}",
            *params,
        ]
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        out: list[str] = []
        done_threads = 0
        signalled = False
        deadline = t0 + duration_s + 60
        ended = False
        elapsed: float | None = None
        while not ended:
            try:
                line = lines.get(timeout=max(0.05, deadline - time.monotonic()))
            except queue.Empty:
                proc.kill()
                raise ServerError("wrk did not finish in time") from None
            if line is None:
                ended = True
                continue
            out.append(line)
            if line.startswith("CURVES_DONE"):
                done_threads += 1
                if until_done and done_threads >= self.threads and not signalled:
                    elapsed = time.monotonic() - t0
                    proc.send_signal(signal.SIGINT)
                    signalled = True
        proc.wait(timeout=30)
        stderr = proc.stderr.read() if proc.stderr else ""
        result = None
        for line in out:
            if line.startswith("BENCH_RESULT "):
                result = json.loads(line[len("BENCH_RESULT ") :])
        if result is None:
            raise ServerError(f"wrk printed no result; stderr: {stderr[-2000:]}")
        if until_done and done_threads < self.threads:
            raise ServerError(f"wrk ran out of time with {done_threads}/{self.threads} threads done")
        seconds = elapsed if elapsed is not None else result["duration_us"] / 1e6
        lat = result["latency_us"]
        return {
            "ok": result["ok"],
            "non2xx": result["non2xx"],
            "non2xx_by_status": result["non2xx_by_status"],
            "socket_errors": result["socket_errors"],
            "seconds": seconds,
            "per_s": result["ok"] / seconds if seconds > 0 else 0.0,
            "latency_ms": {
                "p50": lat["percentiles"]["50"] / 1000,
                "p90": lat["percentiles"]["90"] / 1000,
                "p99": lat["percentiles"]["99"] / 1000,
                "p99.9": lat["percentiles"]["99.9"] / 1000,
                "max": lat["max"] / 1000,
            },
        }

    def create(self, base: str, prefix: str, n: int, timeout_s: float) -> dict[str, Any]:
        return self._run(base, ["mode=create", f"streams={n}", f"prefix={prefix}"], timeout_s, True)

    def append(
        self,
        base: str,
        prefix: str,
        n_streams: int,
        size: int,
        *,
        duration_s: float | None = None,
        count: int | None = None,
        timeout_s: float = 600.0,
    ) -> dict[str, Any]:
        params = ["mode=append", f"streams={n_streams}", f"prefix={prefix}", f"size={size}"]
        if count is not None:
            return self._run(base, [*params, f"count={count}"], timeout_s, True)
        assert duration_s is not None
        return self._run(base, params, duration_s, False)


class PythonDriver:
    """The same loads from an aiohttp closed loop (when wrk is not installed; needs a core itself)."""

    name = "python"

    def __init__(self, connections: int) -> None:
        self.connections = connections

    async def _loop(
        self, make: Callable[[int], tuple[str, str, bytes]], count: int | None, duration_s: float | None
    ) -> dict[str, Any]:
        latencies: list[float] = []
        statuses: dict[str, int] = {}
        ok = 0
        next_i = 0
        t0 = time.monotonic()
        end = t0 + duration_s if duration_s is not None else None
        conn = aiohttp.TCPConnector(limit=self.connections)
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:

            async def worker() -> None:
                nonlocal next_i, ok
                while True:
                    if count is not None and next_i >= count:
                        return
                    if end is not None and time.monotonic() >= end:
                        return
                    i = next_i
                    next_i += 1
                    method, url, body = make(i)
                    s = time.perf_counter()
                    async with session.request(
                        method, url, data=body, headers={"Content-Type": CONTENT_TYPE}
                    ) as resp:
                        await resp.read()
                    latencies.append((time.perf_counter() - s) * 1000)
                    if 200 <= resp.status < 300:
                        ok += 1
                    else:
                        statuses[str(resp.status)] = statuses.get(str(resp.status), 0) + 1

            await asyncio.gather(*(worker() for _ in range(self.connections)))
        seconds = time.monotonic() - t0
        latencies.sort()
        return {
            "ok": ok,
            "non2xx": sum(statuses.values()),
            "non2xx_by_status": statuses,
            "socket_errors": {},
            "seconds": seconds,
            "per_s": ok / seconds if seconds > 0 else 0.0,
            "latency_ms": {
                "p50": pct(latencies, 50),
                "p90": pct(latencies, 90),
                "p99": pct(latencies, 99),
                "p99.9": pct(latencies, 99.9),
                "max": latencies[-1] if latencies else float("nan"),
            },
        }

    def create(self, base: str, prefix: str, n: int, timeout_s: float) -> dict[str, Any]:
        return asyncio.run(
            asyncio.wait_for(self._loop(lambda i: ("PUT", f"{base}/{prefix}{i}", b""), n, None), timeout_s)
        )

    def append(
        self,
        base: str,
        prefix: str,
        n_streams: int,
        size: int,
        *,
        duration_s: float | None = None,
        count: int | None = None,
        timeout_s: float = 600.0,
    ) -> dict[str, Any]:
        body = b"x" * size
        rng = random.Random(1)

        def make(_: int) -> tuple[str, str, bytes]:
            return "POST", f"{base}/{prefix}{rng.randrange(n_streams)}", body

        return asyncio.run(asyncio.wait_for(self._loop(make, count, duration_s), timeout_s))


Driver = WrkDriver | PythonDriver


def checked(result: dict[str, Any], what: str) -> dict[str, Any]:
    """Refuse a load whose requests failed: a curve of errors measures nothing."""
    errors = result.get("socket_errors") or {}
    if result["non2xx"] or any(errors.values()):
        raise ServerError(f"{what}: {result['non2xx_by_status']} non-2xx, socket errors {errors}")
    return result


# --------------------------------------------------------------------------- parked live readers


class ParkedReaders:
    """R long-poll or SSE readers, each parked on its own stream, in a background event loop."""

    def __init__(self, base: str, names: list[str], kind: str) -> None:
        self.base, self.names, self.kind = base, names, kind
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.tasks: list[asyncio.Task[None]] = []
        self.requests = 0
        self.failures = 0
        self.session: aiohttp.ClientSession | None = None

    def start(self) -> None:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(timeout=120)

    async def _start(self) -> None:
        conn = aiohttp.TCPConnector(limit=0)
        self.session = aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None))
        for i in range(0, len(self.names), 200):  # a bounded connect burst: 200 every 50 ms
            self.tasks += [asyncio.create_task(self._reader(n)) for n in self.names[i : i + 200]]
            await asyncio.sleep(0.05)

    async def _reader(self, name: str) -> None:
        assert self.session is not None
        offset = "now"
        url = f"{self.base}/{name}"
        live = "sse" if self.kind == "sse" else "long-poll"
        while True:
            try:
                self.requests += 1
                async with self.session.get(url, params={"offset": offset, "live": live}) as resp:
                    if resp.status >= 300:
                        self.failures += 1
                        await asyncio.sleep(1)
                        continue
                    offset = resp.headers.get("Stream-Next-Offset", offset)
                    async for _ in resp.content.iter_any():
                        pass  # SSE: held open until the server's connection limit
            except asyncio.CancelledError:
                raise
            except Exception:
                self.failures += 1
                await asyncio.sleep(0.5)

    def stop(self) -> None:
        async def _stop() -> None:
            for t in self.tasks:
                t.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            if self.session is not None:
                await self.session.close()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(_stop(), self.loop).result(timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


# --------------------------------------------------------------------------- growth fit


def fit_growth(xs: list[float], ys: list[float]) -> dict[str, Any]:
    """Fit ``y = a + b·x^k`` (k on a grid 0…3, b ≥ 0) and ``y = a + b·x``; classify the growth."""
    pts = [(x, y) for x, y in zip(xs, ys, strict=True) if x > 0 and y is not None and math.isfinite(y)]
    if len(pts) < 2:
        return {"class": "too few points"}
    x = [p[0] for p in pts]
    y = [p[1] for p in pts]

    def lsq(f: list[float]) -> tuple[float, float, float]:
        n = len(f)
        mf, my = sum(f) / n, sum(y) / n
        var = sum((fi - mf) ** 2 for fi in f)
        b = sum((fi - mf) * (yi - my) for fi, yi in zip(f, y, strict=True)) / var if var > 0 else 0.0
        b = max(b, 0.0)
        a = my - b * mf
        sse = sum((a + b * fi - yi) ** 2 for fi, yi in zip(f, y, strict=True))
        return a, b, sse

    best: tuple[float, float, float, float] | None = None
    for i in range(0, 301):
        k = i / 100
        f = [xi**k for xi in x]
        a, b, sse = lsq(f)
        if best is None or sse < best[3] - 1e-12 * max(1.0, best[3]):
            best = (k, a, b, sse)
    assert best is not None
    k, a, b, _ = best
    la, lb, lsse = lsq(x)
    my = sum(y) / len(y)
    sst = sum((yi - my) ** 2 for yi in y)
    r2 = 1 - lsse / sst if sst > 0 else 1.0
    spread = (max(y) - min(y)) / max(abs(min(y)), 1e-12)
    # Growth from the first to the last point, against the growth of x.
    y_ratio = y[-1] / y[0] if y[0] > 0 else float("inf")
    x_ratio = x[-1] / x[0]
    if spread < 0.3:
        cls = "flat (within 30% over the range)"
    elif k <= 0.15:
        cls = "flat"
    elif k < 0.6:
        cls = "sublinear (log-like)"
    elif k <= 1.25:
        cls = "linear"
    else:
        cls = "worse than linear"
    return {
        "class": cls,
        "power_fit": {"a": a, "b": b, "k": k},
        "linear_fit": {"intercept": la, "per_unit": lb, "r2": r2},
        "y_ratio_first_to_last": y_ratio,
        "x_ratio_first_to_last": x_ratio,
    }


def describe_fit(name: str, fit: dict[str, Any], unit: str, per: str) -> str:
    if "power_fit" not in fit:
        return f"{name}: {fit['class']}"
    lf, pf = fit["linear_fit"], fit["power_fit"]
    return (
        f"{name}: {fit['class']}; best power fit k={pf['k']:.2f}; linear: {lf['intercept']:.4g} {unit} "
        f"+ {lf['per_unit']:.4g} {unit} per {per} (R² {lf['r2']:.3f}); "
        f"y grew {fit['y_ratio_first_to_last']:.3g}× while x grew {fit['x_ratio_first_to_last']:.3g}×"
    )


# --------------------------------------------------------------------------- plotting and output


@dataclass
class Series:
    label: str
    x: list[float]
    y: list[float]


@dataclass
class Curve:
    """One curve: what it plots, its raw points, the fitted growth of each series."""

    name: str
    title: str
    x_label: str
    y_label: str
    unit: str
    per: str
    series: list[Series]
    points: list[dict[str, Any]]
    log_x: bool = True
    log_y: bool = False
    fits: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def finish_curve(curve: Curve, out_dir: Path, img_dir: Path, meta: dict[str, Any]) -> list[str]:
    """Fit, print, write the JSON and the PNG of one curve; returns the printed lines."""
    lines = []
    for s in curve.series:
        curve.fits[s.label] = fit_growth(s.x, s.y)
        lines.append(describe_fit(f"{curve.name} / {s.label}", curve.fits[s.label], curve.unit, curve.per))
    for line in lines:
        print(line, flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {"meta": meta, **asdict(curve)}
    (out_dir / f"curve-{curve.name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    plot(curve, img_dir)
    return lines


def plot(curve: Curve, img_dir: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed (pip install -e '.[bench]'): no PNG")
        return None
    img_dir.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    for s in curve.series:
        xs = [x for x, y in zip(s.x, s.y, strict=True) if y is not None and math.isfinite(y)]
        ys = [y for y in s.y if y is not None and math.isfinite(y)]
        fit = curve.fits.get(s.label, {})
        label = s.label
        if "power_fit" in fit:
            label += f"  (k={fit['power_fit']['k']:.2f}, {fit['class'].split(' (')[0]})"
        ax.plot(xs, ys, marker="o", label=label)
    if curve.log_x:
        ax.set_xscale("log")
    if curve.log_y:
        ax.set_yscale("log")
    ax.set_xlabel(curve.x_label)
    ax.set_ylabel(curve.y_label)
    ax.set_title(textwrap.fill(curve.title, 64), fontsize=10)  # long titles would be cut off
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = img_dir / f"curve-{curve.name}.png"
    fig.savefig(path)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- the curves


class Run:
    def __init__(self, p: Params, driver: Driver, args: argparse.Namespace) -> None:
        self.p = p
        self.driver = driver
        self.args = args
        self.deadline = time.monotonic() + args.budget_min * 60
        self.out_dir = Path(args.out_dir)
        self.img_dir = Path(args.img_dir or args.out_dir)
        self.summary: list[str] = []
        self.meta = {
            "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "quick": args.quick,
            "driver": driver.name,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "kernel": platform.release(),
            "params": asdict(p),
        }

    def over_budget(self, what: str) -> bool:
        if time.monotonic() > self.deadline:
            log(f"budget of {self.args.budget_min} min spent: skipping {what}")
            return True
        return False

    def finish(self, curve: Curve) -> None:
        self.summary += finish_curve(curve, self.out_dir, self.img_dir, self.meta)

    # ---------------------------------------------------------------- streams

    def curve_streams(self) -> None:
        p = self.p
        points: list[dict[str, Any]] = []
        for n in p.streams:
            if self.over_budget(f"streams={n}"):
                break
            log(f"streams: {n:,}")
            with fresh_server([], keep=self.args.keep) as srv:
                srv.start()
                rss_empty = srv.rss()
                create = checked(self.driver.create(srv.base, "c-", n, timeout_s=60 + n / 200), "create")
                count = srv.metrics().get("tiered_streams")
                if count != n:
                    raise ServerError(f"created {n} streams but the server counts {count}")
                time.sleep(1.0)  # let the loop settle (no request in flight)
                rss_created = srv.rss()
                stop_s = srv.stop()
                snap = srv.snapshot_bytes()
                hot = dir_bytes(srv.data_dir / "hot")
                restart = srv.start()
                time.sleep(0.5)
                rss_restarted = srv.rss()
                append = checked(
                    self.driver.append(srv.base, "c-", n, p.append_size, duration_s=p.append_s), "append"
                )
                srv.stop()
            point = {
                "streams": n,
                "create": create,
                "rss_empty_bytes": rss_empty,
                "rss_after_create_bytes": rss_created,
                "rss_after_restart_bytes": rss_restarted,
                "stop_with_snapshot_s": stop_s,
                "snapshot": snap,
                "hot_dir_bytes_at_stop": hot,
                "restart": restart,
                "append": append,
            }
            points.append(point)
            log(
                f"  created {create['per_s']:.0f}/s; RSS {rss_created / MiB:.0f} MiB "
                f"(after restart {rss_restarted / MiB:.0f}); snapshot {snap['newest'] / MiB:.1f} MiB "
                f"in a {stop_s:.2f}s stop; restart {restart['ready_s']:.2f}s; "
                f"append p99 {append['latency_ms']['p99']:.1f} ms at {append['per_s']:.0f}/s"
            )
        xs = [float(pt["streams"]) for pt in points]
        mib = float(MiB)
        self.finish(
            Curve(
                "memory",
                "Server RSS against the number of streams",
                "streams",
                "RSS (MiB)",
                "MiB",
                "stream",
                [
                    Series("after creating them", xs, [pt["rss_after_create_bytes"] / mib for pt in points]),
                    Series(
                        "after a restart from the snapshot",
                        xs,
                        [pt["rss_after_restart_bytes"] / mib for pt in points],
                    ),
                ],
                points,
            )
        )
        self.finish(
            Curve(
                "snapshot",
                "Snapshot size (and clean-stop time) against the number of streams",
                "streams",
                "snapshot size (MiB)",
                "MiB",
                "stream",
                [Series("snapshot file", xs, [pt["snapshot"]["newest"] / mib for pt in points])],
                points,
            )
        )
        self.finish(
            Curve(
                "stop-streams",
                "Clean stop (writes the snapshot) against the number of streams",
                "streams",
                "seconds from SIGTERM to exit",
                "s",
                "stream",
                [Series("SIGTERM to exit", xs, [pt["stop_with_snapshot_s"] for pt in points])],
                points,
            )
        )
        self.finish(
            Curve(
                "restart-streams",
                "Restart from a snapshot against the number of streams",
                "streams",
                "seconds",
                "s",
                "stream",
                [
                    Series("exec to /healthz 200", xs, [pt["restart"]["ready_s"] for pt in points]),
                    Series(
                        "exec to 'journal recovered'",
                        xs,
                        [pt["restart"]["recovered_s"] or float("nan") for pt in points],
                    ),
                ],
                points,
            )
        )
        self.finish(
            Curve(
                "append-streams",
                f"Append latency against the number of streams ({p.append_size}-B appends at random, "
                f"{p.connections} connections)",
                "streams",
                "latency (ms)",
                "ms",
                "stream",
                [
                    Series("p99", xs, [pt["append"]["latency_ms"]["p99"] for pt in points]),
                    Series("p50", xs, [pt["append"]["latency_ms"]["p50"] for pt in points]),
                ],
                points,
            )
        )
        self.finish(
            Curve(
                "create-streams",
                "Stream creation rate against the number created",
                "streams created",
                "PUTs per second",
                "PUT/s",
                "stream",
                [Series("creation rate", xs, [pt["create"]["per_s"] for pt in points])],
                points,
            )
        )

    # ---------------------------------------------------------------- journal

    def curve_journal(self) -> None:
        p = self.p
        points: list[dict[str, Any]] = []
        n_streams = 100
        for mib in p.journal_mib:
            if self.over_budget(f"journal={mib} MiB"):
                break
            log(f"journal: {mib} MiB since the last snapshot")
            count = mib * MiB // p.journal_record
            with fresh_server(["--snapshot-every-bytes", str(64 * 1024 * MiB)], keep=self.args.keep) as srv:
                srv.start()
                checked(self.driver.create(srv.base, "j-", n_streams, timeout_s=120), "create")
                load = checked(
                    self.driver.append(
                        srv.base, "j-", n_streams, p.journal_record, count=count, timeout_s=120 + count / 100
                    ),
                    "append",
                )
                srv.kill()
                hot = dir_bytes(srv.data_dir / "hot")
                restart = srv.start()
                text = srv.log_path.read_text(errors="replace")
                m = re.search(r"journal recovered: snapshot at (\S+), (\d+) records replayed", text)
                replayed = int(m.group(2)) if m else None
                rss = srv.rss()
                srv.stop()
            points.append(
                {
                    "journal_mib_appended": mib,
                    "appends": count,
                    "record_bytes": p.journal_record,
                    "append_load": load,
                    "hot_dir_bytes": hot,
                    "records_replayed": replayed,
                    "restart": restart,
                    "rss_after_restart_bytes": rss,
                }
            )
            log(
                f"  {count:,} appends at {load['per_s']:.0f}/s; hot dir {hot / MiB:.0f} MiB; "
                f"{replayed} records replayed; ready after {restart['ready_s']:.2f}s"
            )
        xs = [pt["hot_dir_bytes"] / MiB for pt in points]
        self.finish(
            Curve(
                "restart-journal",
                f"Restart after SIGKILL against journal bytes since the last snapshot "
                f"({p.journal_record // KiB}-KiB appends)",
                "journal since the snapshot (MiB on disk)",
                "seconds",
                "s",
                "MiB",
                [
                    Series("exec to /healthz 200", xs, [pt["restart"]["ready_s"] for pt in points]),
                    Series(
                        "exec to 'journal recovered'",
                        xs,
                        [pt["restart"]["recovered_s"] or float("nan") for pt in points],
                    ),
                ],
                points,
            )
        )

    # ---------------------------------------------------------------- readers

    def curve_readers(self) -> None:
        p = self.p
        points: list[dict[str, Any]] = []
        n_streams = 100
        for kind in p.reader_kinds:
            for r in p.readers:
                if self.over_budget(f"readers={r} ({kind})"):
                    break
                log(f"readers: {r:,} {kind} readers parked")
                max_waiters = str(max(10_000, r + 100))
                with fresh_server(["--max-waiters", max_waiters], keep=self.args.keep) as srv:
                    srv.start()
                    checked(self.driver.create(srv.base, "a-", n_streams, timeout_s=120), "create")
                    readers = None
                    if r:
                        checked(self.driver.create(srv.base, "r-", r, timeout_s=120), "create")
                        readers = ParkedReaders(srv.base, [f"r-{i}" for i in range(r)], kind)
                        readers.start()
                        deadline = time.monotonic() + 120
                        parked = 0.0
                        while time.monotonic() < deadline:
                            parked = srv.metrics().get("tiered_live_readers", 0.0)
                            if parked >= r:
                                break
                            time.sleep(0.2)
                        if parked < r:
                            readers.stop()
                            raise ServerError(f"only {parked:.0f} of {r} readers parked")
                        time.sleep(0.5)
                    try:
                        rss = srv.rss()
                        append = checked(
                            self.driver.append(
                                srv.base, "a-", n_streams, p.append_size, duration_s=p.append_s
                            ),
                            "append",
                        )
                        parked_after = srv.metrics().get("tiered_live_readers", 0.0)
                    finally:
                        if readers is not None:
                            readers.stop()
                    srv.stop()
                points.append(
                    {
                        "kind": kind,
                        "readers": r,
                        "append": append,
                        "rss_bytes": rss,
                        "live_readers_after": parked_after,
                        "reader_requests": readers.requests if readers else 0,
                        "reader_failures": readers.failures if readers else 0,
                    }
                )
                log(
                    f"  append p99 {append['latency_ms']['p99']:.1f} ms, {append['per_s']:.0f}/s; "
                    f"{parked_after:.0f} readers still parked"
                )
        series = []
        for kind in p.reader_kinds:
            pts = [pt for pt in points if pt["kind"] == kind and pt["readers"] > 0]
            series.append(
                Series(
                    f"p99, {kind} readers",
                    [float(pt["readers"]) for pt in pts],
                    [pt["append"]["latency_ms"]["p99"] for pt in pts],
                )
            )
        base = [pt for pt in points if pt["readers"] == 0]
        curve = Curve(
            "append-readers",
            f"Append p99 against parked live readers ({p.append_size}-B appends over 100 streams, "
            f"{p.connections} connections)",
            "live readers parked on other streams",
            "append p99 (ms)",
            "ms",
            "reader",
            series,
            points,
        )
        if base:
            curve.notes.append(
                "p99 with no reader: "
                + ", ".join(f"{pt['kind']} run {pt['append']['latency_ms']['p99']:.1f} ms" for pt in base)
            )
        self.finish(curve)

    # ---------------------------------------------------------------- cold

    def curve_cold(self) -> None:
        p = self.p
        points: list[dict[str, Any]] = []
        args = [
            "--flush-interval-s",
            "0.2",
            "--flush-bytes",
            str(p.cold_object),
            "--cold-object-bytes",
            str(p.cold_object),
            "--hot-retention-s",
            "0",
            "--read-cache-bytes",
            "0",
        ]
        for kib in p.cold_kib:
            if self.over_budget(f"cold={kib} KiB"):
                break
            length = kib * KiB
            log(f"cold: one stream of {length / MiB:g} MiB in {p.cold_object // KiB}-KiB objects")
            with fresh_server(args, keep=self.args.keep) as srv:
                srv.start()
                url = f"{srv.base}/cold-0"
                payload = asyncio.run(write_stream(url, length, p.cold_append))
                deadline = time.monotonic() + 60 + length / MiB * 5
                m: dict[str, float] = {}
                while time.monotonic() < deadline:
                    m = srv.metrics()
                    if m.get("tiered_hot_bytes", 1) == 0 and m.get("tiered_cold_bytes", 0) >= length:
                        break
                    time.sleep(0.2)
                else:
                    raise ServerError(f"stream never went cold: {m}")
                objects = int(m.get("tiered_cold_objects", 0))
                srv.stop()
                srv.start()  # on a new port, with empty caches
                url = f"{srv.base}/cold-0"
                reads = [asyncio.run(read_stream(url, payload)) for _ in range(p.cold_reads)]
                srv.stop()
            secs = statistics.median(r["seconds"] for r in reads)
            points.append(
                {
                    "stream_bytes": length,
                    "cold_objects": objects,
                    "reads": reads,
                    "median_s": secs,
                    "requests": reads[0]["requests"],
                    "mb_per_s": length / secs / 1e6,
                }
            )
            log(
                f"  {objects} objects; full cold read {secs * 1000:.0f} ms in "
                f"{reads[0]['requests']} requests ({length / secs / 1e6:.1f} MB/s)"
            )
        xs = [pt["stream_bytes"] / MiB for pt in points]
        self.finish(
            Curve(
                "cold-read",
                f"Full cold read of one stream against its length ({p.cold_object // KiB}-KiB objects, "
                "local store, no cache)",
                "stream length (MiB)",
                "seconds (median of reads)",
                "s",
                "MiB",
                [Series("offset=-1 to up-to-date", xs, [pt["median_s"] for pt in points])],
                points,
            )
        )


async def write_stream(url: str, length: int, chunk: int) -> bytes:
    """Create the stream and append ``length`` random bytes in ``chunk``-byte appends, in order."""
    payload = os.urandom(length)
    async with aiohttp.ClientSession() as session:
        async with session.put(url, headers={"Content-Type": CONTENT_TYPE}) as resp:
            if resp.status not in (200, 201):
                raise ServerError(f"PUT {url}: {resp.status}")
        for off in range(0, length, chunk):
            body = payload[off : off + chunk]
            async with session.post(url, data=body, headers={"Content-Type": CONTENT_TYPE}) as resp:
                if resp.status >= 300:
                    raise ServerError(f"POST {url}: {resp.status} {await resp.text()}")
    return payload


async def read_stream(url: str, expected: bytes) -> dict[str, Any]:
    """Read from -1 following Stream-Next-Offset until up to date; checks the bytes."""
    got = bytearray()
    offset = "-1"
    requests = 0
    t0 = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        for _ in range(100_000):
            async with session.get(url, params={"offset": offset}) as resp:
                requests += 1
                if resp.status != 200:
                    raise ServerError(f"GET {url}?offset={offset}: {resp.status} {await resp.text()}")
                got += await resp.read()
                offset = resp.headers["Stream-Next-Offset"]
                if resp.headers.get("Stream-Up-To-Date") == "true":
                    break
    secs = time.perf_counter() - t0
    if bytes(got) != expected:
        raise ServerError(f"read {len(got)} bytes that differ from the {len(expected)} written")
    return {"seconds": secs, "requests": requests, "bytes": len(got)}


# --------------------------------------------------------------------------- main


GROUPS = ("streams", "journal", "readers", "cold")


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def replot(out_dir: Path, img_dir: Path) -> int:
    """Redraw every PNG from its JSON (a figure's look can change without re-measuring)."""
    docs = sorted(out_dir.glob("curve-*.json"))
    for path in docs:
        doc = json.loads(path.read_text())
        doc.pop("meta", None)
        doc["series"] = [Series(**s) for s in doc["series"]]
        log(f"redrawing {plot(Curve(**doc), img_dir)}")
    return 0 if docs else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny points: a smoke run")
    parser.add_argument(
        "--curves", default=",".join(GROUPS), help=f"groups to run (default {','.join(GROUPS)})"
    )
    parser.add_argument("--out-dir", default=None, help="where the JSON goes (default bench/results/curves)")
    parser.add_argument("--img-dir", default=None, help="where the PNGs go (default: the --out-dir)")
    parser.add_argument("--driver", choices=("auto", "wrk", "python"), default="auto")
    parser.add_argument("--streams", default=None, help="comma-separated stream counts (overrides)")
    parser.add_argument("--append-s", type=float, default=None, help="seconds of each append phase")
    parser.add_argument("--budget-min", type=float, default=25.0, help="skip points starting after this")
    parser.add_argument("--keep", action="store_true", help="keep data dirs and server logs")
    parser.add_argument(
        "--replot", action="store_true", help="only redraw the PNGs from the JSON in --out-dir (no server)"
    )
    args = parser.parse_args(argv)
    if args.out_dir is None:
        args.out_dir = (
            str(Path(tempfile.mkdtemp(prefix="curves-quick-"))) if args.quick else "bench/results/curves"
        )
    if args.replot:
        return replot(Path(args.out_dir), Path(args.img_dir or args.out_dir))
    groups = [g.strip() for g in args.curves.split(",") if g.strip()]
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        parser.error(f"unknown curve group(s) {unknown}; choose from {GROUPS}")
    p = Params.quick() if args.quick else Params()
    if args.streams:
        p.streams = [int(x) for x in args.streams.split(",")]
    if args.append_s is not None:
        p.append_s = args.append_s
    use_wrk = args.driver == "wrk" or (args.driver == "auto" and shutil.which("wrk") is not None)
    driver: Driver = WrkDriver(p.connections, p.threads) if use_wrk else PythonDriver(p.connections)
    fds = raise_fd_limit()
    log(
        f"driver {driver.name}; fd limit {fds}; JSON to {args.out_dir}; PNG to {args.img_dir or args.out_dir}"
    )
    run = Run(p, driver, args)
    t0 = time.monotonic()
    for g in groups:
        getattr(run, f"curve_{g}")()
    log(f"done in {time.monotonic() - t0:.0f}s")
    print("\n".join(["", "fitted growth:", *run.summary]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
