#!/usr/bin/env python3
"""CPU per append of each worker of ``tiered serve --workers N``, and what forwarding between workers costs.

Each row starts a fresh node on a free 127.0.0.1 port with a temp data dir
(fsync ``always``, the default), creates ``--streams`` streams, runs
``wrk`` with ``bench/wrk/append.lua`` (``--size``-byte appends, round-robin)
for ``--duration`` seconds, and reads every server process's user + system
CPU from ``/proc`` before and after the window; an idle window of the same
length first gives each process's background CPU (lease loop, the shards'
jobs), which is subtracted. Rows:

* ``single``: ``--workers 1``, today's single process (the baseline);
* ``workers-spread``: ``--workers N`` with ``--worker-shards`` shards: the
  kernel spreads connections over the workers, shards are spread too, so
  about (N-1)/N of the appends are forwarded once;
* ``workers-one-shard``: ``--workers N --worker-shards 1``: one worker owns
  every stream and the others only forward; the non-owners' CPU divided by
  the appends they forwarded (``tiered_cluster_forwarded``) is the cost of
  forwarding one append, to compare with the owner's CPU per append.
* ``direct``: the cost of a forwarded append against a local one on the same
  node, with nothing left to the kernel's choice: ``--workers 2
  --worker-shards 1``, and the same append load (a small asyncio HTTP/1.1
  client in this process, ``--connections`` keep-alive connections) sent
  straight to one worker's own Unix socket (the socket siblings reach it
  through, plain HTTP, served by the same handler): first the owner's
  (``direct-local``: every append local), then the other worker's
  (``direct-forwarded``: every append forwarded once). Both workers' CPU is
  counted; the forwarding overhead is (forwarded - local) / local.

Prints a table and, with ``--json``, writes every figure. Loopback only;
every load run bounded by ``--duration``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def http(method: str, url: str, body: bytes = b"", timeout: float = 30) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body if method in ("PUT", "POST") else None, method=method)
    req.add_header("Content-Type", "application/octet-stream")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class Node:
    def __init__(self, cmd: list[str], workers: int, shards: int, data: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = data.parent / "server.log"
        args = ["--host", "127.0.0.1", "--port", str(self.port), "--data-dir", str(data)]
        args += ["--workers", str(workers), "--worker-shards", str(shards)]
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [*cmd, *args], stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.workers = workers

    def wait_up(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log_path.read_text()[-3000:]}")
            try:
                if http("GET", self.url + "/healthz", timeout=2)[0] == 200 and self._all_listening():
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError("server did not come up")

    def _all_listening(self) -> bool:
        return self.workers == 1 or "tiered listening on" in self.log_path.read_text(errors="replace")

    def pids(self) -> dict[str, int]:
        """Every server process: the supervisor (or the single process) and each worker."""
        found = {"main": self.proc.pid}
        text = self.log_path.read_text(errors="replace")
        found.update({w: int(p) for w, p in re.findall(r"worker (w\d+) started \(pid (\d+)\)", text)})
        return found

    def cpu(self) -> dict[str, float]:
        return {name: cpu_s(pid) for name, pid in self.pids().items()}

    def metric(self, name: str) -> dict[str, float]:
        """``name``'s samples summed by worker (or under ``main`` for a single process)."""
        _, body = http("GET", self.url + "/metrics")
        out: dict[str, float] = {}
        for line in body.decode().splitlines():
            if not line.startswith(name):
                continue
            worker = m.group(1) if (m := re.search(r'worker="(w\d+)"', line)) else "main"
            out[worker] = out.get(worker, 0.0) + float(line.rsplit(" ", 1)[1])
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def wrk(url: str, args: argparse.Namespace, prefix: str) -> dict[str, Any]:
    cmd = [
        "wrk", f"-t{args.threads}", f"-c{args.connections}", f"-d{args.duration}s", "--timeout", "30s",
        "--latency", "-s", str(HERE / "wrk" / "append.lua"), url + "/v1/stream", "--",
        f"streams={args.streams}", f"size={args.size}", f"prefix={prefix}", f"threads={args.threads}",
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.duration + 60).stdout
    line = next(x for x in out.splitlines() if x.startswith("BENCH_RESULT "))
    return dict(json.loads(line[len("BENCH_RESULT ") :]))


