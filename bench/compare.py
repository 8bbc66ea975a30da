#!/usr/bin/env python3
"""Side-by-side benchmark: reference server (file-backed) vs ``tiered serve``.

For every selected server, in order, this script

1. creates a fresh temporary data directory and picks a free 127.0.0.1 port,
2. starts the server in its own process group and waits until it answers HTTP,
3. runs the benchmark of ``bench/run.py`` against ``http://127.0.0.1:PORT/v1/stream``,
4. stops the server (SIGTERM to the group, SIGKILL after a grace period) and
   deletes the data directory — always, via ``try/finally``.

Servers (``--servers``, comma separated, default ``ref-file,tiered``):

* ``ref-file`` – the protocol's reference server (Node) with ``DATA_DIR`` set:
  file-backed, fsync on every append.  Started with
  ``--reference-script``, else ``$DS_REFERENCE_SCRIPT``, else
  ``../shared/conformance/reference.sh`` next to the repository checkout.
* ``tiered`` – ``tiered serve --host 127.0.0.1 --port P --data-dir D``
  (``--tiered-cmd``), default durability settings (fsync on).
* ``ref-mem`` – the reference server in memory (no ``DATA_DIR``); add it with
  ``--memory`` or list it in ``--servers``.
* ``tiered-auth`` – ``tiered`` with ``--auth tokens``: the benchmark issues a
  write token for the ``default`` bucket through the admin API and sends it on
  every request, so ``--servers tiered,tiered-auth`` shows what auth costs.

A server that cannot be started (command missing, exits early, never answers)
is reported as unavailable and the others still run.  With ``--repeat N``
every server is benchmarked N times (fresh process and data directory each
time, in rounds: ref-file, tiered, ref-mem, ref-file, ...) and the table shows
per-metric medians.  On a shared machine, ``--wait-idle S`` waits for the CPU
to be idle before each run and ``--max-foreign-cpu PCT`` reruns a run during
which other processes used more than PCT % of the CPU (measured from /proc).
The table ends with the ratios tiered / reference-file-backed and the targets
of the issue: appends/s >= 5x, p99 below the reference, catch-up reads >= 3x.

Example::

    python bench/compare.py --memory --json bench-results.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import secrets
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import (  # noqa: E402  (needs the sys.path entry above)
    BenchError,
    add_benchmark_args,
    config_from_args,
    cpu_busy_percent,
    format_table,
    run_benchmark,
)

# The protocol's reference server ships beside the checkout, not inside it.
REPO_RELATIVE_REFERENCE = "../shared/conformance/reference.sh"
DEFAULT_REFERENCE_SCRIPT = os.environ.get(
    "DS_REFERENCE_SCRIPT", str(Path(__file__).resolve().parent.parent / REPO_RELATIVE_REFERENCE)
)
SERVER_LABELS = {
    "ref-file": "reference (file)",
    "tiered": "tiered (fsync)",
    "ref-mem": "reference (memory)",
    "tiered-aiohttp": "tiered on aiohttp (fsync)",
    "tiered-auth": "tiered, token auth (fsync)",
    "null-granian": "do-nothing (granian)",
    "null-aiohttp": "do-nothing (aiohttp)",
}
#: Servers that only answer appends: the read phases are skipped for them.
APPEND_ONLY = ("null-granian", "null-aiohttp")
NULL_SERVER = str(Path(__file__).resolve().parent / "null_server.py")


class ServerUnavailable(RuntimeError):
    """The server could not be started or never became ready."""


@dataclass
class ServerSpec:
    """How to start one server under test."""

    key: str
    label: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    unset_env: tuple[str, ...] = ()


# --------------------------------------------------------------------------- process handling


def free_port() -> int:
    """A currently unused TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def filesystem_of(path: str) -> str:
    """``fstype device mountpoint`` of the mount holding ``path`` (best effort)."""
    best = ("", "?", "?")
    real = os.path.realpath(path)
    try:
        with open("/proc/mounts") as fh:
            for line in fh:
                dev, mnt, fstype, *_ = line.split()
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[0]):
                    best = (mnt, fstype, dev)
    except OSError:
        return "unknown"
    return f"{best[1]} {best[2]} {best[0]}"


