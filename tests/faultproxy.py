"""A small HTTP proxy on loopback in front of an endpoint (moto's S3; tests/gcsserver.py builds
GCS's on it) that fails or drops a fraction of requests, for the store-fault tests. Deterministic
for a given seed."""

from __future__ import annotations

import http.client
import random
import threading
from http.server import BaseHTTPRequestHandler
from typing import ClassVar
from urllib.parse import urlparse

from fleet.coord.localredis import free_port
from tests.httpstub import StandInServer

SLOWDOWN = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
            b"<Message>Please reduce your request rate.</Message></Error>")

#: an answer: status, headers, body
Answer = tuple[int, list[tuple[str, str]], bytes]


class FaultProxy:
    #: what a failed request is answered (503), as the service words it
    failure: ClassVar[tuple[str, bytes]] = ("application/xml", SLOWDOWN)

    def __init__(self, upstream: str, fail_rate: float = 0.1, drop_rate: float = 0.05, seed: int = 1,
                 port: int | None = None):
        up = urlparse(upstream)
        self.host, self.up_port = up.hostname, up.port
        self.fail_rate, self.drop_rate = fail_rate, drop_rate
        self.rng = random.Random(seed)
        #: stopped: connections kept alive by clients are dropped too, not only new ones refused
        self.down = False
        self.lock = threading.Lock()
        self.counts = {"forwarded": 0, "failed": 0, "dropped": 0}
        self.port = port or free_port()  # a proxy stopped and started again on its port: an outage that ends
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = StandInServer(("127.0.0.1", self.port), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _fate(self) -> str:
        if self.down:
            return "dropped"
        with self.lock:
            x = self.rng.random()
            fate = "failed" if x < self.fail_rate else "dropped" if x < self.fail_rate + self.drop_rate else "forwarded"
            self.counts[fate] += 1
            return fate

    def host_header(self) -> str:
        """The Host a forwarded request names: the upstream's."""
        return f"{self.host}:{self.up_port}"

    def forward(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> Answer:
        conn = http.client.HTTPConnection(self.host, self.up_port, timeout=60)
        try:
            conn.request(method, path, body=body, headers={**headers, "Host": self.host_header()})
            resp = conn.getresponse()
            return resp.status, resp.getheaders(), resp.read()
        finally:
            conn.close()

    def handle(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> Answer:
        """A request that is neither failed nor dropped: forwarded as it is."""
        return self.forward(method, path, body, headers)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                fate = proxy._fate()
                if fate == "dropped":
                    self.close_connection = True
                    self.connection.close()
                    return
                if fate == "failed":
                    status, headers, data = 503, [("Content-Type", proxy.failure[0])], proxy.failure[1]
                else:
                    sent = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                    status, headers, data = proxy.handle(self.command, self.path, body, sent)
                self.send_response(status)
                for k, v in headers:
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _any

        return Handler

    def start(self) -> FaultProxy:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.down = True
        self.server.shutdown()
        self.server.server_close()
