"""Consumer groups end to end: real ``GroupConsumer`` processes against ``tiered serve``.

Several worker processes (``tests/support/group_worker.py``) consume a group while a
producer appends, and members and the server are SIGKILLed at random. Then
everything settles and we check:

* every acknowledged append was processed at least once (by some worker),
* no committed cursor, as the server reports it, ever went back - not across
  rebalances, member deaths or server crashes,
* at the end every cursor is at its stream's tail.

The seed is printed; set ``GROUPS_E2E_SEED`` to replay a schedule.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.support.deadlines import scaled
from tests.support.http_helpers import append, create, request, stream_url
from tests.support.server_process import ServerProcess
from tiered.core.ids import parse_offset

WORKER = Path(__file__).parent.parent.parent / "support" / "group_worker.py"
STREAMS = [f"e2e/s{i}" for i in range(6)]
GROUP = "e2e"
CHAOS_S = 20.0
SETTLE_S = 25.0


class Workers:
    def __init__(self, url: str, logs: Path) -> None:
        self.url = url
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.spawned = 0

    def start(self, member: str) -> None:
        self.spawned += 1
        log = self.logs / f"{member}-{self.spawned}.log"
        err = open(self.logs / f"{member}-{self.spawned}.stderr", "wb")
        root = str(WORKER.parent.parent)  # import tiered from this checkout even without an install
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
        }
        self.procs[member] = subprocess.Popen(
            [sys.executable, str(WORKER), self.url, GROUP, member, str(log)],
            stdout=err,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )

    def kill(self, member: str) -> None:
        proc = self.procs.pop(member)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def kill_all(self) -> None:
        for member in list(self.procs):
            self.kill(member)

    def processed(self) -> set[tuple[str, int]]:
        out = set()
        for path in self.logs.glob("*.log"):
            for line in path.read_text().splitlines():
                parts = line.split(" ")
                if len(parts) == 3:  # a line cut by SIGKILL is incomplete
                    out.add((parts[0], int(parts[1])))
        return out


def group_state(url: str) -> dict | None:
    try:
        status, _, body = request("GET", f"{url}/v1/groups/{GROUP}", timeout=3)
    except OSError:
        return None
    return json.loads(body) if status == 200 else None


def test_consumers_and_server_killed_at_random(tmp_path: Path) -> None:
    seed = int(os.environ.get("GROUPS_E2E_SEED", random.randrange(1 << 30)))
    print(f"GROUPS_E2E_SEED={seed}")
    rng = random.Random(seed)
    srv = ServerProcess(tmp_path / "data", "--long-poll-timeout-s", "1").start()
    logs = tmp_path / "logs"
    logs.mkdir()
    workers = Workers(srv.url, logs)
    stop = threading.Event()
    acked: set[tuple[str, int]] = set()
    regressions: list[str] = []
    observed: dict[str, int] = {}

    def produce() -> None:
        seq = 0
        while not stop.is_set():
            stream = rng_p.choice(STREAMS)
            seq += 1
            body = f"{stream}#{seq}\n".encode()
            try:
                status, headers, _ = append(stream_url(srv.url, stream), body, "text/plain")
            except OSError:
                time.sleep(0.05)
                continue
            if status == 204:
                acked.add((stream, parse_offset(headers["Stream-Next-Offset"]) - len(body)))
            time.sleep(0.01)

    def monitor() -> None:
        while not stop.is_set():
            state = group_state(srv.url)
            for t in (state or {}).get("targets", []):
                cursor = 0 if t["cursor"] == "-1" else parse_offset(t["cursor"])  # -1: nothing committed
                if cursor < observed.get(t["stream"], 0):
                    regressions.append(f"{t['stream']}: {observed[t['stream']]} -> {cursor}")
                observed[t["stream"]] = max(observed.get(t["stream"], 0), cursor)
            time.sleep(0.1)

    rng_p = random.Random(seed + 1)
    try:
        for stream in STREAMS:
            assert create(stream_url(srv.url, stream), "text/plain")[0] == 201
        status, _, body = request(
            "PUT",
            f"{srv.url}/v1/groups/{GROUP}",
            {"Content-Type": "application/json"},
            json.dumps({"pattern": "e2e/*", "session_timeout_ms": 2000}),
        )
        assert status == 201, body
        members = ["m0", "m1", "m2"]
        for m in members:
            workers.start(m)
        threads = [
            threading.Thread(target=produce, daemon=True),
            threading.Thread(target=monitor, daemon=True),
        ]
        for t in threads:
            t.start()

        actions: list[str] = []
        deadline = time.monotonic() + CHAOS_S
        next_member = len(members)
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(1.0, 2.5))
            roll = rng.random()
            if roll < 0.25:
                actions.append("server")
                srv.kill()
                time.sleep(rng.uniform(0, 0.5))
                srv.start()
            elif roll < 0.65:
                m = rng.choice(sorted(workers.procs))
                actions.append(f"restart {m}")
                workers.kill(m)
                time.sleep(rng.uniform(0, 1.0))
                workers.start(m)  # a new instance under the same member id
            elif roll < 0.85 and len(workers.procs) > 2:
                m = rng.choice(sorted(workers.procs))
                actions.append(f"kill {m}")
                workers.kill(m)  # its streams move once its session expires
            else:
                m = f"m{next_member}"
                next_member += 1
                actions.append(f"add {m}")
                workers.start(m)
        print("actions:", actions)
        stop.set()
        for t in threads:
            t.join(10)

        # Settle: every acknowledged message processed, every cursor at its tail.
        stop.clear()
        mon = threading.Thread(target=monitor, daemon=True)
        mon.start()
        settle_deadline = time.monotonic() + scaled(SETTLE_S)
        missing: set[tuple[str, int]] = set(acked)
        at_tail = False
        while time.monotonic() < settle_deadline:
            missing = acked - workers.processed()
            state = group_state(srv.url)
            at_tail = state is not None and all(t["cursor"] == t["tail"] for t in state["targets"])
            if not missing and at_tail:
                break
            time.sleep(0.3)
        stop.set()
        mon.join(10)
        assert len(acked) > 200, f"the producer got only {len(acked)} appends through"
        assert not missing, (
            f"{len(missing)} of {len(acked)} acknowledged messages never processed, e.g. {sorted(missing)[:5]}"
        )
        assert at_tail, group_state(srv.url)
        assert not regressions, regressions
        # Nobody was superseded while alive (only dead instances were replaced).
        for m, proc in workers.procs.items():
            assert proc.poll() is None, f"{m} exited with {proc.returncode}"
    finally:
        stop.set()
        workers.kill_all()
        srv.kill()


def test_client_hands_over_on_join_and_stops_when_superseded(tmp_path: Path) -> None:
    """Two in-process ``GroupConsumer`` s: a join moves half the streams (after release); a same-id join fences."""
    import asyncio

    from tiered_client.groups import GroupConsumer, GroupFenced

    srv = ServerProcess(tmp_path / "data", "--long-poll-timeout-s", "1").start()
    try:
        streams = [f"h/s{i}" for i in range(4)]
        for s in streams:
            assert create(stream_url(srv.url, s), "text/plain", f"{s} first\n")[0] == 201
        request(
            "PUT",
            f"{srv.url}/v1/groups/h",
            {"Content-Type": "application/json"},
            json.dumps({"pattern": "h/*"}),
        )

        async def run() -> None:
            seen: dict[str, list[tuple[str, str]]] = {"a": [], "b": []}

            async def consume(name: str, consumer: GroupConsumer) -> None:
                async for batch in consumer:
                    seen[name].append((batch.stream, batch.offset))

            a = GroupConsumer(srv.url, "h", "a", wait_ms=500)
            await a.start()
            ta = asyncio.create_task(consume("a", a))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + scaled(8)
            while loop.time() < deadline and len(seen["a"]) < 4:
                await asyncio.sleep(0.05)
            assert len(seen["a"]) == 4, seen
            assert sorted(a.assigned) == streams
            b = GroupConsumer(srv.url, "h", "b", wait_ms=500)
            await b.start()
            tb = asyncio.create_task(consume("b", b))
            deadline = loop.time() + scaled(8)
            while loop.time() < deadline and not (len(a.assigned) == 2 and len(b.assigned) == 2):
                await asyncio.sleep(0.05)
            assert len(a.assigned) == 2 and len(b.assigned) == 2, (a.assigned, b.assigned)
            assert set(a.assigned).isdisjoint(b.assigned)
            # b resumes from a's committed cursors: nothing a processed is handed to b again.
            for s in streams:
                append(stream_url(srv.url, s), f"{s} second\n", "text/plain")
            deadline = loop.time() + scaled(5)
            while loop.time() < deadline and len(seen["a"]) + len(seen["b"]) < 8:
                await asyncio.sleep(0.05)
            assert sorted(seen["a"] + seen["b"]) == sorted(set(seen["a"] + seen["b"]))
            assert len(seen["a"] + seen["b"]) == 8
            # A second instance of "a" fences the first, which stops with GroupFenced.
            a2 = GroupConsumer(srv.url, "h", "a", wait_ms=500)
            await a2.start()
            try:
                await asyncio.wait_for(ta, scaled(5))
                raise AssertionError("the superseded consumer kept going")
            except GroupFenced:
                pass
            await a2.close()
            await a.close()
            tb.cancel()
            await b.close()

        asyncio.run(run())
    finally:
        srv.stop()
