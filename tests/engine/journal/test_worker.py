"""The journal's thread (``tiered.engine.journal.worker``): calls run in order, one at a time, off the loop;
results and exceptions come back; a cancelled caller does not stop the calls after it; shutdown waits."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tiered.engine.journal.worker import JournalWorker

pytestmark = pytest.mark.timeout(60)


def test_calls_run_in_order_on_one_thread_off_the_loop() -> None:
    async def scenario() -> None:
        worker = JournalWorker("journal-test")
        seen: list[tuple[int, str]] = []
        running = 0
        overlapped = False

        def call(i: int) -> int:
            nonlocal running, overlapped
            running += 1
            overlapped = overlapped or running > 1
            time.sleep(0.001)
            seen.append((i, threading.current_thread().name))
            running -= 1
            return i * 10

        results = await asyncio.gather(*(worker.run(call, i) for i in range(50)))
        assert results == [i * 10 for i in range(50)]
        assert [i for i, _ in seen] == list(range(50))
        assert {name for _, name in seen} == {"journal-test"}
        assert not overlapped
        worker.shutdown()

    asyncio.run(scenario())


def test_an_exception_comes_back_and_the_thread_goes_on() -> None:
    async def scenario() -> None:
        worker = JournalWorker()

        def fail() -> None:
            raise OSError(28, "No space left on device")

        with pytest.raises(OSError, match="No space left"):
            await worker.run(fail)
        assert await worker.run(lambda: "still serving") == "still serving"
        worker.shutdown()

    asyncio.run(scenario())


def test_a_cancelled_caller_leaves_the_calls_after_it_alone_and_shutdown_waits_for_them() -> None:
    async def scenario() -> None:
        worker = JournalWorker()
        release = threading.Event()
        done: list[str] = []

        def slow() -> None:
            release.wait(10)
            done.append("slow")

        first = worker.run(slow)
        second = worker.run(lambda: done.append("after"))
        first.cancel()
        release.set()
        await second
        assert done == ["slow", "after"]
        worker.run(lambda: (time.sleep(0.05), done.append("late")))
        worker.shutdown()  # blocks until the queued call ran
        assert done == ["slow", "after", "late"]

    asyncio.run(scenario())
