"""A worker's store, counting its requests as an object store bills them (the metric
fleet_store_requests{method, kind}): what a fleet's store costs is read from the workers that make
the requests, by whoever watches their metrics (an operator, `fleet bench`'s store cost)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from fleet import metrics
from fleet.store.base import Store

#: keys one LIST page returns, and one DeleteObjects request removes (S3's, GCS's XML API's)
PAGE = 1000


def kind_of(key: str) -> str:
    """The kind of object a key or prefix names: what follows the job (`job/partial/...` -> partial,
    `job/manifest.json` -> manifest.json); a bounded set, fit for a label."""
    parts = key.split("/")
    return parts[1] if len(parts) > 1 and parts[1] else parts[0]


class CountedStore(Store):
    """`inner` with each request counted; anything else a backend offers is the inner store's."""

    def __init__(self, inner: Store):
        self.inner, self.url = inner, inner.url

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (a copy being made): never recurse
            raise AttributeError(name)
        return getattr(self.inner, name)

    @staticmethod
    def _count(method: str, key: str, n: int = 1) -> None:
        metrics.STORE_REQUESTS.labels(method=method, kind=kind_of(key)).inc(n)

    def put(self, key: str, data: bytes) -> None:
        self._count("PUT", key)
        self.inner.put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self._count("PUT", key)
        return self.inner.put_if_absent(key, data)

    def get(self, key: str) -> bytes:
        self._count("GET", key)
        return self.inner.get(key)

    def exists(self, key: str) -> bool:
        self._count("HEAD", key)
        return self.inner.exists(key)

    def list(self, prefix: str) -> Iterator[str]:
        """One LIST when the listing starts, one more for each further page of keys it reads."""
        self._count("LIST", prefix)
        for n, key in enumerate(self.inner.list(prefix)):
            if n and n % PAGE == 0:
                self._count("LIST", prefix)
            yield key

    def delete(self, key: str) -> None:
        self._count("DELETE", key)
        self.inner.delete(key)

    def delete_many(self, keys: Iterable[str]) -> None:
        todo = list(keys)
        if todo:
            self._count("DeleteObjects", todo[0], -(-len(todo) // PAGE))
        self.inner.delete_many(todo)

    def version(self, key: str) -> str:
        self._count("HEAD", key)
        return self.inner.version(key)

    def download(self, key: str, dest: Path) -> None:
        self._count("GET", key)
        self.inner.download(key, dest)

    def upload(self, src: Path, key: str) -> None:
        self._count("PUT", key)
        self.inner.upload(src, key)
