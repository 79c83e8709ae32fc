"""The store protocol: the source of truth for manifests, chunks, checkpoints and results."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from pathlib import Path


class Store(ABC):
    """Keys are '/'-separated paths relative to the store root (a directory, or a prefix in a bucket)."""

    url: str

    @abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Write or overwrite an object."""

    @abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Write only when no object exists: True if this call created it, False if one was there."""

    @abstractmethod
    def get(self, key: str) -> bytes:
        """Read an object; ObjectMissing when absent."""

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def list(self, prefix: str) -> Iterator[str]:
        """Keys under a prefix, in lexicographic order, paginated underneath."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove an object; absent is fine."""

    @abstractmethod
    def version(self, key: str) -> str:
        """An identity of the object's current bytes (ETag or mtime+size), to detect rewrites."""

    def download(self, key: str, dest: Path) -> None:
        """Copy an object into the local file `dest`; backends stream it (an input of many GB)."""
        dest.write_bytes(self.get(key))

    def upload(self, src: Path, key: str) -> None:
        """Write the local file `src` as an object; backends stream it (an export of many GB)."""
        self.put(key, src.read_bytes())

    def delete_many(self, keys: Iterable[str]) -> None:
        """Remove objects; absent ones are fine. A backend with a batch call uses it (S3: up to
        1,000 keys a request), so a chunk's checkpoints go in one request, not one each."""
        for key in keys:
            self.delete(key)

    def delete_prefix(self, prefix: str) -> None:
        self.delete_many(list(self.list(prefix)))
