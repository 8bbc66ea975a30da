"""``tiered gc``: one GC pass for cron, Kubernetes CronJobs or scheduled tasks.

With ``--url`` it asks a running server to run a pass (admin API, bearer token
from ``TIERED_ADMIN_TOKEN`` or ``--admin-token-file``). Without it, it runs the
pass offline on a data dir that no server holds (it takes the data-dir lock,
and refuses with a clear message if a server has it). ``--dry-run`` lists what
would be deleted and why, and changes nothing. Exit codes: 0 done, 1 integrity
errors found, 2 refused or failed.
"""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, TextIO

from tiered.core.config import Config
from tiered.engine.datadir import DataDirLock, DataDirLocked
from tiered.engine.engine import Engine


def _steps_bar(out: TextIO, label: str, done: int, total: int) -> None:
    if out.isatty():
        width = 24
        filled = width * done // total
        out.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {label:<40}")
        out.flush()
        if done == total:
            out.write("\n")


async def _offline_pass(config: Config, dry_run: bool, out: TextIO) -> dict[str, Any]:
    lock = DataDirLock(config.data_path)
    lock.acquire(shared=dry_run)
    node = Engine(config)
    try:
        _steps_bar(out, "recovering metadata", 0, 3)
        await node.open_offline(dry_run=dry_run)
        _steps_bar(out, "running the GC pass", 1, 3)
        if not dry_run:
            # Offline there is no background flusher: finish interrupted copies first.
            await node.flusher.abort_interrupted_copies()
        report = await node.gc.run_pass(dry_run=dry_run)
        _steps_bar(out, "done", 3, 3)
        return report.to_json()
    finally:
        await node.stop()
        lock.release()


def _online_pass(url: str, token: str | None, dry_run: bool) -> dict[str, Any]:
    target = url.rstrip("/") + "/v1/admin/gc" + ("?dry_run=true" if dry_run else "")
    req = urllib.request.Request(target, method="POST", data=b"")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=600) as resp:
        report: dict[str, Any] = json.loads(resp.read())
        return report


def print_report(report: dict[str, Any], out: TextIO) -> None:
    rows = [
        ("streams expired", report["streams_expired"]),
        ("producer states expired", report.get("producer_states_expired", 0)),
        ("retention advanced (streams)", report["retention_advanced"]),
        ("stream bytes released", report["bytes_released"]),
        ("objects awaiting deletion", report["objects_released"]),
        ("objects deleted", report["objects_deleted"]),
        ("bytes deleted", report["bytes_deleted"]),
        ("orphans found", report["orphans_found"]),
        ("orphans deleted", report["orphans_deleted"]),
        ("hot segments deleted", report["segments_deleted"]),
        ("objects rewritten (erasure)", report.get("objects_rewritten", 0)),
        ("keyed streams compacted", report.get("streams_compacted", 0)),
        ("errors", len(report["errors"])),
        ("integrity errors", len(report["integrity_errors"])),
    ]
    width = max(len(name) for name, _ in rows)
    out.write("DRY RUN: nothing was changed\n" if report["dry_run"] else "")
    for name, value in rows:
        out.write(f"{name:<{width}}  {value:>12,}\n")
    for item in report["would_delete"]:
        out.write(f"would delete {item['key']} ({item['bytes']:,} bytes): {item['reason']}\n")
    for item in report.get("would_rewrite", []):
        out.write(f"would rewrite {item['key']} ({item['bytes']:,} bytes): {item['reason']}\n")
    for err in report["errors"]:
        out.write(f"error: {err}\n")
    for err in report["integrity_errors"]:
        out.write(f"INTEGRITY ERROR: {err}\n")


def _check_url(url: str) -> str | None:
    """Why ``url`` cannot be a server's base URL, or None."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"--url must be a server's base URL such as http://127.0.0.1:4437, got {url!r}"
    return None


def run_gc_command(config: Config, url: str | None, dry_run: bool) -> int:
    if url:
        problem = _check_url(url)
        if problem:
            print(f"tiered gc: {problem}", file=sys.stderr)
            return 2
    if not url and not config.data_path.is_dir():
        print(
            f"tiered gc: data dir {config.data_path} does not exist (or use --url for a running server)",
            file=sys.stderr,
        )
        return 2
    try:
        if url:
            report = _online_pass(url, config.admin_token(), dry_run)
        else:
            report = asyncio.run(_offline_pass(config, dry_run, sys.stderr))
    except DataDirLocked as exc:
        print(f"tiered gc: {exc}; use --url to ask the running server instead", file=sys.stderr)
        return 2
    except urllib.error.HTTPError as exc:
        print(
            f"tiered gc: the server refused: {exc.code} {exc.read().decode(errors='replace')}",
            file=sys.stderr,
        )
        return 2
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"tiered gc: {exc}", file=sys.stderr)
        return 2
    print_report(report, sys.stdout)
    return 1 if report["integrity_errors"] else 0
