"""An HTTP server on 127.0.0.1 that answers slowly one way, for the total-deadline tests of every
client of the package (the webhook, the SGLang transport, the reference server's helpers).

Raw sockets, so that it can do what ``http.server`` cannot: drip its status line and headers.
Every loop is bounded (``max_bytes`` drips, a few seconds of reading a request), each wait ends
at :meth:`DripServer.stop`, and ``stop`` closes every socket and joins every thread.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"
MODES = ("ok", "body", "headers", "silent")


class DripServer:
    """``mode``: ``ok`` answers at once; ``body`` sends its headers (``Content-Length: 100``),
    then one byte of body every ``every_s``; ``headers`` sends the answer itself, status line
    first, one byte every ``every_s``; ``silent`` reads the request and never answers."""

    def __init__(self, mode: str, *, every_s: float = 1.0, max_bytes: int = 60) -> None:
        assert mode in MODES, mode
        self.mode = mode
        self.every_s = every_s
        self.max_bytes = max_bytes
        self.requests: list[bytes] = []
        """The raw requests received (request line, headers and body)."""
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self._sock.settimeout(0.05)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._start(self._accept)

    def _start(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            with self._lock:
                self._conns.append(conn)
            self._start(self._serve, conn)

    def _read_request(self, conn: socket.socket) -> bytes | None:
        """One request (headers and ``Content-Length`` body), or None when the client left."""
        conn.settimeout(0.05)
        data = b""
        give_up = time.monotonic() + 10
        while not self._stop.is_set() and time.monotonic() < give_up:
            head, sep, body = data.partition(b"\r\n\r\n")
            if sep:
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                if len(body) >= length:
                    return data
            try:
                chunk = conn.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return None
            if not chunk:
                return None
            data += chunk
        return None

    def _drip(self, conn: socket.socket, data: bytes) -> None:
        for byte in data[: self.max_bytes]:
            if self._stop.wait(self.every_s):
                return
            conn.sendall(bytes([byte]))

    def _serve(self, conn: socket.socket) -> None:
        try:
            for _ in range(100):  # keep-alive: one request after another on the connection
                request = self._read_request(conn)
                if request is None:
                    return
                with self._lock:
                    self.requests.append(request)
                if self.mode == "ok":
                    conn.sendall(ANSWER)
                    continue
                if self.mode == "body":
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
                    self._drip(conn, b"x" * 100)
                elif self.mode == "headers":
                    self._drip(conn, ANSWER)
                else:  # silent
                    self._stop.wait(30)
                return
        except OSError:
            return
        finally:
            conn.close()

    def stop(self) -> None:
        self._stop.set()
        self._sock.close()
        with self._lock:
            threads, conns = list(self._threads), list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for thread in threads:
            thread.join(5)

    def __enter__(self) -> DripServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
