"""The spool: what a worker made but could not write to the store yet, kept on its own disk.

A result the store refuses for a while (an endpoint or network outage) is GPU work already paid
for: dropping it means generating the chunk again. So a finished chunk's result, and a flush of
its checkpoint, go to a bounded directory under the worker's data directory when the store
cannot take them; the run keeps its lease and retries, and whatever is still spooled when the
process ends is committed by the next process of the same worker at its start, or discarded
where another copy of the chunk won (docs/architecture.md, Failures).

One file per object: `<kind>-<b64 store key>`, written atomically (temporary file, fsync,
rename). A result keeps its conditional put: spooled or not, a chunk is committed once.
"""

from __future__ import annotations

import base64
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from fleet.errors import StoreError
from fleet.store import Store

log = logging.getLogger(__name__)


class Kind(StrEnum):
    #: a chunk result: committed with the store's conditional put; a lost race discards it
    RESULT = "result"
    #: a checkpoint object: a plain put under its own unique key
    CHECKPOINT = "checkpoint"


@dataclass(frozen=True)
class Spooled:
    kind: Kind
    key: str
    path: Path


class SpoolFull(StoreError):
    """The spool has no room left: the object is not kept (the chunk will be generated again)."""


class Spool:
    def __init__(self, root: Path, max_bytes: int, report: Callable[[float | None, int], None] | None = None):
        self.root, self.max_bytes = root, max_bytes
        #: called with (unreachable since (epoch s) or None, results waiting) as that changes
        self.report = report or (lambda since, waiting: None)
        #: epoch seconds the store first refused this worker in the current outage
        self.unreachable_since: float | None = None
        self._lock = threading.Lock()

    def refused(self) -> None:
        """The store refused a write: an outage begins, or goes on."""
        with self._lock:
            if self.unreachable_since is None:
                self.unreachable_since = time.time()
        self.report(self.unreachable_since, len(self.entries(Kind.RESULT)))

    def answered(self) -> None:
        """The store took a write: any outage is over."""
        with self._lock:
            was, self.unreachable_since = self.unreachable_since, None
        if was is not None:
            log.warning("store answers again after %.0fs unreachable", time.time() - was)
            self.report(None, len(self.entries(Kind.RESULT)))

    def _path(self, kind: Kind, key: str) -> Path:
        return self.root / f"{kind.value}-{base64.urlsafe_b64encode(key.encode()).decode()}"

    def used_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.root.glob("*-*") if p.is_file()) if self.root.is_dir() else 0

    def put(self, kind: Kind, key: str, data: bytes) -> Path:
        """Keep `data` for `key` on disk; SpoolFull beyond `max_bytes`."""
        if self.used_bytes() + len(data) > self.max_bytes:
            raise SpoolFull(f"spool {self.root} is full ({self.max_bytes} bytes): {key} not kept")
        self.root.mkdir(parents=True, exist_ok=True)
        path = self._path(kind, key)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    def entries(self, kind: Kind | None = None) -> list[Spooled]:
        if not self.root.is_dir():
            return []
        out = []
        for path in sorted(self.root.glob("*-*")):
            name, _, encoded = path.name.partition("-")
            if name not in {k.value for k in Kind} or (kind is not None and name != kind.value):
                continue
            out.append(Spooled(Kind(name), base64.urlsafe_b64decode(encoded.encode()).decode(), path))
        return out

    def drop(self, kind: Kind, key: str) -> None:
        self._path(kind, key).unlink(missing_ok=True)

    def commit(self, store: Store, entry: Spooled) -> bool:
        """Write one spooled object to the store and forget it; True when it was written, False
        when another copy of the result won. StoreError while the store is still unreachable."""
        data = entry.path.read_bytes()
        if entry.kind is Kind.RESULT:
            written = store.put_if_absent(entry.key, data)
        else:
            store.put(entry.key, data)
            written = True
        entry.path.unlink(missing_ok=True)
        return written

    def drain(self, store: Store) -> tuple[int, int]:
        """Commit everything spooled (results first); (written, discarded as another copy won).
        Stops at the first StoreError, which it raises: the rest waits for the next try."""
        written = discarded = 0
        for entry in self.entries(Kind.RESULT) + self.entries(Kind.CHECKPOINT):
            try:
                done = self.commit(store, entry)
            except StoreError:
                self.refused()
                raise
            self.answered()
            if done:
                written += 1
                log.info("spooled %s %s committed", entry.kind.value, entry.key)
            else:
                discarded += 1
                log.info("spooled result %s discarded: another copy of the chunk was committed first", entry.key)
        return written, discarded
