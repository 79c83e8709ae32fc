"""The spool: what a worker made but could not write to the store yet, kept on its own disk.

A result the store refuses for a while (an endpoint or network outage) is GPU work already paid
for: dropping it means generating the chunk again. So a finished chunk's result, and a flush of
its checkpoint, go to a bounded directory under the worker's data directory when the store
cannot take them; the run keeps its lease and retries, and whatever is still spooled when the
process ends is committed by the next process of the same worker at its start, or discarded
where another copy of the chunk won (docs/architecture.md, Failures). Only the store writer
(fleet.worker.process.storewriter) puts, commits and drops entries here: it decides what is spooled.

One file per object: `<kind>-<b64 store key>`, written atomically (temporary file, fsync,
rename). A result keeps its conditional put: spooled or not, a chunk is committed once.
"""

from __future__ import annotations

import base64
import os
import tempfile
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from fleet.errors import StoreError


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
    """A bounded directory of objects waiting for the store, one file each."""

    def __init__(self, root: Path, max_bytes: int):
        self.root, self.max_bytes = root, max_bytes

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
