"""Where the input comes from: a local file as is, or an S3 object downloaded for two passes
(any format: JSONL, Parquet)."""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote, urlparse

from fleet.errors import ConfigError, StoreError


@contextmanager
def local_input(
    url: str, *, s3_max_attempts: int = 10, tmp_dir: Path | None = None
) -> Iterator[Path]:
    """A local path for the input: a local file as is, an `s3://` object downloaded to a
    temporary file (streamed, removed on exit) in `tmp_dir`."""
    if url.startswith("s3://"):
        with _download(url, s3_max_attempts, tmp_dir) as path:
            yield path
        return
    if url.startswith("file://"):
        parsed = urlparse(url)
        url = unquote(parsed.netloc + parsed.path)
    elif "://" in url:
        raise ConfigError(f"input {url!r}: use a local path, file://... or s3://bucket/key")
    path = Path(url).expanduser()
    if not path.exists():
        raise ConfigError(f"input {str(path)!r} does not exist")
    if not path.is_file():
        raise ConfigError(f"input {str(path)!r} is not a file")
    yield path


@contextmanager
def _download(url: str, max_attempts: int, tmp_dir: Path | None) -> Iterator[Path]:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    parsed = urlparse(url)
    bucket, key = parsed.netloc, parsed.path.lstrip("/")
    if not bucket or not key or key.endswith("/"):
        raise ConfigError(f"input {url!r} names no object (s3://bucket/key)")
    config = Config(retries={"mode": "adaptive", "max_attempts": max_attempts})
    client = boto3.session.Session().client("s3", config=config)
    # The key's extension stays on the copy: it picks the input's format (fleet/producer/formats/).
    suffix = Path(key).suffix if re.fullmatch(r"\.\w{1,16}", Path(key).suffix) else ""
    fd, name = tempfile.mkstemp(prefix="fleet-input-", suffix=suffix, dir=tmp_dir)
    try:
        try:
            with os.fdopen(fd, "wb") as f:
                client.download_fileobj(bucket, key, f)
        except ClientError as e:
            code = str(e.response.get("Error", {}).get("Code", ""))
            if code in {"404", "NoSuchKey", "NoSuchBucket", "NotFound"}:
                raise ConfigError(f"input {url!r} does not exist") from e
            if code in {"403", "AccessDenied"}:
                raise ConfigError(f"input {url!r}: access denied") from e
            raise StoreError(f"cannot read input {url!r}: {code} {e}") from e
        except NoCredentialsError as e:
            raise ConfigError(f"input {url!r}: no AWS credentials found ({e})") from e
        except BotoCoreError as e:
            raise StoreError(f"cannot read input {url!r} after retries: {e}") from e
        yield Path(name)
    finally:
        Path(name).unlink(missing_ok=True)
