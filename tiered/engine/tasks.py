"""Background jobs, named, started and stopped by one owner (the node).

A job is a coroutine that runs until cancelled; jobs handle their own
expected failures (a store outage, a full journal). One that crashes anyway
is logged and restarted after a pause, so a bug in one pass cannot silently
end flushing or GC for the life of the process.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)

Job = Callable[[], Coroutine[Any, Any, None]]


class BackgroundTasks:
    def __init__(self, restart_after_s: float = 1.0) -> None:
        self.restart_after_s = restart_after_s
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.crashes = 0

    def start(self, name: str, job: Job) -> None:
        if name in self._tasks:
            raise ValueError(f"job {name} is already running")
        self._tasks[name] = asyncio.create_task(self._supervise(name, job), name=name)

    async def _supervise(self, name: str, job: Job) -> None:
        while True:
            try:
                await job()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                self.crashes += 1
                log.exception("background job %s crashed; restarting in %.0fs", name, self.restart_after_s)
                await asyncio.sleep(self.restart_after_s)

    @property
    def names(self) -> list[str]:
        return sorted(self._tasks)

    async def stop(self) -> None:
        """Cancel every job and wait for each to finish (shutdown stays prompt)."""
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
