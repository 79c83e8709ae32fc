"""Open a store from a URL: a directory, file://..., or s3://bucket/prefix."""

from __future__ import annotations

from urllib.parse import urlparse

from fleet.store.base import Store

__all__ = ["Store", "open_store"]


def open_store(url: str, s3_max_attempts: int = 10, multipart_threshold_mb: int = 64) -> Store:
    if url.startswith("s3://"):
        from fleet.store.s3 import S3Store

        if not urlparse(url).netloc:
            from fleet.errors import ConfigError

            raise ConfigError(f"store URL {url!r} names no bucket (s3://bucket/prefix)")
        return S3Store(url, s3_max_attempts, multipart_threshold_mb)
    from fleet.store.local import LocalStore

    if url.startswith("file://"):
        url = urlparse(url).path
    return LocalStore(url)
