#!/usr/bin/env python3
"""CPU per acknowledged append of ``tiered serve`` builds, side by side in one run.

For each build (``--build LABEL=CMD``; the default is this tree's ``python -m tiered.cli serve``),
each round starts a fresh server on a free 127.0.0.1 port with a temp data dir (fsync ``always``,
the default), creates ``--streams`` streams, warms up with wrk, then reads the server's user +
system CPU (``/proc/PID/stat``) around a wrk window of ``--seconds`` with ``bench/wrk/append.lua``
(``--size``-byte appends, round-robin). CPU per append = CPU seconds / 2xx responses: the machine's
other load disturbs it far less than wall-time rates. Rounds alternate the builds so both see the
same load; medians are printed (and written with ``--json``). ``--null`` adds ``bench/null_server.py``
(a do-nothing handler on the same granian adapter): the floor of the HTTP stack itself.

    python bench/cpu_per_append.py --build before="env PYTHONPATH=/tmp/old python -m tiered.cli serve" \
        --build after="python -m tiered.cli serve" --rounds 3

Loopback only; every load run bounded by ``--seconds``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from compare import wait_ready  # noqa: E402
from workers import TICK, cpu_s, free_port, http  # noqa: E402


def wrk(port: int, seconds: int, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [
        "wrk", "-t1", f"-c{args.connections}", f"-d{seconds}s", "--timeout", "30s", "--latency",
        "-s", str(HERE / "wrk" / "append.lua"), f"http://127.0.0.1:{port}/v1/stream", "--",
        f"streams={args.streams}", f"size={args.size}", "prefix=cpu-", "threads=1",
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60).stdout
    line = next(x for x in out.splitlines() if x.startswith("BENCH_RESULT "))
    return dict(json.loads(line[len("BENCH_RESULT ") :]))


def thread_cpu(pid: int) -> dict[str, float]:
    """User and system CPU seconds of each of a process's threads: ``main user``, ``main sys`` (the event
    loop's thread) and the other threads by id (granian's runtime, the journal's fsync thread, executors)."""
    out: dict[str, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = "main" if int(tid) == pid else tid
        out[f"{name} user"] = int(fields[11]) / TICK
        out[f"{name} sys"] = int(fields[12]) / TICK
    return out


def by_thread(before: dict[str, float], after: dict[str, float], appends: float) -> dict[str, float]:
    """µs per append of the main thread (user, sys) and of the other threads (user, sys), summed."""
    used = {k: v - before.get(k, 0.0) for k, v in after.items()}
    out = {
        "thread main user us": 0.0,
        "thread main sys us": 0.0,
        "thread other user us": 0.0,
        "thread other sys us": 0.0,
    }
    for key, seconds in used.items():
        name, kind = key.rsplit(" ", 1)
        out[f"thread {'main' if name == 'main' else 'other'} {kind} us"] += 1e6 * seconds / max(appends, 1.0)
    return out


def one_round(cmd: str, args: argparse.Namespace) -> dict[str, float]:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="tiered-cpu-") as tmp:
        argv = [*shlex.split(cmd), "--host", "127.0.0.1", "--port", str(port)]
        if "null_server.py" not in cmd:  # the do-nothing server keeps nothing
            argv += ["--data-dir", f"{tmp}/data"]
        with open(f"{tmp}/server.log", "wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                wait_ready(proc, f"http://127.0.0.1:{port}", Path(f"{tmp}/server.log"), 60)
                for i in range(args.streams):
                    status, _ = http("PUT", f"http://127.0.0.1:{port}/v1/stream/cpu-{i}")
                    assert status in (200, 201), status
                wrk(port, 2, args)  # warm-up
                before, threads_before = cpu_s(proc.pid), thread_cpu(proc.pid)
                t0 = time.monotonic()
                res = wrk(port, args.seconds, args)
                wall = time.monotonic() - t0
                cpu = cpu_s(proc.pid) - before
                threads_after = thread_cpu(proc.pid)
            finally:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    ok = float(res.get("ok", res.get("ok_total", 0)) or (res["requests"] - res.get("non2xx_total", 0)))
    per_thread = by_thread(threads_before, threads_after, ok)
    return {
        "appends": ok,
        "cpu_s": cpu,
        "cpu_us_per_append": 1e6 * cpu / max(ok, 1.0),
        "appends_per_s": ok / wall,
        "p99_ms": float(res.get("latency_us", {}).get("percentiles", {}).get("99", 0)) / 1000,
    } | per_thread


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", action="append", default=[], help="LABEL=CMD (repeatable)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=6)
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument(
        "--null", action="store_true", help="add bench/null_server.py (granian): the stack's floor"
    )
    ap.add_argument(
        "--threads", action="store_true", help="print the CPU per append of each thread (by name)"
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    builds = [b.split("=", 1) for b in args.build] or [["tiered", f"{sys.executable} -m tiered.cli serve"]]
    if args.null:
        builds.append(["do-nothing", f"{sys.executable} {HERE / 'null_server.py'} --stack granian"])
    rows: dict[str, list[dict[str, float]]] = {label: [] for label, _ in builds}
    for _ in range(args.rounds):
        for label, cmd in builds:
            rows[label].append(one_round(cmd, args))
    out = {}
    for label, runs in rows.items():
        keys = {k for r in runs for k in r}
        med = {k: statistics.median(r.get(k, 0.0) for r in runs) for k in sorted(keys)}
        rounds = ", ".join(f"{r['cpu_us_per_append']:.1f}" for r in runs)
        out[label] = {"median": med, "rounds": runs}
        print(
            f"{label:>12}: {med['cpu_us_per_append']:7.1f} µs CPU/append  {med['appends_per_s']:8.0f} appends/s"
            f"  (rounds: {rounds})"
        )
        if args.threads:
            by_thread = "  ".join(
                f"{k[len('thread ') : -len(' us')]} {v:.1f}"
                for k, v in med.items()
                if k.startswith("thread ")
            )
            print(f"{'':>12}  µs per append by thread: {by_thread}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
