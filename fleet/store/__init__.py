"""The store (the source of truth) and its format: open one from a URL (a directory, file://..., or
s3://bucket/prefix); `layout`, `manifest`, `results` and `checkpoints` say what lies in it."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlparse

from fleet.store.base import Store

if TYPE_CHECKING:
    from fleet.settings import Settings

__all__ = ["Store", "open_store", "store_for"]


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


def store_for(settings: Settings) -> Store:
    """The store every fleet process of these settings opens."""
    return open_store(settings.resolved_store_url, settings.s3_max_attempts, settings.multipart_threshold_mb)