def _machine_busy_jiffies() -> int | None:
    try:
        with open("/proc/stat") as fh:
            f = [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(f) - f[3] - (f[4] if len(f) > 4 else 0)


def _group_jiffies(pgid: int) -> int:
    """utime+stime of every live process in process group ``pgid``."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                rest = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(rest) > 12 and int(rest[2]) == pgid:
            total += int(rest[11]) + int(rest[12])
    return total


class ForeignCpuMeter:
    """Estimates CPU used by processes that are *not* part of the benchmark during a run.

    foreign = machine busy time - (this process + its reaped children, e.g. wrk)
    - (the server's process group).  Linux only; ``percent()`` returns ``None``
    elsewhere.  A high value means other work on the machine disturbed the run.
    """

    def __init__(self, server_pgid: int) -> None:
        self.pgid = server_pgid
        self.hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.start = self._snapshot()

    def _snapshot(self) -> tuple[float, float, float, float] | None:
        busy = _machine_busy_jiffies()
        if busy is None:
            return None
        me = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        ours = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
        return busy / self.hz, ours, _group_jiffies(self.pgid) / self.hz, time.monotonic()

    def percent(self) -> float | None:
        """Foreign CPU since construction, as % of the machine's total capacity."""
        end = self._snapshot()
        if self.start is None or end is None:
            return None
        wall = end[3] - self.start[3]
        foreign = (end[0] - self.start[0]) - (end[1] - self.start[1]) - (end[2] - self.start[2])
        cpus = os.cpu_count() or 1
        return max(0.0, 100.0 * foreign / (wall * cpus)) if wall > 0 else None


def tail(path: Path, lines: int = 20) -> str:
    """Last ``lines`` lines of a log file (empty string if unreadable)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def stop_process_group(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """SIGTERM the process group of ``proc``; SIGKILL it if still alive after ``grace_s``."""
    if proc.poll() is not None:
        # The leader exited; children may still hold the group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def wait_ready(proc: subprocess.Popen[bytes], base_url: str, log_path: Path, timeout_s: float) -> float:
    """Poll until the server answers any HTTP response on ``base_url``; returns seconds waited.

    Raises :class:`ServerUnavailable` if the process exits or ``timeout_s`` passes.
    """
    probe = f"{base_url}/__bench_probe__?offset=-1"
    start = time.monotonic()
    deadline = start + timeout_s
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            raise ServerUnavailable(
                f"exited with code {code} before becoming ready; log tail:\n{tail(log_path)}"
            )
        try:
            with urllib.request.urlopen(probe, timeout=1.0) as resp:
                resp.read()
            return time.monotonic() - start
        except urllib.error.HTTPError:
            return time.monotonic() - start  # any HTTP status means it is serving
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            time.sleep(0.1)
    raise ServerUnavailable(f"did not answer HTTP within {timeout_s:.0f}s; log tail:\n{tail(log_path)}")


@contextlib.contextmanager
def running_server(
    spec: ServerSpec, path: str, startup_timeout: float, keep_data: bool
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Start ``spec`` on a free port with a fresh data dir; yield ``(base_url, info)``; always clean up."""
    workdir = Path(tempfile.mkdtemp(prefix=f"tiered-bench-{spec.key}-"))
    data_dir = workdir / "data"
    data_dir.mkdir()
    log_path = workdir / "server.log"
    port = free_port()
    argv = [a.format(port=port, data_dir=str(data_dir)) for a in spec.argv]
    env = {k: v for k, v in os.environ.items() if k not in spec.unset_env}
    env.update({k: v.format(port=port, data_dir=str(data_dir)) for k, v in spec.env.items()})
    base_url = f"http://127.0.0.1:{port}{path}"
    info: dict[str, Any] = {
        "argv": argv,
        "env": {k: ("<redacted>" if "TOKEN" in k else env[k]) for k in spec.env},
        "port": port,
        "data_dir": str(data_dir),
        "data_dir_fs": filesystem_of(str(data_dir)),
        "log": str(log_path),
    }
    proc: subprocess.Popen[bytes] | None = None
    log_fh = open(log_path, "wb")  # noqa: SIM115  (closed in finally)
    try:
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_fh,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # own process group: killpg reaches node/python children
            )
        except OSError as exc:
            raise ServerUnavailable(f"cannot start {argv[0]!r}: {exc}") from exc
        info["pid"] = proc.pid
        info["startup_s"] = wait_ready(proc, base_url, log_path, startup_timeout)
        yield base_url, info
        if proc.poll() is not None:
            info["exited_during_run"] = proc.returncode
            print(
                f"[compare] warning: {spec.label} exited with code {proc.returncode} during the run; "
                f"log tail:\n{tail(log_path)}",
                file=sys.stderr,
            )
    finally:
        if proc is not None:
            stop_process_group(proc)
        log_fh.close()
        if keep_data:
            print(f"[compare] kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


# --------------------------------------------------------------------------- aggregation


def median_result(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-leaf median of numeric values across runs (other values from the first run)."""

    def merge(values: list[Any]) -> Any:
        first = values[0]
        if isinstance(first, dict):
            keys = [k for k in first if all(isinstance(v, dict) and k in v for v in values)]
            return {k: merge([v[k] for v in values]) for k in keys}
        if isinstance(first, bool):
            return all(values)
        if isinstance(first, (int, float)) and all(isinstance(v, (int, float)) for v in values):
            return statistics.median(values)
        return first

    return merge(runs) if runs else {}


def _get(res: dict[str, Any] | None, *path: str) -> float | None:
    cur: Any = res
    for p in path:
        if not isinstance(cur, dict) or p not in cur:
            return None
        cur = cur[p]
    return float(cur) if isinstance(cur, (int, float)) else None


RATIO_FOOTNOTE = (
    "(*) reads the streams each server appended in phase 1, so a faster appender is read back with "
    "fewer, larger responses;\n    the small-record row reads identical data on every server."
)


def ratio_rows(tiered: dict[str, Any] | None, ref: dict[str, Any] | None) -> list[tuple[str, str, str, str]]:
    """``(metric, ratio, target, verdict)`` rows for tiered / reference-file."""
    checks: list[tuple[str, tuple[str, ...], str, Callable[[float], bool] | None]] = [
        ("appends/s", ("append", "appends_per_s"), ">= 5.0x", lambda r: r >= 5.0),
        ("append p99", ("append", "latency_ms", "p99"), "< 1.0x", lambda r: r < 1.0),
        ("catch-up after append MB/s (*)", ("catchup", "mb_per_s"), ">= 3.0x", lambda r: r >= 3.0),
        ("small-record reads MB/s", ("read_small", "mb_per_s"), ">= 3.0x", lambda r: r >= 3.0),
        ("large-record reads MB/s", ("read_large", "mb_per_s"), "info", None),
    ]
    rows = []
    for label, path, target, ok in checks:
        t, r = _get(tiered, *path), _get(ref, *path)
        if t is None or r is None or r == 0:
            rows.append((label, "-", target, "n/a"))
        else:
            x = t / r
            verdict = "" if ok is None else ("PASS" if ok(x) else "FAIL")
            rows.append((label, f"{x:.2f}x", target, verdict))
    return rows


def other_ratio_rows(results: dict[str, dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    """tiered's appends/s over the other servers of the run, with the issue's targets."""
    tiered = results.get("tiered", {}).get("median")
    checks: list[tuple[str, str, str, Callable[[float], bool]]] = [
        ("ref-mem", "reference in memory (moonshot)", ">= 1.0x", lambda r: r >= 1.0),
        ("null-granian", "do-nothing handler, same stack", ">= 0.7x", lambda r: r >= 0.7),
        ("tiered-aiohttp", "tiered on aiohttp", ">= 1.5x", lambda r: r >= 1.5),
        # Auth must cost under 10%: tiered without it over tiered with it, at most 1/0.9.
        ("tiered-auth", "tiered with token auth (auth's cost)", "<= 1.11x", lambda r: r <= 1 / 0.9),
    ]
    rows = []
    for key, label, target, ok in checks:
        other = results.get(key, {}).get("median")
        t, o = _get(tiered, "append", "appends_per_s"), _get(other, "append", "appends_per_s")
        if t is not None and o:
            rows.append((label, f"{t / o:.2f}x", target, "PASS" if ok(t / o) else "FAIL"))
    t = _get(tiered, "append", "appends_per_s")
    for key in results:
        if key.startswith("tiered@"):
            o = _get(results[key].get("median"), "append", "appends_per_s")
            if t is not None and o:
                rows.append((f"tiered {key.removeprefix('tiered@')} (same run)", f"{t / o:.2f}x", "info", ""))
    if "null-granian" in results and "null-aiohttp" in results:
        g = _get(results["null-granian"].get("median"), "append", "appends_per_s")
        a = _get(results["null-aiohttp"].get("median"), "append", "appends_per_s")
        if g is not None and a:
            rows.append(("(do-nothing granian / do-nothing aiohttp)", f"{g / a:.2f}x", "info", ""))
    return rows


def format_ratios(rows: list[tuple[str, str, str, str]], header: str = "tiered / reference (file)") -> str:
    """Render the ratio rows as a small table."""
    header_row = (header, "ratio", "target", "")
    all_rows = [header_row, *rows]
    widths = [max(len(r[i]) for r in all_rows) for i in range(4)]
    lines = []
    for i, r in enumerate(all_rows):
        lines.append(
            "  ".join([r[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True))])
        )
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


# --------------------------------------------------------------------------- CLI


def build_specs(args: argparse.Namespace) -> dict[str, ServerSpec]:
    """Server specs for every known key."""
    script = args.reference_script
    tiered_argv = [
        *shlex.split(args.tiered_cmd),
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
        "--data-dir",
        "{data_dir}",
        *shlex.split(args.tiered_args),
    ]
    return {
        "tiered-aiohttp": ServerSpec(
            "tiered-aiohttp", SERVER_LABELS["tiered-aiohttp"], [*tiered_argv, "--http-server", "aiohttp"]
        ),
        "null-granian": ServerSpec(
            "null-granian",
            SERVER_LABELS["null-granian"],
            [sys.executable, NULL_SERVER, "--stack", "granian", "--port", "{port}"],
        ),
        "null-aiohttp": ServerSpec(
            "null-aiohttp",
            SERVER_LABELS["null-aiohttp"],
            [sys.executable, NULL_SERVER, "--stack", "aiohttp", "--port", "{port}"],
        ),
        "ref-file": ServerSpec(
            "ref-file",
            SERVER_LABELS["ref-file"],
            ["bash", script],
            env={"PORT": "{port}", "DATA_DIR": "{data_dir}"},
        ),
        "ref-mem": ServerSpec(
            "ref-mem",
            SERVER_LABELS["ref-mem"],
            ["bash", script],
            env={"PORT": "{port}"},
            unset_env=("DATA_DIR",),
        ),
        "tiered": ServerSpec("tiered", SERVER_LABELS["tiered"], tiered_argv),
        "tiered-auth": ServerSpec(
            "tiered-auth",
            SERVER_LABELS["tiered-auth"],
            [*tiered_argv, "--auth", "tokens"],
            env={"TIERED_ADMIN_TOKEN": BENCH_ADMIN_TOKEN},
        ),
        **{
            key: ServerSpec(
                key,
                f"tiered {key.removeprefix('tiered@')}",
                [
                    *shlex.split(cmd),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    "{port}",
                    "--data-dir",
                    "{data_dir}",
                    *shlex.split(args.tiered_args),
                ],
            )
            for key, cmd in _other_tiereds(args).items()
        },
    }


def add_other_tiered_argument(parser: argparse.ArgumentParser) -> None:
    """``--other-tiered LABEL=CMD``: what ``_other_tiereds`` reads (every script that uses this server table)."""
    parser.add_argument(
        "--other-tiered",
        action="append",
        default=[],
        metavar="LABEL=CMD",
        help="another tiered build to run in the same rounds as server key tiered@LABEL (e.g. "
        'old="env PYTHONPATH=/tmp/old python3 -m tiered.cli serve"); repeatable',
    )


def _other_tiereds(args: argparse.Namespace) -> dict[str, str]:
    """``--other-tiered LABEL=CMD`` servers, keyed ``tiered@LABEL`` (another build to compare with)."""
    out = {}
    for spec in args.other_tiered:
        label, sep, cmd = spec.partition("=")
        if not sep or not label or not cmd:
            raise SystemExit(f"--other-tiered wants LABEL=CMD, got {spec!r}")
        out[f"tiered@{label}"] = cmd
    return out


BENCH_ADMIN_TOKEN = secrets.token_urlsafe(24)  # this run's only: the bench issues its write token with it


def issue_bench_token(url: str, path: str) -> str:
    """A write token for the ``default`` bucket (the one ``/v1/stream`` addresses), as a header value."""
    base = url[: -len(path)] if path and url.endswith(path) else url
    req = urllib.request.Request(
        base + "/v1/admin/tokens",
        data=json.dumps({"bucket": "default", "scope": "write", "name": "bench"}).encode(),
        headers={"Authorization": f"Bearer {BENCH_ADMIN_TOKEN}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return "Bearer " + json.loads(resp.read())["token"]


def wait_for_idle(max_wait_s: float, busy_threshold: float = 15.0) -> float | None:
    """Wait (at most ``max_wait_s``) until machine-wide CPU use over 1 s is below ``busy_threshold`` %.

    Returns the last busy % seen (``None`` if it cannot be measured).
    """
    deadline = time.monotonic() + max_wait_s
    busy = cpu_busy_percent(1.0)
    while busy is not None and busy >= busy_threshold and time.monotonic() < deadline:
        busy = cpu_busy_percent(1.0)
    if busy is not None and busy >= busy_threshold:
        print(
            f"[compare] machine still {busy:.0f}% busy after waiting {max_wait_s:.0f}s; running anyway",
            file=sys.stderr,
        )
    return busy


def run_one(
    spec: ServerSpec, args: argparse.Namespace, parser: argparse.ArgumentParser, rnd: int, attempt: int
) -> dict[str, Any]:
    """Start ``spec`` fresh, benchmark it once, stop it; returns run.py's result plus server facts."""
    busy_before = wait_for_idle(args.wait_idle) if args.wait_idle > 0 else cpu_busy_percent(1.0)
    print(
        f"[compare] {spec.label}: run {rnd + 1}/{args.repeat} (attempt {attempt}): starting {' '.join(spec.argv)}",
        file=sys.stderr,
    )
    with running_server(spec, args.path, args.startup_timeout, args.keep_data) as (url, info):
        print(f"[compare] {spec.label}: ready at {url} after {info['startup_s']:.1f}s", file=sys.stderr)
        cfg = config_from_args(args, url=url)
        cfg.measure_busy = False
        if spec.key == "tiered-auth":
            cfg.authorization = issue_bench_token(url, args.path)
        if spec.key in APPEND_ONLY:
            cfg.skip_catchup = cfg.skip_read = True
        try:
            cfg.validate()
        except ValueError as exc:
            parser.error(str(exc))
        meter = ForeignCpuMeter(info["pid"])
        res = run_benchmark(cfg)
        res["server"] = info
        res["foreign_cpu_pct"] = meter.percent()
        res["environment"]["cpu_busy_before_pct"] = busy_before
        return res


def _raise_on_signal(signum: int, _frame: Any) -> None:
    # KeyboardInterrupt is what asyncio.run() cancels cleanly on; it unwinds
    # through the finally blocks that stop the servers.
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the process exit code (130 when interrupted)."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("\n[compare] interrupted; servers stopped", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(
        description="Start the reference server and `tiered serve` one after the other on free 127.0.0.1 "
        "ports with temporary data dirs, run bench/run.py's benchmark against each, print a side-by-side "
        "table with tiered/reference ratios.",
        epilog="Example: python bench/compare.py --memory --repeat 3 --json bench-results.json",
    )
    add_benchmark_args(parser, require_url=False)
    parser.add_argument(
        "--servers",
        default="ref-file,tiered",
        help="comma-separated servers in run order: ref-file, tiered, ref-mem, tiered-aiohttp, tiered-auth, "
        "null-granian, null-aiohttp (default ref-file,tiered)",
    )
    parser.add_argument("--memory", action="store_true", help="also run the in-memory reference (ref-mem)")
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per server, fresh server each; medians shown"
    )
    parser.add_argument(
        "--path", default="/v1/stream", help="stream URL path prefix on every server (default /v1/stream)"
    )
    parser.add_argument(
        "--reference-script",
        default=DEFAULT_REFERENCE_SCRIPT,
        help=f"reference server launcher (env DS_REFERENCE_SCRIPT, else {REPO_RELATIVE_REFERENCE} relative to the repository)",
    )
    parser.add_argument(
        "--tiered-cmd", default="tiered serve", help="command that starts tiered (default 'tiered serve')"
    )
    parser.add_argument("--tiered-args", default="", help="extra arguments appended to the tiered command")
    add_other_tiered_argument(parser)
    parser.add_argument(
        "--startup-timeout", type=float, default=120.0, help="seconds to wait for a server (default 120)"
    )
    parser.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="S",
        help="before each run, wait up to S seconds for the machine to be <15%% busy (shared machines)",
    )
    parser.add_argument(
        "--max-foreign-cpu",
        type=float,
        default=None,
        metavar="PCT",
        help="rerun (up to --max-attempts) a run during which other processes used more than PCT%% "
        "of the machine's CPU; the least disturbed attempt is kept, the others are in the JSON as discarded_runs",
    )
    parser.add_argument(
        "--max-attempts", type=int, default=3, help="attempts per run with --max-foreign-cpu (default 3)"
    )
    parser.add_argument("--keep-data", action="store_true", help="keep the temp data dirs and server logs")
    parser.add_argument("--json", metavar="PATH", help="write all results (every run + medians) as JSON")
    args = parser.parse_args(argv)

    keys = [k.strip() for k in args.servers.split(",") if k.strip()]
    if args.memory and "ref-mem" not in keys:
        keys.append("ref-mem")
    for key in _other_tiereds(args):
        SERVER_LABELS.setdefault(key, f"tiered {key.removeprefix('tiered@')}")
    unknown = [k for k in keys if k not in SERVER_LABELS]
    if unknown:
        parser.error(f"unknown server(s) {unknown}; choose from {sorted(SERVER_LABELS)}")
    if not 1 <= args.repeat <= 20:
        parser.error("--repeat must be between 1 and 20")
    if not 1 <= args.max_attempts <= 10:
        parser.error("--max-attempts must be between 1 and 10")
    if ("ref-file" in keys or "ref-mem" in keys) and not Path(args.reference_script).is_file():
        print(f"[compare] warning: reference script {args.reference_script} not found", file=sys.stderr)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_on_signal)

    specs = build_specs(args)
    results: dict[str, dict[str, Any]] = {
        k: {"label": specs[k].label, "runs": [], "discarded_runs": [], "errors": []} for k in keys
    }
    unavailable: set[str] = set()
    # Rounds: ref-file, tiered, ref-mem, then again; interleaving spreads slow
    # drifts in machine load evenly over the servers.
    for rnd in range(args.repeat):
        for key in keys:
            if key in unavailable:
                continue
            spec, entry = specs[key], results[key]
            attempts: list[dict[str, Any]] = []
            for attempt in range(1, args.max_attempts + 1):
                try:
                    res = run_one(spec, args, parser, rnd, attempt)
                except ServerUnavailable as exc:
                    msg = f"{spec.label} not available: {exc}"
                    if key == "tiered":
                        msg += (
                            f"\n  (is `{args.tiered_cmd}` implemented and installed? try `pip install -e .`, "
                            "or point --tiered-cmd at it)"
                        )
                    print(f"[compare] {msg}", file=sys.stderr)
                    entry["errors"].append(str(exc))
                    unavailable.add(key)  # do not retry a server that cannot start
                    break
                except (BenchError, TimeoutError) as exc:
                    text = f"benchmark failed: {exc or type(exc).__name__}"
                    print(f"[compare] {spec.label}: {text}", file=sys.stderr)
                    entry["errors"].append(text)
                    break
                attempts.append(res)
                foreign = res.get("foreign_cpu_pct")
                if args.max_foreign_cpu is None or foreign is None or foreign <= args.max_foreign_cpu:
                    break
                print(
                    f"[compare] {spec.label}: other processes used {foreign:.0f}% CPU during the run "
                    f"(> {args.max_foreign_cpu:.0f}%); attempt {attempt}/{args.max_attempts}",
                    file=sys.stderr,
                )
            if attempts:
                best = min(attempts, key=lambda r: r.get("foreign_cpu_pct") or 0.0)
                entry["runs"].append(best)
                entry["discarded_runs"].extend(r for r in attempts if r is not best)
    for entry in results.values():
        entry["median"] = median_result(entry["runs"]) if entry["runs"] else None

    columns = {results[k]["label"]: results[k]["median"] for k in keys}
    status_cells = []
    for k in keys:
        e = results[k]
        status_cells.append(
            f"{len(e['runs'])}/{args.repeat} ok"
            if e["runs"]
            else ("UNAVAILABLE" if k in unavailable else "FAILED")
        )
    print()
    per_run = [
        " ".join(f"{r['append']['appends_per_s']:.0f}" for r in results[k]["runs"]) or "-" for k in keys
    ]
    p99_runs = [
        " ".join(f"{r['append']['latency_ms']['p99']:.0f}" for r in results[k]["runs"]) or "-" for k in keys
    ]
    foreign = [
        " ".join(
            f"{r['foreign_cpu_pct']:.0f}" for r in results[k]["runs"] if r.get("foreign_cpu_pct") is not None
        )
        or "-"
        for k in keys
    ]
    extra = {"runs (median shown)": status_cells, "other processes' CPU % (per run)": foreign}
    if args.repeat > 1:
        extra["appends/s, every run"] = per_run
        extra["append p99 (ms), every run"] = p99_runs
    print(format_table(columns, extra_rows=extra))
    ratios = None
    if "tiered" in results and "ref-file" in results:
        ratios = ratio_rows(results["tiered"]["median"], results["ref-file"]["median"])
        print()
        print(format_ratios(ratios))
        print(RATIO_FOOTNOTE)
    others = other_ratio_rows(results)
    if others:
        print()
        print(format_ratios(others, header="tiered's appends/s over"))
    for k in keys:
        if results[k]["errors"]:
            print(f"\n{results[k]['label']}: " + results[k]["errors"][0].splitlines()[0])

    if args.json:
        out = {
            "servers": results,
            "ratios_tiered_over_ref_file": [
                {"metric": m, "ratio": r, "target": t, "verdict": v} for m, r, t, v in (ratios or [])
            ],
            "appends_ratios_tiered_over_others": [
                {"metric": m, "ratio": r, "target": t, "verdict": v} for m, r, t, v in others
            ],
        }
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
        print(f"\n[compare] wrote {args.json}", file=sys.stderr)
    return 0 if all(results[k]["runs"] for k in keys if k != "tiered") else 1


if __name__ == "__main__":
    sys.exit(main())
