#!/usr/bin/env python3
"""Where an append's CPU goes: py-spy samples of a tiered server under wrk append load, by layer.

Starts a server (``--cmd``, host/port/data dir appended), creates 100 streams, warms up with wrk,
then records ``py-spy record --gil`` (only samples holding the GIL: the interpreter's own work,
which is what limits a one-process Python server) while wrk appends 256-B bodies, and prints the
share of samples per layer, attributed by the *leaf* frame's file:

* ``http server``: the HTTP stack (aiohttp or granian) and tiered's adapter for it;
* ``routing + middleware``: ``tiered/api/kit``, ``tiered/api/app.py``, ``tiered/api/access.py`` (router,
  middleware chain, request/response types);
* ``append logic``: ``tiered/engine/streams``, ``tiered/engine/auth``, ``tiered/engine/tenants``,
  ``tiered/api/routes``, ``hot/``, the core;
* ``journal``: ``tiered/engine/journal``, ``tiered/engine/codec.py`` (encode, commit, write thread);
* ``event loop``: asyncio/uvloop scheduling; ``threads``: handing work to and from threads;
* ``other``.

Each layer also matches its folders from before the move of issue 19, so two builds across it compare.

Run it on two builds for a before/after table (``docs/benchmarks.md``)::

    python bench/profile_append.py --label before --cmd "env PYTHONPATH=/old/build python3 -m tiered.cli serve"
    python bench/profile_append.py --label after

Needs ``py-spy`` and ``wrk`` on PATH; loopback only; every step bounded in time.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from compare import BENCH_ADMIN_TOKEN, free_port, issue_bench_token, stop_process_group  # noqa: E402

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("http server", ("aiohttp/", "granian/", "rsgi_server.py", "aiohttp_server.py", "multidict", "yarl/")),
    # Before and after the move of issue 19 (tiered/http/ became tiered/api/, tiered/streams/ tiered/engine/streams/...),
    # so that two builds across it are attributed alike.
    (
        "routing + middleware",
        (
            "tiered/http/",
            "tiered/api/kit/",
            "tiered/api/app.py",
            "tiered/api/access.py",
            "tiered/cluster/gateway/shard_router.py",
            "tiered/cluster/gateway/shard_router.py",
        ),
    ),
    ("journal", ("tiered/journal/", "tiered/engine/journal/", "tiered/engine/codec.py")),
    (
        "append logic",
        (
            "tiered/streams/",
            "tiered/auth/",
            "tiered/tenants/",
            "tiered/engine/streams/",
            "tiered/engine/auth/",
            "tiered/engine/tenants/",
            "tiered/api/routes/",
            "hot/",
            "tiered/core",
            "tiered/buckets/",
            "tiered/admin/",
            "tiered/engine/metrics.py",
            "tiered/engine/timed.py",
        ),
    ),
    ("threads", ("threading.py", "concurrent/futures")),
    ("event loop", ("asyncio/", "uvloop", "selectors.py")),
]


def layer_of(frame: str) -> str:
    """The layer a py-spy frame (``func (path:line)``) belongs to."""
    for name, needles in LAYERS:
        if any(n in frame for n in needles):
            return name
    return "other"


def summarize(raw: Path) -> dict[str, float]:
    """Share of GIL-holding samples per layer, by leaf frame."""
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n_text = line.rpartition(" ")
        if not n_text.isdigit():
            continue
        n = int(n_text)
        total += n
        counts[layer_of(stack.split(";")[-1])] += n
    return {name: 100.0 * counts[name] / total for name, _ in [*LAYERS, ("other", ())]} | {
        "samples": float(total)
    }


def top_frames(raw: Path, n: int) -> dict[str, list[tuple[str, float]]]:
    """The ``n`` frames with the most samples, as a leaf (self) and anywhere in the stack (inclusive), in %."""
    leaf: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n_text = line.rpartition(" ")
        if not n_text.isdigit():
            continue
        count = int(n_text)
        total += count
        frames = [f for f in stack.split(";") if f]
        if frames:
            leaf[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    share = 100.0 / max(total, 1)
    return {
        "self": [(f, round(c * share, 2)) for f, c in leaf.most_common(n)],
        "inclusive": [(f, round(c * share, 2)) for f, c in inclusive.most_common(n)],
    }


def wrk(port: int, seconds: int, authorization: str = "") -> str:
    script = HERE / "wrk" / "append.lua"
    argv = ["wrk", "-t1", "-c64", f"-d{seconds}s", "--latency", "-s", str(script)]
    argv += [
        f"http://127.0.0.1:{port}/v1/stream",
        "--",
        "streams=100",
        "size=256",
        "prefix=prof-",
        "threads=1",
    ]
    env = {**os.environ, "BENCH_AUTHORIZATION": authorization}
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=seconds + 30, check=True, env=env
    ).stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cmd", default=f"{sys.executable} -m tiered.cli serve", help="server command")
    ap.add_argument("--label", default="tiered")
    ap.add_argument("--seconds", type=int, default=8)
    ap.add_argument("--auth", action="store_true", help="serve with --auth tokens; wrk sends a write token")
    ap.add_argument("--keep-raw", type=Path, help="copy the py-spy raw file here")
    ap.add_argument("--top", type=int, default=0, help="also list the N busiest frames (self and inclusive)")
    args = ap.parse_args()
    for tool in ("wrk", "py-spy"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} not found on PATH")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="tiered-prof-") as tmp:
        argv = [
            *shlex.split(args.cmd),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--data-dir",
            f"{tmp}/data",
        ]
        log = open(f"{tmp}/server.log", "wb")
        env = dict(os.environ)
        if args.auth:
            argv += ["--auth", "tokens"]
            env["TIERED_ADMIN_TOKEN"] = BENCH_ADMIN_TOKEN
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise SystemExit(f"server did not start; log: {tmp}/server.log") from None
                    time.sleep(0.1)
            base = f"http://127.0.0.1:{port}/v1/stream"
            authorization = issue_bench_token(base, "/v1/stream") if args.auth else ""
            for i in range(100):
                headers = {"Content-Type": "application/octet-stream"}
                if authorization:
                    headers["Authorization"] = authorization
                req = urllib.request.Request(f"{base}/prof-{i}", method="PUT", headers=headers)
                urllib.request.urlopen(req, timeout=10).close()
            wrk(port, 3, authorization)  # warm-up
            raw = Path(tmp) / "prof.raw"
            spy_argv = ["py-spy", "record", "--gil", "--nonblocking", "-r", "250", "-f", "raw"]
            spy = subprocess.Popen(
                [*spy_argv, "-d", str(args.seconds), "-p", str(proc.pid), "-o", str(raw)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            out = wrk(port, args.seconds, authorization)
            spy.wait(timeout=args.seconds + 30)
            shares = summarize(raw)
            top = top_frames(raw, args.top) if args.top else None
            if args.keep_raw:
                shutil.copy(raw, args.keep_raw)
        finally:
            stop_process_group(proc)
            log.close()
    rps = next((line.split()[-1] for line in out.splitlines() if line.startswith("Requests/sec")), "?")
    result: dict[str, object] = {"label": args.label, "requests_per_s": rps, "shares_percent": shares}
    if top is not None:
        result["top_frames_percent"] = top
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
