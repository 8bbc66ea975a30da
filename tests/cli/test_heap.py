"""The collector settings ``tiered serve`` runs with (tiered/cli/heap.py): why they exist is a benchmark
(docs/cost-curves.md, append p99 beside 300,000 idle streams); what they are is pinned here."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.gc_support import make_config
from tests.support.server_process import free_port
from tiered.cli.heap import GC_THRESHOLDS
from tiered.cli.serve import serve


@pytest.fixture
def restored_collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_serve_raises_the_thresholds_and_freezes_the_recovered_state(
    tmp_path: Path, restored_collector: None
) -> None:
    gc.unfreeze()
    config = make_config(tmp_path / "data", host="127.0.0.1", port=free_port())
    seen: dict[str, object] = {}

    async def main() -> None:
        ready = asyncio.Event()
        task = asyncio.create_task(serve(config, ready))
        await asyncio.wait_for(ready.wait(), 30)
        seen["thresholds"] = gc.get_threshold()
        seen["frozen"] = gc.get_freeze_count()
        os.kill(os.getpid(), signal.SIGTERM)  # serve's own handler: a clean shutdown
        await asyncio.wait_for(task, 30)

    asyncio.run(main())
    assert seen["thresholds"] == GC_THRESHOLDS
    assert isinstance(seen["frozen"], int) and seen["frozen"] > 10_000  # the interpreter, the node, its state
