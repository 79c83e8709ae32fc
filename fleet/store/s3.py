"""s3:// (docs/architecture.md, Objects): a store under an S3 prefix, and `client`, the one place
a boto3 client is built (the store, an s3:// input, an s3:// export and preflight use it).
Retries are botocore's own (adaptive mode, a setting).

Endpoint and credentials follow boto3's chain, so AWS_ENDPOINT_URL points it at any
S3-compatible server. Exactly-once commits use conditional writes (If-None-Match: *).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from fleet.errors import ObjectMissing, StoreError, StoreUnreachable
from fleet.redact import redact_url
from fleet.store.base import Store
from fleet.store.schemes import BucketScheme, StoreOptions

_CONFLICT = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}
_MISSING = {"NoSuchKey", "404", "NotFound"}
PART_SIZE = 16 * 1024 * 1024
#: keys per DeleteObjects request, S3's limit
DELETE_BATCH = 1000


def _code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def client(max_attempts: int = 10, mode: str = "adaptive", timeout_s: float | None = None) -> Any:
    """A boto3 S3 client with botocore's retries (`mode`, `max_attempts`); `timeout_s` bounds
    connecting and each read (a ping's few seconds), else 10 s and 60 s."""
    config = Config(
        retries={"mode": mode, "max_attempts": max_attempts},
        connect_timeout=timeout_s or 10,
        read_timeout=timeout_s or 60,
        tcp_keepalive=True,
    )
    return boto3.session.Session().client("s3", config=config)


class S3Store(Store):
    def __init__(self, url: str, max_attempts: int = 10, multipart_threshold_mb: int = 64):
        parsed = urlparse(url)
        self.bucket = parsed.netloc
        self.prefix = parsed.path.strip("/")
        self.url = url
        self.multipart_threshold = multipart_threshold_mb * 1024 * 1024
        self.client = client(max_attempts)

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(self, what: str, key: str, fn, **kwargs):
        try:
            return fn(Bucket=self.bucket, **kwargs)
        except ClientError as e:
            if _code(e) in _MISSING:
                raise ObjectMissing(f"no object {key!r} in {self.url}") from e
            raise StoreError(f"S3 {what} {key!r} failed: {_code(e)} {e}") from e
        except BotoCoreError as e:
            raise StoreError(f"S3 {what} {key!r} failed after retries: {e}") from e

    def put(self, key: str, data: bytes) -> None:
        if len(data) > self.multipart_threshold:
            self._multipart(key, data, conditional=False)
        else:
            self._call("put", key, self.client.put_object, Key=self._key(key), Body=data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        try:
            if len(data) > self.multipart_threshold:
                self._multipart(key, data, conditional=True)
            else:
                self.client.put_object(
                    Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*"
                )
            return True
        except ClientError as e:
            if _code(e) in _CONFLICT:
                return False
            raise StoreError(f"S3 conditional put {key!r} failed: {_code(e)} {e}") from e
        except BotoCoreError as e:
            raise StoreError(f"S3 conditional put {key!r} failed after retries: {e}") from e

    def _multipart(self, key: str, data: bytes, conditional: bool) -> None:
        full = self._key(key)
        upload = self.client.create_multipart_upload(Bucket=self.bucket, Key=full)
        uid = upload["UploadId"]
        try:
            parts = []
            buf = io.BytesIO(data)
            number = 1
            while chunk := buf.read(PART_SIZE):
                r = self.client.upload_part(
                    Bucket=self.bucket, Key=full, UploadId=uid, PartNumber=number, Body=chunk
                )
                parts.append({"ETag": r["ETag"], "PartNumber": number})
                number += 1
            extra = {"IfNoneMatch": "*"} if conditional else {}
            self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=full, UploadId=uid,
                MultipartUpload={"Parts": parts}, **extra,
            )
        except Exception:
            with contextlib.suppress(ClientError, BotoCoreError):
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=uid)
            raise

    def get(self, key: str) -> bytes:
        r = self._call("get", key, self.client.get_object, Key=self._key(key))
        try:
            return r["Body"].read()
        except BotoCoreError as e:
            raise StoreError(f"S3 get {key!r} failed while reading: {e}") from e

    def exists(self, key: str) -> bool:
        try:
            self._call("head", key, self.client.head_object, Key=self._key(key))
            return True
        except ObjectMissing:
            return False

    def list(self, prefix: str) -> Iterator[str]:
        paginator = self.client.get_paginator("list_objects_v2")
        strip = len(self.prefix) + 1 if self.prefix else 0
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix)):
                for obj in page.get("Contents", []):
                    yield obj["Key"][strip:]
        except (ClientError, BotoCoreError) as e:
            raise StoreError(f"S3 list {prefix!r} failed: {e}") from e

    def delete(self, key: str) -> None:
        self._call("delete", key, self.client.delete_object, Key=self._key(key))

    def delete_many(self, keys: Iterable[str]) -> None:
        """DeleteObjects, DELETE_BATCH keys a request (quiet: only failures come back)."""
        todo = list(keys)
        for start in range(0, len(todo), DELETE_BATCH):
            batch = todo[start:start + DELETE_BATCH]
            objects = {"Objects": [{"Key": self._key(k)} for k in batch], "Quiet": True}
            got = self._call("delete of", f"{len(batch)} keys from {batch[0]}", self.client.delete_objects,
                             Delete=objects)
            errors = got.get("Errors") or []
            if errors:
                first = errors[0]
                raise StoreError(f"S3 delete of {len(errors)} of {len(batch)} keys failed, first "
                                 f"{first.get('Key')!r}: {first.get('Code')} {first.get('Message')}")

    def download(self, key: str, dest: Path) -> None:
        """boto3's managed download: ranged GETs streamed to `dest`, memory flat in the object's size."""
        self._call("download", key, self.client.download_file, Key=self._key(key), Filename=str(dest))

    def upload(self, src: Path, key: str) -> None:
        """boto3's managed (multipart, streamed) upload: the object appears whole or not at all."""
        from boto3.exceptions import S3UploadFailedError

        try:
            self.client.upload_file(str(src), self.bucket, self._key(key))
        except (S3UploadFailedError, ClientError, BotoCoreError) as e:
            raise StoreError(f"S3 upload {key!r} failed: {e}") from e

    def version(self, key: str) -> str:
        r = self._call("head", key, self.client.head_object, Key=self._key(key))
        return f"{r['ETag']}-{r['LastModified'].isoformat()}"


