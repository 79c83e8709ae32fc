"""The store protocol: the source of truth for manifests, chunks, checkpoints and results."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator


class Store(ABC):
    """Keys are '/'-separated paths relative to the store root (a directory or an S3 prefix)."""

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

    def delete_prefix(self, prefix: str) -> None:
        for key in list(self.list(prefix)):
            self.delete(key)
