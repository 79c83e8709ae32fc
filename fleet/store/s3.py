"""A store under an S3 prefix. Retries are botocore's own (adaptive mode, a setting).

Endpoint and credentials follow boto3's chain, so AWS_ENDPOINT_URL points it at any
S3-compatible server. Exactly-once commits use conditional writes (If-None-Match: *).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from urllib.parse import urlparse

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from fleet.errors import ObjectMissing, StoreError
from fleet.store.base import Store

_CONFLICT = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}
_MISSING = {"NoSuchKey", "404", "NotFound"}
PART_SIZE = 16 * 1024 * 1024


def _code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


class S3Store(Store):
    def __init__(self, url: str, max_attempts: int = 10, multipart_threshold_mb: int = 64):
        parsed = urlparse(url)
        self.bucket = parsed.netloc
        self.prefix = parsed.path.strip("/")
        self.url = url
        self.multipart_threshold = multipart_threshold_mb * 1024 * 1024
        config = Config(
            retries={"mode": "adaptive", "max_attempts": max_attempts},
            connect_timeout=10,
            read_timeout=60,
            tcp_keepalive=True,
        )
        self.client = boto3.session.Session().client("s3", config=config)

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

    def version(self, key: str) -> str:
        r = self._call("head", key, self.client.head_object, Key=self._key(key))
        return f"{r['ETag']}-{r['LastModified'].isoformat()}"
