"""A fault-injecting HTTP proxy on loopback in front of an S3 server, for tests.

Guarantees: requests to `FaultProxy.endpoint` are forwarded unchanged (method, path, headers,
body; the ``Host`` header too, so request signatures stay valid) to the upstream server, except
GETs during an outage that `throttle` announces: from the first GET whose path contains its
``path_part`` and for ``seconds`` after it, every such GET is answered with the given HTTP status
and an S3-style error body (``503 SlowDown``, ``429 TooManyRequests``, ``500 InternalError``)
without reaching the upstream, as a store that throttles a client for a while does. `failed`
counts the requests answered that way. With ``delay_s`` every request waits that long before it
is forwarded (a store's latency; requests in flight wait concurrently), and ``gets`` and
``bytes_sent`` count the GETs forwarded and the body bytes returned for them. Traffic never leaves the
machine; `stop()` closes the listening socket.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

#: S3 error codes by HTTP status, as S3 sends them.
_CODES = {429: "TooManyRequests", 500: "InternalError", 503: "SlowDown"}


class FaultProxy:
    """Forwards to ``upstream`` (``http://host:port``), failing the requests it is told to."""

    def __init__(self, upstream: str, delay_s: float = 0.0) -> None:
        parts = urlsplit(upstream)
        self.delay_s = delay_s
        self.gets = 0
        self.bytes_sent = 0
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._lock = threading.Lock()
        self._outage: tuple[float, int, str] | None = None  # seconds, status, path part
        self._outage_ends: float | None = None
        self.failed = 0
        self.forwarded = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)

    @classmethod
    @contextmanager
    def serving(cls, upstream: str, delay_s: float = 0.0) -> Iterator[FaultProxy]:
        proxy = cls(upstream, delay_s)
        proxy._thread.start()
        try:
            yield proxy
        finally:
            proxy.stop()

    def throttle(self, seconds: float, status: int = 503, path_part: str = "") -> None:
        """Answer GETs whose path contains ``path_part`` with ``status`` for ``seconds``, counted from
        the first such GET after this call."""
        with self._lock:
            self._outage, self._outage_ends = (seconds, status, path_part), None

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _take_fault(self, method: str, path: str) -> int | None:
        with self._lock:
            if method != "GET" or self._outage is None or self._outage[2] not in path:
                self.forwarded += 1
                return None
            seconds, status, _ = self._outage
            now = time.monotonic()
            if self._outage_ends is None:
                self._outage_ends = now + seconds
            if now >= self._outage_ends:
                self._outage = None
                self.forwarded += 1
                return None
            self.failed += 1
            return status

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - base signature
                pass

            def _relay(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                status = proxy._take_fault(self.command, self.path)
                if status is not None:
                    text = (
                        f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{_CODES.get(status, "Error")}</Code>'
                        f"<Message>injected by the test proxy</Message></Error>"
                    ).encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(text)))
                    self.end_headers()
                    self.wfile.write(text)
                    return
                if proxy.delay_s:
                    time.sleep(proxy.delay_s)
                connection = http.client.HTTPConnection(*proxy._upstream, timeout=60)
                try:
                    headers = {key: value for key, value in self.headers.items() if key.lower() != "connection"}
                    connection.request(self.command, self.path, body=body, headers=headers)
                    response = connection.getresponse()
                    payload = response.read()
                finally:
                    connection.close()
                self.send_response(response.status, response.reason)
                head = self.command == "HEAD"  # its Content-Length is the object's, with no body
                dropped = (
                    ("transfer-encoding", "connection")
                    if head
                    else ("transfer-encoding", "connection", "content-length")
                )
                for key, value in response.getheaders():
                    if key.lower() not in dropped:
                        self.send_header(key, value)
                if not head:
                    self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if not head:
                    self.wfile.write(payload)
                if self.command == "GET":
                    with proxy._lock:
                        proxy.gets += 1
                        proxy.bytes_sent += len(payload)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _relay

        return Handler