async def _unix_load(
    path: str, requests: list[bytes], connections: int, duration_s: float, rate: float = 0.0
) -> tuple[int, int, list[float]]:
    """Keep-alive appends over a Unix socket for ``duration_s``: (2xx answers, others, latencies in s).

    ``rate`` > 0: at most that many appends per second in all (each connection keeps its slots), so
    two rows compared run at the same rate, with the same group-commit batches; 0: as fast as answered.
    """
    import asyncio

    ok = bad = 0
    latencies: list[float] = []
    begin = time.monotonic()
    end = begin + duration_s

    async def one(k: int) -> None:
        nonlocal ok, bad
        if path.startswith("tcp:"):
            _, host, port = path.split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
        else:
            reader, writer = await asyncio.open_unix_connection(path)
        i = k
        n = 0
        try:
            while time.monotonic() < end:
                if rate > 0:
                    slot = begin + (n * connections + k) / rate
                    n += 1
                    if slot > time.monotonic():
                        await asyncio.sleep(slot - time.monotonic())
                started = time.monotonic()
                writer.write(requests[i % len(requests)])
                i += connections
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head[9:12])
                m = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
                if m and int(m.group(1)):
                    await reader.readexactly(int(m.group(1)))
                latencies.append(time.monotonic() - started)
                if 200 <= status < 300:
                    ok += 1
                else:
                    bad += 1
        finally:
            writer.close()

    await asyncio.gather(*(one(k) for k in range(connections)))
    return ok, bad, latencies


def _appends(prefix: str, streams: int, size: int) -> list[bytes]:
    body = b"x" * size
    return [
        (
            f"POST /v1/stream/{prefix}{i} HTTP/1.1\r\nHost: bench\r\n"
            f"Content-Type: application/octet-stream\r\nContent-Length: {size}\r\n\r\n"
        ).encode()
        + body
        for i in range(streams)
    ]


def _sockets(node: Node) -> Path:
    """The workers' socket directory, from a worker's spec (``tiered/cli/worker.py``)."""
    pid = next(p for name, p in node.pids().items() if name != "main")
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    spec = next(e for e in env if e.startswith(b"TIERED_WORKER_SPEC="))
    return Path(json.loads(spec.split(b"=", 1)[1])["sockets"])


class _Direct:
    """One build's nodes for the direct rows: a single process, and two workers with one shard."""

    def __init__(self, name: str, cmd: str, tmp: Path, args: argparse.Namespace) -> None:
        self.name = name
        for part in ("single", "workers"):
            (tmp / f"{name}-{part}").mkdir()
        self.single = Node(shlex.split(cmd), 1, 1, tmp / f"{name}-single" / "data")
        self.node = Node(shlex.split(cmd), 2, 1, tmp / f"{name}-workers" / "data")
        self.prefix = f"bd{int(time.time())}-"
        self.args = args

    def start(self) -> None:
        for node in (self.single, self.node):
            node.wait_up()
            for i in range(self.args.streams):
                status, body = http("PUT", f"{node.url}/v1/stream/{self.prefix}{i}")
                assert status == 201, (status, body)
        served = self.node.metric("tiered_cluster_shards_served")
        self.owner = max(served, key=lambda w: served[w])
        self.other = next(w for w in self.node.pids() if w not in ("main", self.owner))
        sockets = _sockets(self.node)
        self.targets = {
            "single": (self.single, f"tcp:127.0.0.1:{self.single.port}"),
            "local": (self.node, str(sockets / f"{self.owner}.sock")),
            "forwarded": (self.node, str(sockets / f"{self.other}.sock")),
        }

    def stop(self) -> None:
        self.single.stop()
        self.node.stop()


