#!/usr/bin/env python3
"""What keeping integrity digests costs an append: the upkeep with it on and off, side by side.

Two measurements (figures in docs/benchmarks.md, "Integrity digests"):

1. The function: ``integrity.note_record`` (one SHA-256 over the record and its identity, a
   256-bit add, the record kept for its release) per call, by body size.
2. The append path in process (no HTTP, which only adds per-append cost and so makes the share
   smaller): an ``Engine`` on a temporary data dir, ``--streams`` streams, ``--concurrency``
   appenders calling ``StreamService.append`` (journal, group commit, fsync as configured) for
   ``--seconds`` per round; rounds alternate digests on / off (off: ``note_record`` replaced by a
   no-op, the only hook that runs per append) so both see the same machine load; medians.

3. With ``--http``: the real append path, a ``tiered serve`` child (digests on, or off: the same
   hook replaced by a no-op in that process before it starts) on a free 127.0.0.1 port, loaded by
   wrk (``bench/wrk/append.lua``) for ``--seconds``; appends per second and per CPU second of the
   server process (``/proc/PID/stat``: user + system time, which the machine's other load
   disturbs far less than wall time), rounds alternating on / off.

Bounded in time: ``--rounds`` x 2 x ``--seconds`` (plus start-up); loopback only.

    python bench/integrity_cost.py --json bench/results/integrity.json
    python bench/integrity_cost.py --http --json bench/results/integrity-http.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tiered.core.config import Config  # noqa: E402
from tiered.engine.engine import Engine  # noqa: E402
from tiered.engine.streams import appends, integrity, lifecycle  # noqa: E402
from tiered.engine.streams.model import AppendRequest, CreateRequest, Stream  # noqa: E402

OCTET = "application/octet-stream"


def function_cost(sizes: list[int]) -> dict[str, float]:
    """Microseconds per ``note_record`` call, by body size (the stream's hasher already built)."""
    s = Stream(1, "default", "bench/stream", OCTET, None, None, None, 0, None, 0, None, 0)
    integrity.fresh(s)
    out: dict[str, float] = {}
    for size in sizes:
        data = os.urandom(size)
        n = 20_000 if size <= 4096 else 2_000
        pos = [0]

        def once(data: bytes = data, pos: list[int] = pos, size: int = size) -> None:
            integrity.note_record(s, pos[0], data)
            pos[0] += size

        best = min(timeit.repeat(once, number=n, repeat=5)) / n
        out[str(size)] = round(best * 1e6, 3)
        assert s.integrity is not None
        s.integrity.hot.clear()
    return out


async def append_round(data_dir: Path, args: argparse.Namespace, on: bool) -> tuple[float, float]:
    """One round (a fresh engine on a fresh dir): appends per wall second, and per CPU second of
    this process (all its threads: the journal's writer too), which other load on the machine
    disturbs far less than wall time."""
    config = Config(data_dir=str(data_dir), flush_interval_s=3600.0, gc_interval_s=3600.0, fsync=args.fsync)
    config.validate()
    engine = Engine(config)
    await engine.start(jobs=False)
    original = integrity.note_record
    if not on:
        noop = lambda s, start, data: None  # noqa: E731
        appends.integrity.note_record = noop  # type: ignore[attr-defined]
        lifecycle.integrity.note_record = noop  # type: ignore[attr-defined]
    try:
        streams = engine.streams
        paths = [f"bench/{i}" for i in range(args.streams)]
        for p in paths:
            await streams.create("default", p, CreateRequest(OCTET, None, None, None, False, b""))
        body = os.urandom(args.body)
        done = 0
        stop_at = time.monotonic() + args.seconds

        async def appender(k: int) -> None:
            nonlocal done
            i = k
            while time.monotonic() < stop_at:
                await streams.append("default", paths[i % len(paths)], AppendRequest(OCTET, body, False))
                done += 1
                i += args.concurrency

        started, cpu = time.monotonic(), time.process_time()
        await asyncio.gather(*(appender(k) for k in range(args.concurrency)))
        rate = done / (time.monotonic() - started)
        per_cpu = done / (time.process_time() - cpu)
        s = streams.lookup("default", paths[0])
        assert (s.integrity is not None and s.integrity.live_records > 0) == on
        return rate, per_cpu
    finally:
        appends.integrity.note_record = original  # type: ignore[attr-defined]
        lifecycle.integrity.note_record = original  # type: ignore[attr-defined]
        await engine.stop()


# The server, started with the digest hook replaced by a no-op when its first argument is "off".
_SERVE = (
    "import sys\n"
    "from tiered.engine.streams import appends, lifecycle\n"
    "if sys.argv.pop(1) == 'off':\n"
    "    appends.integrity.note_record = lifecycle.integrity.note_record = lambda s, start, data: None\n"
    "from tiered.cli.main import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (its threads included), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def http_round(data_dir: Path, args: argparse.Namespace, on: bool) -> tuple[float, float]:
    """One round against a fresh server: appends per wall second, and per server CPU second."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from compare import free_port, stop_process_group

    port = free_port()
    cmd = [sys.executable, "-c", _SERVE, "on" if on else "off", "serve", "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--data-dir", str(data_dir), "--fsync", args.fsync]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(base + "/healthz", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the server did not start") from None
                time.sleep(0.1)
        for i in range(args.streams):
            req = urllib.request.Request(
                f"{base}/v1/stream/bench-{i}", method="PUT", headers={"Content-Type": OCTET}
            )
            urllib.request.urlopen(req, timeout=10).close()
        script = str(Path(__file__).resolve().parent / "wrk" / "append.lua")
        wrk = [
            "wrk",
            "-t2",
            f"-c{args.concurrency}",
            f"-d{max(1, round(args.seconds))}s",
            "-s",
            script,
            f"{base}/v1/stream",
        ]
        wrk += ["--", f"streams={args.streams}", f"size={args.body}", "prefix=bench-", "threads=2"]
        cpu = _cpu_seconds(proc.pid)
        out = subprocess.run(wrk, capture_output=True, text=True, timeout=args.seconds + 60).stdout
        cpu = _cpu_seconds(proc.pid) - cpu
        m = re.search(r"^BENCH_RESULT (.*)$", out, re.M)
        if m is None:
            raise RuntimeError(f"wrk printed no result:\n{out}")
        result = json.loads(m.group(1))
        if result["non2xx"] or any(result["socket_errors"].values()):
            raise RuntimeError(f"appends failed: {result}")
        ok = int(result["ok"])
        return ok / (result["duration_us"] / 1e6), ok / cpu
    finally:
        stop_process_group(proc)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--body", type=int, default=256, help="append body bytes")
    parser.add_argument("--seconds", type=float, default=8.0, help="per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per setting (alternating)")
    parser.add_argument("--fsync", default="always", choices=("always", "interval"))
    parser.add_argument("--warmup", type=int, default=1, help="uncounted rounds first")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--http", action="store_true", help="measure a tiered serve child under wrk load")
    args = parser.parse_args()

    results: dict[str, Any] = {"function_us": function_cost(sorted({256, 4096, 65536, args.body}))}
    rates: dict[str, list[float]] = {"on": [], "off": []}
    per_cpu: dict[str, list[float]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory(prefix="tiered-integrity-bench-") as tmp:
        # Round -1 warms up (caches, bytecode, the disk) and is not counted: the first round of a run
        # is the slowest, and without it the setting that runs first would carry that.
        for r in range(-args.warmup, args.rounds):
            for setting in ("on", "off") if r % 2 == 0 else ("off", "on"):
                where, on_ = Path(tmp) / f"{setting}-{r}", setting == "on"
                if args.http:
                    if shutil.which("wrk") is None:
                        raise SystemExit("--http needs wrk on PATH")
                    rate, cpu_rate = http_round(where, args, on_)
                else:
                    rate, cpu_rate = asyncio.run(append_round(where, args, on_))
                if r < 0:
                    print(f"warm-up digests {setting:3}: {rate:9.1f} appends/s (not counted)", flush=True)
                    continue
                rates[setting].append(round(rate, 1))
                per_cpu[setting].append(round(cpu_rate, 1))
                print(
                    f"round {r} digests {setting:3}: {rate:9.1f} appends/s, {cpu_rate:9.1f} per CPU second",
                    flush=True,
                )
    on, off = statistics.median(rates["on"]), statistics.median(rates["off"])
    cpu_on, cpu_off = statistics.median(per_cpu["on"]), statistics.median(per_cpu["off"])
    results.update(
        rates=rates,
        median_on=on,
        median_off=off,
        cost_percent=round(100 * (off - on) / off, 2),
        per_cpu_second=per_cpu,
        median_per_cpu_on=cpu_on,
        median_per_cpu_off=cpu_off,
        cpu_cost_percent=round(100 * (cpu_off - cpu_on) / cpu_off, 2),
        # The function's time per append (at this body size) over an append's CPU time without digests.
        function_share_percent=round(100 * results["function_us"][str(args.body)] * cpu_off / 1e6, 2),
        settings=vars(args),
        load_average=os.getloadavg(),
        cpus=os.cpu_count(),
    )
    print(f"function cost (us per record, by body bytes): {results['function_us']}")
    print(f"function share of an append without digests: {results['function_share_percent']}%")
    print(
        f"append path: median {on:.1f}/s with digests, {off:.1f}/s without: {results['cost_percent']}% cost"
    )
    print(
        f"append path per CPU second: median {cpu_on:.1f} with digests, {cpu_off:.1f} without: "
        f"{results['cpu_cost_percent']}% cost"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
