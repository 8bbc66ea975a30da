#!/usr/bin/env python3
"""SSE fan-out: 1,000 SSE readers on one stream, latency from append to every reader.

For each server (``--servers``, default ``ref-file,tiered,ref-mem``; started
one after the other by ``bench/compare.py``'s ``running_server``: a free
127.0.0.1 port, a fresh data dir, its own process group, always stopped):

1. create one ``text/plain`` stream and read its tail offset (``HEAD``);
2. open ``--readers`` SSE connections (``?offset=<tail>&live=sse``) from one
   asyncio + aiohttp process (fd limit raised with ``resource.setrlimit``),
   and wait until every one has its response headers;
3. one writer appends ``--records`` records at ``--rate`` per second; record
   ``i`` is the text ``#i,`` and the writer notes the time just before its
   POST is sent and when the 2xx arrives;
4. each reader scans its SSE bytes for ``#i,`` and notes when it saw ``i``;
   a reader whose connection the server closes reconnects from the last
   ``streamNextOffset`` of a control event.

Delivery latency = reader's receive time − the time before the POST was sent
(one clock: readers and writer share the process). Reported per server:
p50/p99/max over every (record, reader) delivery, the p50/p99 of the time
until the *last* reader got a record, the append acknowledgment latency, and
missing deliveries (which must be 0). Client and servers share the machine's
CPUs; the client's own scheduling delay is part of every figure, equally for
every server. Example::

    python bench/sse_fanout.py --json bench/results/sse-fanout.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import re
import resource
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import (  # noqa: E402  (needs the sys.path entry above)
    DEFAULT_REFERENCE_SCRIPT,
    SERVER_LABELS,
    ServerUnavailable,
    add_other_tiered_argument,
    build_specs,
    running_server,
)

MARK = re.compile(rb"#(\d+),")
NEXT_OFFSET = re.compile(rb'"streamNextOffset"\s*:\s*"([^"]+)"')


def log(msg: str) -> None:
    print(f"[sse-fanout {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pct(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return float("nan")
    rank = max(1, math.ceil(q / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


class Reader:
    """One SSE connection; records when each record number first arrived."""

    def __init__(self, url: str, offset: str) -> None:
        self.url = url
        self.offset = offset
        self.seen: dict[int, float] = {}
        self.connected = asyncio.Event()
        self.reconnects = 0
        self.errors: list[str] = []

    async def run(self, session: aiohttp.ClientSession, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                async with session.get(self.url, params={"offset": self.offset, "live": "sse"}) as resp:
                    if resp.status != 200:
                        self.errors.append(f"status {resp.status}")
                        await asyncio.sleep(0.5)
                        continue
                    self.connected.set()
                    tail = b""
                    async for chunk in resp.content.iter_any():
                        now = time.perf_counter()
                        buf = tail + chunk
                        for m in MARK.finditer(buf):
                            self.seen.setdefault(int(m.group(1)), now)
                        for m in NEXT_OFFSET.finditer(buf):
                            self.offset = m.group(1).decode()
                        # Keep a tail long enough to hold a marker or an offset cut in two.
                        tail = buf[-160:]
                self.reconnects += 1
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001  (reported, then retried)
                self.errors.append(repr(exc))
                await asyncio.sleep(0.5)


async def fanout(base_url: str, args: argparse.Namespace) -> dict[str, Any]:
    url = f"{base_url}/fanout-{os.getpid()}"
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as session:
        async with session.put(url, headers={"Content-Type": "text/plain"}) as resp:
            if resp.status not in (200, 201):
                raise RuntimeError(f"PUT: {resp.status} {await resp.text()}")
            tail = resp.headers.get("Stream-Next-Offset")
        if tail is None:
            async with session.head(url) as resp:
                tail = resp.headers["Stream-Next-Offset"]
        readers = [Reader(url, tail) for _ in range(args.readers)]
        stop = asyncio.Event()
        tasks = []
        t_connect = time.perf_counter()
        for i in range(0, len(readers), 100):  # a bounded connect burst
            tasks += [asyncio.create_task(r.run(session, stop)) for r in readers[i : i + 100]]
            await asyncio.sleep(0.02)
        try:
            await asyncio.wait_for(
                asyncio.gather(*(r.connected.wait() for r in readers)), timeout=args.connect_timeout
            )
        except TimeoutError:
            n = sum(r.connected.is_set() for r in readers)
            raise RuntimeError(f"only {n} of {len(readers)} readers connected") from None
        connect_s = time.perf_counter() - t_connect
        await asyncio.sleep(1.0)  # let the connect burst settle

        sent: dict[int, float] = {}
        acked: dict[int, float] = {}
        ack_errors: list[str] = []
        write_conn = aiohttp.TCPConnector(limit=1)
        async with aiohttp.ClientSession(connector=write_conn) as writer:
            t0 = time.perf_counter()
            for i in range(args.records):
                delay = t0 + i / args.rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                body = f"#{i},".encode()
                sent[i] = time.perf_counter()
                async with writer.post(url, data=body, headers={"Content-Type": "text/plain"}) as resp:
                    await resp.read()
                    acked[i] = time.perf_counter()
                    if resp.status >= 300:
                        ack_errors.append(f"{i}: {resp.status}")
        # Drain: wait until every reader saw every record, or the grace period ends.
        deadline = time.perf_counter() + args.drain_s
        while time.perf_counter() < deadline:
            if all(len(r.seen) >= args.records for r in readers):
                break
            await asyncio.sleep(0.1)
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    deliveries: list[float] = []
    last_reader: list[float] = []
    missing = 0
    for i in range(args.records):
        times = [r.seen[i] - sent[i] for r in readers if i in r.seen]
        missing += len(readers) - len(times)
        deliveries += times
        if len(times) == len(readers):
            last_reader.append(max(times))
    deliveries.sort()
    last_reader.sort()
    acks = sorted(acked[i] - sent[i] for i in acked)
    ms = 1000.0
    return {
        "readers": args.readers,
        "records": args.records,
        "rate_per_s": args.rate,
        "connect_s": connect_s,
        "deliveries": len(deliveries),
        "missing_deliveries": missing,
        "reconnects": sum(r.reconnects for r in readers),
        "reader_errors": sum(len(r.errors) for r in readers),
        "append_errors": ack_errors,
        "delivery_ms": {
            "p50": pct(deliveries, 50) * ms,
            "p90": pct(deliveries, 90) * ms,
            "p99": pct(deliveries, 99) * ms,
            "max": (deliveries[-1] * ms) if deliveries else float("nan"),
        },
        "last_reader_ms": {
            "p50": pct(last_reader, 50) * ms,
            "p99": pct(last_reader, 99) * ms,
            "max": (last_reader[-1] * ms) if last_reader else float("nan"),
        },
        "append_ack_ms": {"p50": pct(acks, 50) * ms, "p99": pct(acks, 99) * ms},
    }


def raise_fd_limit(need: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(need, soft)), hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def table(results: dict[str, dict[str, Any]]) -> str:
    keys = list(results)
    rows = [
        ("delivery p50 (ms)", lambda r: f"{r['delivery_ms']['p50']:.1f}"),
        ("delivery p90 (ms)", lambda r: f"{r['delivery_ms']['p90']:.1f}"),
        ("delivery p99 (ms)", lambda r: f"{r['delivery_ms']['p99']:.1f}"),
        ("delivery max (ms)", lambda r: f"{r['delivery_ms']['max']:.1f}"),
        ("last reader p50 (ms)", lambda r: f"{r['last_reader_ms']['p50']:.1f}"),
        ("last reader p99 (ms)", lambda r: f"{r['last_reader_ms']['p99']:.1f}"),
        ("append ack p50 (ms)", lambda r: f"{r['append_ack_ms']['p50']:.1f}"),
        ("deliveries", lambda r: f"{r['deliveries']:,}"),
        ("missing deliveries", lambda r: f"{r['missing_deliveries']:,}"),
        ("reconnects", lambda r: f"{r['reconnects']}"),
        ("all readers connected in (s)", lambda r: f"{r['connect_s']:.2f}"),
    ]
    head = "| metric | " + " | ".join(SERVER_LABELS.get(k, k) for k in keys) + " |"
    sep = "|---|" + "---:|" * len(keys)
    lines = [head, sep]
    for label, f in rows:
        cells = [f(results[k]) if "delivery_ms" in results[k] else "n/a" for k in keys]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", default="ref-file,tiered,ref-mem", help="run order (compare.py's keys)")
    parser.add_argument("--readers", type=int, default=1000)
    parser.add_argument("--records", type=int, default=100)
    parser.add_argument("--rate", type=float, default=5.0, help="appends per second")
    parser.add_argument("--drain-s", type=float, default=10.0, help="grace for the last deliveries")
    parser.add_argument("--connect-timeout", type=float, default=60.0)
    parser.add_argument("--reference-script", default=DEFAULT_REFERENCE_SCRIPT)
    parser.add_argument("--tiered-cmd", default=f"{shlex.quote(sys.executable)} -m tiered.cli serve")
    parser.add_argument("--tiered-args", default="")
    add_other_tiered_argument(parser)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    if not (1 <= args.readers <= 20_000 and 1 <= args.records <= 100_000 and 0 < args.rate <= 1000):
        parser.error("readers 1..20000, records 1..100000, rate 0..1000")
    if args.records / args.rate > 50:
        parser.error("records / rate must stay under 50 s (tiered closes SSE connections after 60 s)")
    fds = raise_fd_limit(args.readers + 200)
    specs = build_specs(args)
    keys = [k.strip() for k in args.servers.split(",") if k.strip()]
    results: dict[str, dict[str, Any]] = {}
    for key in keys:
        spec = specs[key]
        log(f"{spec.label}: starting")
        try:
            with running_server(spec, "/v1/stream", 120.0, False) as (url, info):
                res = asyncio.run(fanout(url, args))
                res["server"] = {k: info[k] for k in ("argv", "data_dir_fs")}
        except (ServerUnavailable, RuntimeError) as exc:
            log(f"{spec.label}: {exc}")
            results[key] = {"error": str(exc)}
            continue
        results[key] = res
        log(
            f"{spec.label}: delivery p50 {res['delivery_ms']['p50']:.1f} ms, p99 {res['delivery_ms']['p99']:.1f} ms, "
            f"max {res['delivery_ms']['max']:.1f} ms; missing {res['missing_deliveries']}"
        )
    print(table(results))
    if args.json:
        out = {
            "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "fd_limit": fds,
            "params": {k: getattr(args, k) for k in ("readers", "records", "rate", "drain_s")},
            "servers": results,
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
        log(f"wrote {args.json}")
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
