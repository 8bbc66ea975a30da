"""An asyncio TCP proxy in front of the object store that follows a fault plan.

Every node of a test cluster talks to the store through one ``StoreProxy``
(its own event loop in a daemon thread, so it serves server processes and
synchronous test code alike). While a ``FaultPlan`` is set, each chunk
passing through may, drawn from a seeded generator:

* **drop** the connection mid-request: toward the store, a request is
  swallowed and both sides are cut (it never reached the store); toward the
  client, the answer is swallowed and both sides are cut (the request was
  applied, its answer lost: what botocore retries and the cluster settles by
  reading back);
* **delay** the chunk by a bounded random time;
* **black-hole** the connection: accepted and held, nothing forwarded either
  way, until ``blackhole_s`` passed; then it is cut (bounded, so a client
  without a read timeout does not hang the test).

Toward the store, drops and black holes start only where a request starts,
never inside a body: moto (5.2) stores a body cut short by a closed
connection as the whole object (it checks neither ``Content-Length`` against
what arrived nor ``Content-MD5``), where S3 and Ceph RGW refuse it, so a
fault there would test moto, not tiered.

``heal()`` returns to plain forwarding (held connections are cut at once).
Counters say which faults were applied, so a test can assert they happened.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class FaultPlan:
    drop: float = 0.0  # per chunk
    delay: float = 0.0  # per chunk
    delay_s: tuple[float, float] = (0.05, 0.4)
    blackhole: float = 0.0  # per chunk: the whole connection goes silent
    blackhole_s: float = 3.0


HEALTHY = FaultPlan()
_METHODS = (b"GET ", b"PUT ", b"POST ", b"DELETE ", b"HEAD ")


class StoreProxy:
    def __init__(self, target_host: str, target_port: int, *, seed: int = 13) -> None:
        self.target = (target_host, target_port)
        self.plan = HEALTHY
        self.applied: Counter[str] = Counter()
        self.rng = random.Random(seed)
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True, name="store-proxy")
        self._server: asyncio.Server | None = None
        self._healed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> StoreProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the store proxy did not start")
        return self

    def set_plan(self, plan: FaultPlan) -> None:
        def apply() -> None:
            self.plan = plan
            if plan == HEALTHY:
                self._healed.set()  # black-holed connections are cut now
            else:
                self._healed.clear()

        self._loop.call_soon_threadsafe(apply)

    def heal(self) -> None:
        self.set_plan(HEALTHY)

    def stop(self) -> None:
        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    # -- the loop thread -------------------------------------------------------------------

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._accept, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        try:
            try:
                up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(*self.target), 5)
            except (OSError, TimeoutError):
                writer.close()
                return
            cut = asyncio.Event()
            pumps = [
                asyncio.ensure_future(self._pump(reader, up_writer, cut, "request")),
                asyncio.ensure_future(self._pump(up_reader, writer, cut, "answer")),
            ]
            try:
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
                cut.set()
                await asyncio.wait(pumps, timeout=1)
            finally:
                for pump in pumps:
                    pump.cancel()
                for w in (writer, up_writer):
                    w.close()
        finally:
            self._tasks.discard(task)  # type: ignore[arg-type]

    async def _pump(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, cut: asyncio.Event, way: str
    ) -> None:
        try:
            while not cut.is_set():
                data = await src.read(65536)
                if not data:
                    break
                plan, roll = self.plan, self.rng.random()
                if way == "request" and not data.startswith(_METHODS):
                    roll = 1.0  # inside a request body: at most a delay (see the module docstring)
                    if self.rng.random() < plan.delay:
                        roll = plan.blackhole + plan.drop
                if roll < plan.blackhole:
                    self.applied["blackhole"] += 1
                    cut.set()  # the other way goes silent too: nothing is forwarded any more
                    try:
                        await asyncio.wait_for(self._healed.wait(), plan.blackhole_s)
                    except TimeoutError:
                        pass
                    return
                roll -= plan.blackhole
                if roll < plan.drop:
                    self.applied[f"drop-{way}"] += 1
                    cut.set()
                    return
                roll -= plan.drop
                if roll < plan.delay:
                    self.applied["delay"] += 1
                    await asyncio.sleep(self.rng.uniform(*plan.delay_s))
                if cut.is_set():
                    return
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            cut.set()
