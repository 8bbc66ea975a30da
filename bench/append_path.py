#!/usr/bin/env python3
"""CPU of the append path without HTTP: the fused path against the general middleware chain.

One engine in this process (journal with fsync ``always``, no background jobs, the collector settings
``serve`` uses), 100 streams, then ``--appends`` 256-B appends through ``build_handler`` (``--chain
fused``: the append rows' fused path, ``tiered/api/append_path.py``; ``general``: every layer's own
coroutine), 64 in flight, requests built in memory. Prints the process CPU and the event loop thread's
CPU per append: what the server's Python costs an append, without granian's share. Alternate the two
chains in one session and compare medians: the machine's load moves both.

    python bench/append_path.py --chain fused && python bench/append_path.py --chain general

No network, no server; bounded by ``--appends``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from multidict import CIMultiDict  # noqa: E402

from tiered.api.app import build_handler  # noqa: E402
from tiered.api.kit.types import Request  # noqa: E402
from tiered.cli.heap import freeze_recovered_state, tune_collector  # noqa: E402
from tiered.core.clock import SystemClock  # noqa: E402
from tiered.core.config import Config  # noqa: E402
from tiered.engine.engine import Engine  # noqa: E402

OCTET = "application/octet-stream"


async def run(data_dir: Path, appends: int, fused: bool) -> tuple[float, float, float]:
    config = Config(data_dir=str(data_dir))
    config.validate()
    engine = Engine(config, SystemClock())
    await engine.start(jobs=False)
    try:
        handler = build_handler(engine, fused=fused)
        body = b"x" * 256

        async def read() -> bytes:
            return body

        for i in range(100):
            created = await handler(
                Request("PUT", f"/v1/stream/s{i}", "", CIMultiDict({"Content-Type": OCTET}), read)
            )
            assert created.status == 201
        headers = CIMultiDict({"Content-Type": OCTET, "Content-Length": "256", "Host": "127.0.0.1"})
        sent = 0

        async def client(k: int) -> None:
            nonlocal sent
            i = k
            while sent < appends:
                sent += 1
                answer = await handler(
                    Request("POST", f"/v1/stream/s{i % 100}", "", headers, read, host="127.0.0.1")
                )
                assert answer.status == 204, answer.body
                i += 64

        tune_collector()
        freeze_recovered_state()
        cpu, loop_cpu, wall = time.process_time(), time.thread_time(), time.monotonic()
        await asyncio.gather(*(client(k) for k in range(64)))
        return time.process_time() - cpu, time.thread_time() - loop_cpu, time.monotonic() - wall
    finally:
        await engine.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chain", choices=("fused", "general"), default="fused")
    ap.add_argument("--appends", type=int, default=20_000)
    args = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    with tempfile.TemporaryDirectory(prefix="tiered-append-path-") as tmp:
        cpu, loop_cpu, wall = asyncio.run(run(Path(tmp) / "data", args.appends, args.chain == "fused"))
    n = args.appends
    print(
        f"{args.chain}: {1e6 * cpu / n:.1f} µs process CPU per append ({1e6 * loop_cpu / n:.1f} µs on the "
        f"event loop's thread), {n / wall:,.0f} appends/s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
