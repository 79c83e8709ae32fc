"""The store (the source of truth) and its format: open one from a URL (a directory, file://...,
s3://bucket/prefix or gs://bucket/prefix, fleet.store.schemes); `layout`, `manifest`, `results`
and `checkpoints` say what lies in it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleet.store.base import Store
from fleet.store.schemes import StoreOptions, local_path, scheme_of

if TYPE_CHECKING:
    from fleet.settings import Settings

__all__ = ["Store", "open_store", "store_for"]


def open_store(url: str, max_attempts: int = 10, multipart_threshold_mb: int = 64) -> Store:
    """The store at `url`; `max_attempts` is every object store's retry budget (settings.store_client)."""
    scheme = scheme_of(url)
    if scheme is not None:
        return scheme.store(url, StoreOptions(max_attempts, multipart_threshold_mb))
    from fleet.store.local import LocalStore

    return LocalStore(local_path(url))


def store_for(settings: Settings) -> Store:
    """The store every fleet process of these settings opens."""
    client = settings.store_client
    return open_store(settings.resolved_store_url, client.max_attempts, client.multipart_threshold_mb)