def run_direct(args: argparse.Namespace) -> list[dict[str, Any]]:
    """``direct-*`` rows (see the docstring): each build's single process, and its two-worker node's
    local and forwarded appends, interleaved round by round so a change of load hits every row alike."""
    import asyncio

    try:  # the load generator's own CPU competes with the node's on a small machine: the cheaper loop
        import uvloop

        run = uvloop.run
    except ImportError:
        run = asyncio.run

    builds = [("this", args.cmd)] + [tuple(b.split("=", 1)) for b in args.direct_against]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tiered-bench-workers-") as tmp:
        directs = [_Direct(name, cmd, Path(tmp), args) for name, cmd in builds]
        try:
            for d in directs:
                d.start()
            requests = _appends(directs[0].prefix, args.streams, args.size)
            for d in directs:
                for _, target in d.targets.values():
                    run(_unix_load(target, _appends(d.prefix, args.streams, args.size), args.connections, 1))
            idle = _idle_cpu([n for d in directs for n in (d.single, d.node)], args.duration)
            for _ in range(args.direct_repeat):
                for d in directs:
                    requests = _appends(d.prefix, args.streams, args.size)
                    for what, (node, target) in d.targets.items():
                        row = _direct_once(run, node, target, requests, idle, args)
                        row["label"] = f"direct-{what}" + ("" if d.name == "this" else f"@{d.name}")
                        rows.append(row)
        finally:
            for d in directs:
                d.stop()
    labels = list(dict.fromkeys(r["label"] for r in rows))
    out = [_median_row([r for r in rows if r["label"] == label]) for label in labels]
    by_label = {r["label"]: r for r in out}
    for r in out:
        base = by_label.get(r["label"].replace("forwarded", "local"))
        if "forwarded" in r["label"] and base is not None:
            r["overhead_vs_local"] = (r["cpu_us_per_append_total"] - base["cpu_us_per_append_total"]) / base[
                "cpu_us_per_append_total"
            ]
    return out


def _idle_cpu(nodes: list[Node], seconds: float) -> dict[int, dict[str, float]]:
    """Each node's processes' CPU seconds per second while nothing is asked of them."""
    before = [n.cpu() for n in nodes]
    time.sleep(seconds)
    return {
        id(n): {k: (v - b.get(k, 0.0)) / seconds for k, v in n.cpu().items()}
        for n, b in zip(nodes, before, strict=True)
    }


