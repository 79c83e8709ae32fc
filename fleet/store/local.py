"""A store in a local directory: exclusive create via a hard link, atomic rename for overwrites."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from fleet.errors import ObjectMissing, StoreError
from fleet.store.base import Store


class LocalStore(Store):
    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser().resolve()
        self.url = str(self.root)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create store directory {self.root}: {e}") from e

    def _path(self, key: str) -> Path:
        if key.startswith("/") or ".." in key.split("/"):
            raise StoreError(f"invalid store key {key!r}")
        return self.root / key

    def _write_temp(self, path: Path, data: bytes) -> str:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return tmp

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        tmp = self._write_temp(path, data)
        os.replace(tmp, path)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        # link() fails if the name exists and never exposes a half-written file.
        path = self._path(key)
        tmp = self._write_temp(path, data)
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError as e:
            raise ObjectMissing(f"no object {key!r} in {self.url}") from e

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str) -> Iterator[str]:
        base = self._path(prefix.rstrip("/")) if prefix.strip("/") else self.root
        # A folder prefix ("j/failed/") is that folder only: one that does not exist holds nothing,
        # never its parent's whole tree (a job's every object, walked for an empty listing).
        start = base if base.is_dir() or prefix.endswith("/") else base.parent
        if not start.exists():
            return
        keys = []
        for dirpath, _dirs, files in os.walk(start):
            rel = os.path.relpath(dirpath, self.root).replace(os.sep, "/")
            folder = "" if rel == "." else rel + "/"
            keys += [key for name in files if not name.startswith(".") and (key := folder + name).startswith(prefix)]
        yield from sorted(keys)

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(key).unlink()

    def version(self, key: str) -> str:
        try:
            st = self._path(key).stat()
        except FileNotFoundError as e:
            raise ObjectMissing(f"no object {key!r} in {self.url}") from e
        return f"{st.st_mtime_ns}-{st.st_size}-{st.st_ino}"
