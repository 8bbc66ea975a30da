"""``tiered gc`` (and ``tiered verify``) as an operator runs them: real subprocesses.

* online: ``--url`` with the admin token from ``TIERED_ADMIN_TOKEN``; without it the server
  refuses and the command exits 2;
* offline, on a stopped data dir; refused with exit 2 and a clear message while a server
  holds the data dir;
* ``--dry-run`` lists what would be deleted and why, and changes nothing;
* exit 1 on integrity errors: an object file deleted behind the metadata's back is reported
  by reconciliation (offline and online) and by ``tiered verify``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.deadlines import scaled
from tests.support.gc_support import journal_records, object_files
from tests.support.http_helpers import request
from tests.support.server_process import ServerProcess
from tiered.cli.verify import load_state_read_only
from tiered.core.config import Config

pytestmark = pytest.mark.timeout(120)

TOKEN = "cli-admin-token"
OCTET = {"Content-Type": "application/octet-stream"}


def tiered(*args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERED_")}
    if token is not None:
        env["TIERED_ADMIN_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "tiered.cli", *args], capture_output=True, text=True, timeout=60, env=env
    )


def report_rows(stdout: str) -> dict[str, int]:
    rows = {}
    for line in stdout.splitlines():
        name, _, value = line.rpartition("  ")
        if name.strip() and value.strip().replace(",", "").isdigit():
            rows[name.strip()] = int(value.strip().replace(",", ""))
    return rows


def metric(srv: ServerProcess, name: str) -> float:
    token = srv.env.get("TIERED_ADMIN_TOKEN")
    auth = {"Authorization": f"Bearer {token}"} if token else None
    for line in request("GET", srv.url + "/metrics", auth)[2].decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(name)


def wait_for(cond: Any, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + scaled(timeout)
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def start_server(data: Path, token: str | None = None) -> ServerProcess:
    env = {"TIERED_ADMIN_TOKEN": token or ""}  # "" = no token, whatever the outer environment says
    return ServerProcess(
        data,
        "--flush-interval-s",
        "0.1",
        "--hot-retention-s",
        "0",
        "--gc-grace-s",
        "0",
        "--gc-interval-s",
        "3600",
        "--long-poll-timeout-s",
        "2",
        env=env,
    ).start()


def populate(srv: ServerProcess) -> None:
    """Bucket 'doomed' (its own object, soon erased) and a default-bucket stream (its own object)."""
    assert request("PUT", srv.url + "/v1/buckets/doomed")[0] == 201
    assert request("PUT", srv.url + "/v1/buckets/doomed/stream/s", OCTET, b"d" * 5000)[0] == 201
    wait_for(
        lambda: metric(srv, "tiered_cold_objects") == 1 and metric(srv, "tiered_hot_bytes") == 0, "a flush"
    )
    assert request("PUT", srv.url + "/v1/stream/kept", OCTET, b"k" * 3000)[0] == 201
    wait_for(
        lambda: metric(srv, "tiered_cold_objects") == 2 and metric(srv, "tiered_hot_bytes") == 0, "a flush"
    )


def logical_state(data: Path) -> dict[str, Any]:
    state = load_state_read_only(Config(data_dir=str(data)))
    return {
        "streams": sorted(
            (s.bucket, s.path, s.tail, s.retained_from, tuple(r.key for r in s.cold_refs))
            for s in state.streams.values()
        ),
        "objects": sorted((k, o.refs, o.deleting, o.released_ms) for k, o in state.cold_objects.items()),
        "erased": sorted(state.erased_buckets),
        "in_flight": sorted(state.copies_in_flight),
    }


def gc_records(data: Path) -> list[Any]:
    return [r for r in journal_records(data) if type(r).__name__.startswith("ColdDelete")]


def test_online_gc_with_token_dry_run_and_refusal(tmp_path: Path) -> None:
    data = tmp_path / "data"
    srv = start_server(data, TOKEN)
    try:
        populate(srv)
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert request("DELETE", srv.url + "/v1/buckets/doomed", auth)[0] == 204
        doomed_key = min(object_files(data))  # written first: keys sort by creation time

        # No token: the server refuses, the command says so and exits 2; nothing ran.
        done = tiered("gc", "--url", srv.url)
        assert done.returncode == 2, done
        assert "the server refused: 401" in done.stderr and "Bearer" in done.stderr
        done = tiered("gc", "--url", srv.url, token="wrong-token")
        assert done.returncode == 2 and "the server refused: 401" in done.stderr
        assert "the admin token is not valid" in done.stderr

        # Dry run: lists the object and why; changes nothing.
        done = tiered("gc", "--url", srv.url, "--dry-run", token=TOKEN)
        assert done.returncode == 0, done
        assert done.stdout.startswith("DRY RUN: nothing was changed\n")
        assert f"would delete {doomed_key} (" in done.stdout
        assert "bytes): no owner left; grace delay passed" in done.stdout
        assert report_rows(done.stdout)["objects deleted"] == 0
        assert len(object_files(data)) == 2
        status = json.loads(request("GET", srv.url + "/v1/admin/gc", auth)[2])
        assert status["last_pass"] is None and status["pending_deletions"] == 1

        done = tiered("gc", "--url", srv.url, token=TOKEN)
        assert done.returncode == 0, done
        rows = report_rows(done.stdout)
        assert rows["objects deleted"] == 1 and rows["bytes deleted"] > 0
        assert rows["errors"] == 0 and rows["integrity errors"] == 0
        assert "DRY RUN" not in done.stdout and "would delete" not in done.stdout
        assert doomed_key not in object_files(data) and len(object_files(data)) == 1
        assert request("GET", srv.url + "/v1/stream/kept?offset=-1")[2] == b"k" * 3000
        srv_url = srv.url
    finally:
        srv.stop()
    # An unreachable server: exit 2 with the reason.
    done = tiered("gc", "--url", srv_url, token=TOKEN)
    assert done.returncode == 2 and done.stderr.startswith("tiered gc: ")


def test_offline_gc_dry_run_changes_nothing_then_deletes(tmp_path: Path) -> None:
    data = tmp_path / "data"
    srv = start_server(data)
    try:
        populate(srv)
        kept_key = max(object_files(data))
        assert request("DELETE", srv.url + "/v1/buckets/doomed")[0] == 204

        # Refused while a server holds the data dir.
        done = tiered("gc", "--data-dir", str(data), "--gc-grace-s", "0")
        assert done.returncode == 2, done
        assert "is in use by another tiered process" in done.stderr
        assert "use --url to ask the running server instead" in done.stderr
        done = tiered("gc", "--data-dir", str(data), "--dry-run")
        assert done.returncode == 2 and "in use by another tiered process" in done.stderr
    finally:
        srv.stop()
    [doomed_key] = object_files(data) - {kept_key}

    before_state, before_files, before_journal = (
        logical_state(data),
        object_files(data),
        journal_records(data),
    )
    done = tiered("gc", "--data-dir", str(data), "--gc-grace-s", "0", "--dry-run")
    assert done.returncode == 0, done
    assert done.stdout.startswith("DRY RUN: nothing was changed\n")
    assert (
        f"would delete {doomed_key} (" in done.stdout and "no owner left; grace delay passed" in done.stdout
    )
    assert kept_key not in done.stdout
    assert logical_state(data) == before_state and object_files(data) == before_files
    assert journal_records(data) == before_journal  # not one record written

    # A stray object nobody committed shows up as an orphan (dry run), and is deleted (real run).
    stray = data / "cold" / "data" / "01ARZ3NDEKTSV4RRFFQ69G5FAV.parquet"  # a ULID from 2016
    stray.write_bytes(b"not committed")
    done = tiered("gc", "--data-dir", str(data), "--gc-grace-s", "0", "--dry-run")
    assert done.returncode == 0 and "orphan: no metadata references it" in done.stdout
    assert stray.exists()

    done = tiered("gc", "--data-dir", str(data), "--gc-grace-s", "0")
    assert done.returncode == 0, done
    rows = report_rows(done.stdout)
    assert (rows["objects deleted"], rows["orphans found"], rows["orphans deleted"]) == (1, 1, 1)
    assert rows["integrity errors"] == 0 and rows["errors"] == 0
    assert object_files(data) == {kept_key} and not stray.exists()
    started = [r for r in gc_records(data) if type(r).__name__ == "ColdDeleteStarted"]
    assert sorted((r.keys, r.orphan) for r in started) == sorted(
        [((doomed_key,), False), (("data/01ARZ3NDEKTSV4RRFFQ69G5FAV.parquet",), True)]
    )

    # Idempotent, and the data dir still serves.
    done = tiered("gc", "--data-dir", str(data), "--gc-grace-s", "0")
    assert done.returncode == 0 and report_rows(done.stdout)["objects deleted"] == 0
    srv = start_server(data)
    try:
        assert request("GET", srv.url + "/v1/stream/kept?offset=-1")[2] == b"k" * 3000
        assert request("PUT", srv.url + "/v1/buckets/doomed")[0] == 409
    finally:
        srv.stop()


def test_missing_object_is_an_integrity_error_exit_1(tmp_path: Path) -> None:
    data = tmp_path / "data"
    srv = start_server(data, TOKEN)
    try:
        populate(srv)
        victim = min(object_files(data))  # the 'doomed' bucket's object, still referenced
        (data / "cold" / victim).unlink()  # behind the metadata's back
        done = tiered("gc", "--url", srv.url, token=TOKEN)
        assert done.returncode == 1, done
        assert (
            f"INTEGRITY ERROR: {victim}: referenced by metadata but missing from the object store"
            in done.stdout
        )
        assert report_rows(done.stdout)["integrity errors"] == 1
        assert metric(srv, "tiered_gc_integrity_errors") == 1
    finally:
        srv.stop()

    done = tiered("gc", "--data-dir", str(data))
    assert done.returncode == 1, done
    assert (
        f"INTEGRITY ERROR: {victim}: referenced by metadata but missing from the object store" in done.stdout
    )
    rows = report_rows(done.stdout)
    assert rows["integrity errors"] == 1 and rows["objects deleted"] == 0
    done = tiered("gc", "--data-dir", str(data), "--dry-run")
    assert done.returncode == 1 and "INTEGRITY ERROR" in done.stdout
    # Never dropped from the metadata silently.
    assert victim in {k for k, *_ in logical_state(data)["objects"]}

    done = tiered("verify", "--data-dir", str(data))
    assert done.returncode == 1, done
    assert f"{victim}: missing from the object store (metadata references it)" in done.stdout


def test_stop_is_prompt_with_a_subscription_wakeup_pending(tmp_path: Path) -> None:
    """A subscription-relevant commit right before a stop: every job ends, the journal closes with a snapshot."""
    import asyncio

    from tests.support.gc_support import make_config
    from tiered.engine.engine import Engine

    config = make_config(tmp_path / "data")

    async def body() -> list[str]:
        node = Engine(config)
        await node.start()
        jobs = node.supervisor.names
        await asyncio.sleep(0.05)
        listener = node.subscriptions.subs.listener
        assert listener is not None
        listener()  # what a subscription-relevant commit does right before a stop
        started = time.monotonic()
        await asyncio.wait_for(node.stop(), 3)
        assert time.monotonic() - started < 2
        assert node.supervisor.names == []
        return jobs

    jobs = asyncio.run(body())
    assert {"cold-flusher", "gc", "snapshots", "group-sweeper", "subscriptions-scheduler"} <= set(jobs)
    assert list((config.data_path / "snapshots").glob("snapshot-*.bin")), "a clean stop writes a snapshot"


def file_hashes(root: Path) -> dict[str, str]:
    """Every file and directory under ``root``: path -> sha256 (directories: 'dir')."""
    import hashlib

    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        out[rel] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return out


GC_RECORD_KINDS = {
    "StreamExpired",
    "RetentionAdvanced",
    "HotTrimmed",
    "ColdDeleteStarted",
    "ColdDeleteFinished",
    "ColdCopyAborted",
}


def test_offline_commands_with_subscriptions_groups_and_pending_wakes(tmp_path: Path) -> None:
    """A dry run (and verify) leaves every file byte-identical; a real offline pass appends GC records only."""
    data = tmp_path / "data"
    ct = {"Content-Type": "application/json"}
    srv = ServerProcess(
        data,
        "--flush-interval-s",
        "0.1",
        "--hot-retention-s",
        "0",
        "--gc-grace-s",
        "0",
        "--gc-interval-s",
        "3600",
        "--long-poll-timeout-s",
        "2",
        "--webhook-allow-loopback",
        "true",
        env={"TIERED_ADMIN_TOKEN": ""},
    ).start()
    try:
        populate(srv)
        assert request("DELETE", srv.url + "/v1/buckets/doomed")[0] == 204  # an object to delete
        assert request("PUT", srv.url + "/v1/stream/wakes", ct)[0] == 201
        for sub, body in {
            "pull": {"type": "pull-wake", "pattern": "jobs/*", "wake_stream": "wakes"},
            # Nothing listens on port 9: the wake stays outstanding, with retries scheduled.
            "hook": {"type": "webhook", "pattern": "hooks/*", "webhook": {"url": "http://127.0.0.1:9/hook"}},
        }.items():
            assert (
                request("PUT", f"{srv.url}/v1/stream/__ds/subscriptions/{sub}", ct, json.dumps(body))[0]
                == 201
            )
        assert request("PUT", srv.url + "/v1/groups/g1", ct, json.dumps({"pattern": "jobs/*"}))[0] == 201
        assert (
            request(
                "POST", srv.url + "/v1/groups/g1/join", ct, json.dumps({"member": "m1", "join_id": "j1"})
            )[0]
            == 200
        )
        for path in ("jobs/1", "hooks/1"):
            assert request("PUT", f"{srv.url}/v1/stream/{path}", ct, b'{"n": 1}')[0] == 201
        wait_for(
            lambda: b"wake" in request("GET", srv.url + "/v1/stream/wakes?offset=-1")[2], "the pull wake"
        )
        hook = json.loads(request("GET", srv.url + "/v1/stream/__ds/subscriptions/hook")[2])
        wait_for(
            lambda: (
                json.loads(request("GET", srv.url + "/v1/stream/__ds/subscriptions/hook")[2])["status"]
                == "failed"
            ),
            "a failed webhook delivery",
        )
        assert hook["streams"]
        assert (
            request(
                "PUT",
                srv.url + "/v1/admin/retention/default/kept",
                OCTET,
                json.dumps({"retention_bytes": 0}).encode(),
            )[0]
            == 200
        )
    finally:
        assert srv.stop() == 0
    before = file_hashes(data)
    records_before = journal_records(data)

    for args in (
        ["gc", "--data-dir", str(data), "--dry-run", "--gc-grace-s", "0"],
        ["verify", "--data-dir", str(data)],
    ):
        done = tiered(*args)
        assert done.returncode == 0, done
        assert file_hashes(data) == before, f"{args[0]} changed the data dir"
    assert "DRY RUN: nothing was changed" in tiered("gc", "--data-dir", str(data), "--dry-run").stdout

    done = tiered("gc", "--data-dir", str(data), "--gc-grace-s", "0")
    assert done.returncode == 0, done
    rows = report_rows(done.stdout)
    assert rows["objects deleted"] == 2 and rows["retention advanced (streams)"] == 1, done.stdout
    after = file_hashes(data)
    changed = {p for p in set(before) | set(after) if before.get(p) != after.get(p)}
    assert changed <= {
        "LOCK",
        "hot",
        *(p for p in changed if p.startswith("hot/") or p.startswith("cold/")),
    }, changed
    assert not any(p.startswith("snapshots/") for p in changed), "an offline pass writes no snapshot"
    new_records = journal_records(data)[len(records_before) :]
    assert journal_records(data)[: len(records_before)] == records_before
    assert new_records and {type(r).__name__ for r in new_records} <= GC_RECORD_KINDS, new_records


def test_offline_commands_refuse_a_missing_data_dir(tmp_path: Path) -> None:
    missing = tmp_path / "nonexistent" / "y"
    for args in (
        ["verify", "--data-dir", str(missing)],
        ["gc", "--data-dir", str(missing)],
        ["gc", "--data-dir", str(missing), "--dry-run"],
    ):
        done = tiered(*args)
        assert done.returncode == 2, (args, done)
        assert "does not exist" in done.stderr
        assert not (tmp_path / "nonexistent").exists(), f"{args[0]} created the data dir"
