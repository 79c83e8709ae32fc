"""A small HTTP proxy on loopback in front of the S3 endpoint that fails or drops a
fraction of requests, for the store-fault test. Deterministic for a given seed."""

from __future__ import annotations

import http.client
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

from fleet.coord.localredis import free_port

SLOWDOWN = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
            b"<Message>Please reduce your request rate.</Message></Error>")


class FaultProxy:
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
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _fate(self) -> str:
        if self.down:
            return "dropped"
        with self.lock:
            x = self.rng.random()
            fate = "failed" if x < self.fail_rate else "dropped" if x < self.fail_rate + self.drop_rate else "forwarded"
            self.counts[fate] += 1
            return fate

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
                    self.send_response(503)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(SLOWDOWN)))
                    self.end_headers()
                    self.wfile.write(SLOWDOWN)
                    return
                conn = http.client.HTTPConnection(proxy.host, proxy.up_port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                headers["Host"] = f"{proxy.host}:{proxy.up_port}"
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        return Handler

    def start(self) -> FaultProxy:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.down = True
        self.server.shutdown()
        self.server.server_close()
