"""bench/null_server.py's model of an append server: its group commit journals every body before the answer.

The model is what docs/benchmarks.md measures tiered's append path against ("what bounds a served
append"), so it must do what it claims: every acknowledged body is on disk, in order, and appends that
arrive while a batch is being written share the next batch (group commit), as tiered's journal does.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent.parent


def _null_server() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_null_server", REPO / "bench" / "null_server.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_group_commit_journals_every_body_in_order_before_it_answers(tmp_path: Path) -> None:
    model = _null_server()
    bodies = [f"body-{i:04d};".encode() * (1 + i % 7) for i in range(300)]

    async def scenario() -> tuple[int, bytes, list[bool]]:
        journal = model.GroupCommit(tmp_path)
        [path] = list(tmp_path.iterdir())
        on_disk_when_answered: list[bool] = []
        written = 0

        async def one(body: bytes) -> None:
            nonlocal written
            await journal.append(body)
            written += len(body)
            # Acknowledged: everything appended up to this body is in the file.
            on_disk_when_answered.append(os.path.getsize(path) >= written)

        # Arrivals spread over a few loop iterations, so some land while a batch is on disk.
        tasks = []
        for i, body in enumerate(bodies):
            tasks.append(asyncio.ensure_future(one(body)))
            if i % 50 == 49:
                await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        content = path.read_bytes()
        batches = journal.batches
        journal.close()
        assert not path.exists()  # the model's file goes with it
        return batches, content, on_disk_when_answered

    batches, content, answered = asyncio.run(scenario())
    assert content == b"".join(bodies)
    assert all(answered) and len(answered) == len(bodies)
    assert 1 <= batches < len(bodies)  # grouped, not one fsync per body


def test_the_model_handler_waits_for_its_batch_and_answers_204(tmp_path: Path) -> None:
    model = _null_server()
    from tiered.api.kit.types import Request

    async def scenario() -> tuple[int, bytes]:
        journal = model.GroupCommit(tmp_path)
        handler = model.append_handler(journal, work_us=5.0)

        async def read() -> bytes:
            return b"hello"

        response = await handler(Request("POST", "/v1/stream/a", "", {}, read))
        [path] = list(tmp_path.iterdir())
        content = path.read_bytes()
        journal.close()
        return response.status, content

    status, content = asyncio.run(scenario())
    assert status == 204
    assert content == b"hello"