def _direct_once(
    run: Any,
    node: Node,
    target: str,
    requests: list[bytes],
    idle: dict[int, dict[str, float]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    forwarded_before = sum(node.metric("tiered_cluster_forwarded_total").values())
    before = node.cpu()
    started = time.monotonic()
    ok, bad, lat = run(_unix_load(target, requests, args.connections, args.duration, args.direct_rate))
    seconds = time.monotonic() - started
    after = node.cpu()
    forwarded = sum(node.metric("tiered_cluster_forwarded_total").values()) - forwarded_before
    own_idle = idle[id(node)]
    net = {k: max(0.0, after[k] - before.get(k, 0.0) - own_idle.get(k, 0.0) * seconds) for k in after}
    lat.sort()
    per = {k: 1e6 * v / ok for k, v in net.items()} if ok else {}
    return {
        "target": target,
        "workers": node.workers,
        "appends_per_s": ok / seconds,
        "p50_ms": 1000 * lat[len(lat) // 2] if lat else 0.0,
        "p99_ms": 1000 * lat[int(len(lat) * 0.99)] if lat else 0.0,
        "non2xx": bad,
        "cpu_us_per_append": per,
        "cpu_us_per_append_total": sum(per.values()),
        "forwarded": {"all": forwarded},
        "forwarded_share": forwarded / ok if ok else 0.0,
    }


def _median_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median CPU per append, with every run's figures beside it."""
    ranked = sorted(runs, key=lambda r: r["cpu_us_per_append_total"])
    row = dict(ranked[len(ranked) // 2])
    row["runs"] = [
        {k: r[k] for k in ("appends_per_s", "p99_ms", "cpu_us_per_append", "cpu_us_per_append_total")}
        for r in runs
    ]
    return row


def run_row(label: str, workers: int, shards: int, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tiered-bench-workers-") as tmp:
        node = Node(shlex.split(args.cmd), workers, shards, Path(tmp) / "data")
        try:
            node.wait_up()
            prefix = f"bw{int(time.time())}-"
            for i in range(args.streams):
                status, body = http("PUT", f"{node.url}/v1/stream/{prefix}{i}")
                assert status == 201, (status, body)
            wrk(node.url, argparse.Namespace(**{**vars(args), "duration": 2}), prefix)  # warm-up
            before_idle = node.cpu()
            time.sleep(args.duration)
            idle = {k: v - before_idle.get(k, 0.0) for k, v in node.cpu().items()}
            forwarded_before = node.metric("tiered_cluster_forwarded_total")
            before = node.cpu()
            result = wrk(node.url, args, prefix)
            after = node.cpu()
            forwarded = {
                k: v - forwarded_before.get(k, 0.0)
                for k, v in node.metric("tiered_cluster_forwarded_total").items()
            }
        finally:
            node.stop()
    seconds = result["duration_us"] / 1e6
    ok = result["ok"]
    busy = {k: after[k] - before.get(k, 0.0) for k in after}
    net = {k: max(0.0, busy[k] - idle.get(k, 0.0) * seconds / args.duration) for k in busy}
    row: dict[str, Any] = {
        "label": label,
        "workers": workers,
        "shards": shards,
        "appends_per_s": ok / seconds,
        "p50_ms": result["latency_us"]["percentiles"]["50"] / 1000,
        "p99_ms": result["latency_us"]["percentiles"]["99"] / 1000,
        "non2xx": result["non2xx"],
        "cpu_s": busy,
        "idle_cpu_s_per_s": {k: v / args.duration for k, v in idle.items()},
        "cpu_us_per_append": {k: 1e6 * v / ok for k, v in net.items()},
        "cpu_us_per_append_total": 1e6 * sum(net.values()) / ok,
        "forwarded": forwarded,
        "forwarded_share": sum(forwarded.values()) / ok if ok else 0.0,
    }
    if forwarded and shards == 1:  # the non-owners own nothing: all their work is forwarding
        row["cpu_us_per_forward"] = {
            k: 1e6 * net[k] / n for k, n in forwarded.items() if n > ok * 0.2 and k in net
        }
    return row


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cmd", default=f"{sys.executable} -m tiered.cli serve")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--worker-shards", type=int, default=16)
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--duration", type=int, default=8)
    parser.add_argument("--rows", default="single,workers-spread,workers-one-shard,direct")
    parser.add_argument("--direct-repeat", type=int, default=3, help="alternations of the direct rows")
    parser.add_argument(
        "--direct-against",
        action="append",
        default=[],
        help="NAME=CMD: another build's serve command, measured in the same direct rounds (before/after)",
    )
    parser.add_argument(
        "--direct-rate", type=float, default=0.0, help="appends/s of the direct rows (0: as fast as answered)"
    )
    parser.add_argument("--json", help="write every figure here")
    args = parser.parse_args()
    plan = {
        "single": (1, args.worker_shards),
        "workers-spread": (args.workers, args.worker_shards),
        "workers-one-shard": (args.workers, 1),
    }
    rows: list[dict[str, Any]] = []
    for name in args.rows.split(","):
        rows += run_direct(args) if name == "direct" else [run_row(name, *plan[name], args)]
    print(
        f"{'row':<20} {'appends/s':>10} {'p50 ms':>7} {'p99 ms':>7} {'CPU us/append':>14} {'fwd %':>6}  per process"
    )
    for r in rows:
        per = " ".join(f"{k}={v:.0f}" for k, v in sorted(r["cpu_us_per_append"].items()))
        fwd = " ".join(f"{k}={v:.0f}us/fwd" for k, v in sorted(r.get("cpu_us_per_forward", {}).items()))
        if "overhead_vs_local" in r:
            fwd += f" overhead vs direct-local {100 * r['overhead_vs_local']:.0f}%"
        print(
            f"{r['label']:<20} {r['appends_per_s']:>10.0f} {r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} "
            f"{r['cpu_us_per_append_total']:>14.1f} {100 * r['forwarded_share']:>6.1f}  {per} {fwd}"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"args": vars(args), "load": os.getloadavg(), "rows": rows}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
