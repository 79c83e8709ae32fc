"""The HTTP server of the test stand-ins (a fault proxy, a Hub, an OpenAI-compatible server): a thread per
request, and quiet about a client that hung up, which the fault tests make happen on purpose; any other error
in a handler is printed as before."""

from __future__ import annotations

import sys
from http.server import ThreadingHTTPServer
from typing import Any


class StandInServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):  # a reset or a broken pipe: the client left
            return
        super().handle_error(request, client_address)
