"""gs:// (docs/architecture.md, Objects): a store under a Google Cloud Storage prefix, through
Google's own client (google-cloud-storage), and `client`, the one place one is built.

Exactly-once commits use GCS's precondition `ifGenerationMatch=0` ("create only"): a second
writer gets 412 Precondition Failed, never a replacement. A single-request upload is checked
when it lands; a resumable one (above the multipart threshold, and always above 8 MiB) carries
the precondition from its initiation and is checked when its last chunk finalizes the object.
Retries are the client's own (api_core's exponential backoff on 429, 5xx and connection
errors), bounded in time by the store's attempts setting; a retried create that the server had
already applied answers 412, which reads as "another writer won": the object holds this
writer's bytes either way, so nothing is lost or kept twice.

STORAGE_EMULATOR_HOST points it at an emulator (anonymous credentials); otherwise credentials
follow Google's application-default chain (GOOGLE_APPLICATION_CREDENTIALS, gcloud, metadata).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from fleet.errors import ConfigError, ObjectMissing, StoreError, StoreUnreachable
from fleet.redact import redact_url
from fleet.store.base import Store
from fleet.store.schemes import BucketScheme, StoreOptions

#: resumable chunk size: a multiple of 256 KiB, as GCS requires
PART_SIZE = 16 * 1024 * 1024


def _lib() -> Any:
    try:
        from google.cloud import storage
    except ImportError as e:
        raise ConfigError("gs:// needs Google's client: pip install 'fleet[gcs]' (google-cloud-storage)") from e
    return storage


def client() -> Any:
    """A google-cloud-storage client; the emulator's anonymous one where STORAGE_EMULATOR_HOST is set."""
    return _lib().Client()


@functools.cache
def _errors() -> tuple[type[Exception], ...]:
    """What the client raises for a call that failed: HTTP answers and the transport's errors."""
    import requests
    from google.api_core import exceptions as gex
    from google.auth import exceptions as gauth
    from google.resumable_media import common

    return (gex.GoogleAPIError, gauth.GoogleAuthError, common.InvalidResponse, requests.RequestException,
            ConnectionError)


def _retry(max_attempts: int) -> Any:
    """api_core's default policy (backoff 1 s doubling to 60 s), its deadline scaled from the
    attempts setting: 10 attempts, the default, is api_core's own 120 s."""
    from google.cloud.storage.retry import DEFAULT_RETRY

    return DEFAULT_RETRY.with_timeout(12.0 * max(1, max_attempts))


