"""A TCP proxy on 127.0.0.1 that a test can switch between behaving and misbehaving.

Modes (switchable at any time; they apply to open connections too):

* ``forward``: bytes pass both ways;
* ``blackhole``: connections are accepted and requests swallowed; nothing ever
  answers (a stalled store or a silent network partition);
* ``refuse``: new connections are closed at once, open ones are cut;
* ``delay``: like forward, but every chunk waits ``delay_s`` first.

Threads, not asyncio, so it serves a server under test in another process as
well as in-process code on any event loop.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.mode = "forward"
        self.delay_s = 0.0
        self.connections = 0
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port = self._listener.getsockname()[1]
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> TcpProxy:
        self._thread.start()
        return self

    def set(self, mode: str, delay_s: float = 0.0) -> None:
        assert mode in ("forward", "blackhole", "refuse", "delay"), mode
        self.mode, self.delay_s = mode, delay_s
        if mode == "refuse":
            with self._lock:
                for s in list(self._open):
                    _close(s)

    def stop(self) -> None:
        self._stopped.set()
        _close(self._listener)
        with self._lock:
            for s in list(self._open):
                _close(s)

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.mode == "refuse":
                _close(client)
                continue
            self.connections += 1
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            _close(client)
            return
        upstream.settimeout(None)
        with self._lock:
            self._open.update((client, upstream))
        threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
        self._pump(upstream, client)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                while self.mode == "blackhole" and not self._stopped.is_set():
                    time.sleep(
                        0.01
                    )  # hold everything: nobody answers, nothing is dropped on the floor loudly
                if self.mode == "delay":
                    time.sleep(self.delay_s)
                if self.mode == "refuse" or self._stopped.is_set():
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                _close(s)
            with self._lock:
                self._open.discard(src)
                self._open.discard(dst)


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass


@contextmanager
def proxy_to(host: str, port: int) -> Iterator[TcpProxy]:
    proxy = TcpProxy(host, port).start()
    try:
        yield proxy
    finally:
        proxy.stop()