class S3Scheme(BucketScheme):
    name = "s3"
    form = "s3://bucket/key"
    hint = ("check FLEET_STORE_URL, AWS_ENDPOINT_URL (or the AWS_* credentials and region) and the network to "
            "the endpoint")

    def lost_errors(self) -> tuple[type[BaseException], ...]:
        return (BotoCoreError,)

    def open(self, url: str, options: StoreOptions) -> Store:
        return S3Store(url, options.max_attempts, options.multipart_threshold_mb)

    def bucket_exists(self, store: Store) -> bool | None:
        assert isinstance(store, S3Store)
        try:
            store.client.head_bucket(Bucket=store.bucket)
        except ClientError as e:
            # 403: a writer may lack ListBucket; the upload decides
            return False if _code(e) in {"404", "NoSuchBucket", "NotFound"} else None
        except BotoCoreError as e:
            raise StoreError(str(e)) from e
        return True

    def ping(self, store: Store, timeout_s: float) -> None:
        """One HeadBucket with a single retry (the store's own client retries for minutes)."""
        assert isinstance(store, S3Store)
        quick = client(2, "standard", timeout_s)
        where = f"{redact_url(store.url)} (endpoint {redact_url(quick.meta.endpoint_url)})"
        try:
            quick.head_bucket(Bucket=store.bucket)
        except ClientError as e:
            code = _code(e)
            what = {"404": "no such bucket", "NoSuchBucket": "no such bucket", "403": "access denied"}.get(code, code)
            raise StoreUnreachable(
                f"store {where} answered {what} ({type(e).__name__}: {str(e).splitlines()[0]}): "
                "check the bucket name and the credentials"
            ) from None
        except BotoCoreError as e:
            raise StoreUnreachable(f"cannot reach the store at {where} ({type(e).__name__}: {e}): "
                                   f"{self.hint}") from None
        finally:
            quick.close()


SCHEME = S3Scheme()