class GcsStore(Store):
    def __init__(self, url: str, max_attempts: int = 10, multipart_threshold_mb: int = 64):
        parsed = urlparse(url)
        self.bucket_name = parsed.netloc
        self.prefix = parsed.path.strip("/")
        self.url = url
        self.multipart_threshold = multipart_threshold_mb * 1024 * 1024
        self.client = client()
        self.bucket = self.client.bucket(self.bucket_name)
        self.retry = _retry(max_attempts)

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _blob(self, key: str, size: int = 0) -> Any:
        blob = self.bucket.blob(self._key(key))
        if size > self.multipart_threshold:
            blob.chunk_size = PART_SIZE  # resumable, in parts, like S3's multipart
        return blob

    def _fail(self, what: str, key: str, e: Exception) -> StoreError:
        from google.api_core.exceptions import NotFound

        if isinstance(e, NotFound):
            return ObjectMissing(f"no object {key!r} in {self.url}")
        return StoreError(f"GCS {what} {key!r} failed: {type(e).__name__}: {e}")

    def put(self, key: str, data: bytes) -> None:
        try:
            # An overwrite of the same bytes is idempotent: retried, unlike the client's default.
            self._blob(key, len(data)).upload_from_string(data, retry=self.retry)
        except _errors() as e:
            raise self._fail("put", key, e) from e

    def put_if_absent(self, key: str, data: bytes) -> bool:
        from google.api_core.exceptions import PreconditionFailed

        try:
            self._blob(key, len(data)).upload_from_string(data, if_generation_match=0, retry=self.retry)
            return True
        except PreconditionFailed:
            return False
        except _errors() as e:
            raise self._fail("conditional put", key, e) from e

    def get(self, key: str) -> bytes:
        try:
            return self._blob(key).download_as_bytes(retry=self.retry)
        except _errors() as e:
            raise self._fail("get", key, e) from e

    def exists(self, key: str) -> bool:
        try:
            return bool(self._blob(key).exists(retry=self.retry))
        except _errors() as e:
            raise self._fail("exists", key, e) from e

    def list(self, prefix: str) -> Iterator[str]:
        strip = len(self.prefix) + 1 if self.prefix else 0
        try:
            # GCS lists names in lexicographic order; the iterator follows the page tokens.
            for blob in self.client.list_blobs(self.bucket_name, prefix=self._key(prefix), retry=self.retry):
                yield blob.name[strip:]
        except _errors() as e:
            raise self._fail("list", prefix, e) from e

    def delete(self, key: str) -> None:
        from google.api_core.exceptions import NotFound

        try:
            self._blob(key).delete(retry=self.retry)
        except NotFound:
            pass
        except _errors() as e:
            raise self._fail("delete", key, e) from e

    def version(self, key: str) -> str:
        try:
            blob = self.bucket.get_blob(self._key(key), retry=self.retry)
        except _errors() as e:
            raise self._fail("head", key, e) from e
        if blob is None:
            raise ObjectMissing(f"no object {key!r} in {self.url}")
        return f"{blob.generation}-{blob.size}"

    def download(self, key: str, dest: Path) -> None:
        """Streamed to `dest` (checksummed, resumed on a dropped connection by the client)."""
        try:
            self._blob(key).download_to_filename(str(dest), retry=self.retry)
        except _errors() as e:
            dest.unlink(missing_ok=True)  # the client leaves what it had written
            raise self._fail("download", key, e) from e

    def upload(self, src: Path, key: str) -> None:
        """Streamed from `src`, resumable above 8 MiB: the object appears whole or not at all."""
        try:
            self._blob(key, src.stat().st_size).upload_from_filename(str(src), retry=self.retry)
        except _errors() as e:
            raise self._fail("upload", key, e) from e


class GcsScheme(BucketScheme):
    name = "gs"
    form = "gs://bucket/key"
    hint = ("check FLEET_STORE_URL, STORAGE_EMULATOR_HOST or the credentials (GOOGLE_APPLICATION_CREDENTIALS), "
            "and the network to storage.googleapis.com")

    def lost_errors(self) -> tuple[type[BaseException], ...]:
        import requests
        from google.api_core.exceptions import RetryError
        from google.auth.exceptions import TransportError

        return (RetryError, TransportError, requests.ConnectionError)

    def open(self, url: str, options: StoreOptions) -> Store:
        return GcsStore(url, options.max_attempts, options.multipart_threshold_mb)

    def bucket_exists(self, store: Store) -> bool | None:
        from google.api_core.exceptions import Forbidden

        assert isinstance(store, GcsStore)
        try:
            return bool(store.bucket.exists(retry=store.retry))
        except Forbidden:
            return None  # a writer may lack storage.buckets.get; the upload decides
        except _errors() as e:
            raise StoreError(f"{type(e).__name__}: {e}") from e

    def ping(self, store: Store, timeout_s: float) -> None:
        """One bucket lookup, without the store's minutes of retries."""
        from google.api_core.exceptions import Forbidden, NotFound

        assert isinstance(store, GcsStore)
        where = redact_url(store.url)
        try:
            store.client.get_bucket(store.bucket_name, timeout=timeout_s, retry=None)
        except (NotFound, Forbidden) as e:
            what = "no such bucket" if isinstance(e, NotFound) else "access denied"
            raise StoreUnreachable(f"store {where} answered {what} ({type(e).__name__}: {str(e).splitlines()[0]}): "
                                   "check the bucket name and the credentials") from None
        except _errors() as e:
            raise StoreUnreachable(f"cannot reach the store at {where} ({type(e).__name__}: {str(e).splitlines()[0]}): "
                                   f"{self.hint}") from None


SCHEME = GcsScheme()
