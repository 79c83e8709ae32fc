"""What every export format shares: the row it is handed, the writer protocol, and the
target (a local path, or an s3:// URL uploaded from a local spool file).

Every format streams: the exporter hands a writer one chunk's rows at a time, in input
order, so memory is bounded by a chunk whatever the job's size.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlparse

from fleet.errors import ConfigError, StoreError
from fleet.export.check import unique_temp
from fleet.records import InputRecord
from fleet.store.manifest import Manifest


@dataclass
class ExportRow:
    """One output sample with the input record it answers (when the format reads inputs)."""

    out: dict[str, Any]
    record: InputRecord | None = None


@dataclass
class LeftOut:
    """Rows a format cannot represent, counted by reason, so the CLI can say what was left out."""

    reasons: dict[str, int] = field(default_factory=dict)

    def add(self, reason: str) -> None:
        self.reasons[reason] = self.reasons.get(reason, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.reasons.values())


class Writer:
    """A format: `write` gets each chunk's rows in input order and returns how many lines it wrote."""

    #: whether rows need their input record (messages, input ids) from the chunk objects
    needs_inputs: ClassVar[bool] = False

    def __init__(self, path: Path, manifest: Manifest, stable: bool, left_out: LeftOut):
        self.path, self.manifest, self.stable, self.left_out = path, manifest, stable, left_out

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def write(self, rows: list[ExportRow]) -> int:
        raise NotImplementedError

    def close(self) -> None:
        """Flush and close the output file."""


class JsonLinesWriter(Writer):
    """A format of one JSON object per line; `line` maps a row to its object, or None to leave it out."""

    #: json.dumps separators; token rows are compact, text rows keep the readable default
    separators: ClassVar[tuple[str, str] | None] = None
    #: training formats have nothing to train on in a failed record: left out and counted
    skip_errors: ClassVar[bool] = False

    def __init__(self, path: Path, manifest: Manifest, stable: bool, left_out: LeftOut):
        super().__init__(path, manifest, stable, left_out)
        self.file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def line(self, row: ExportRow) -> dict[str, Any] | None:
        raise NotImplementedError

    def write(self, rows: list[ExportRow]) -> int:
        written = 0
        for row in rows:
            if self.skip_errors and row.out["finish_reason"] == "error":
                self.left_out.add("error records")
                continue
            obj = self.line(row)
            if obj is not None:
                self.put(obj)
                written += 1
        return written

    def put(self, obj: dict[str, Any]) -> None:
        self.file.write(json.dumps(obj, ensure_ascii=False, separators=self.separators) + "\n")

    def close(self) -> None:
        self.file.close()


def with_sample_and_extra(out: dict[str, Any], line: dict[str, Any]) -> dict[str, Any]:
    """A training row's tail: the sample number past the first, and the input's passthrough
    fields; the format's own fields win (an input field named loss_mask must not replace it)."""
    if out.get("sample"):
        line["sample"] = out["sample"]
    return {**(out.get("extra") or {}), **line}


@contextmanager
def target(out: str | Path, max_attempts: int = 10) -> Iterator[Path]:
    """A local path to write; it becomes `out` only when the block succeeds.

    Local: a temporary file beside `out`, renamed over it (readers never see half a file).
    s3://: a spool file uploaded with boto3's managed (multipart, streamed) upload, so
    memory stays constant; the object appears whole or not at all.
    """
    text = str(out)
    if text.startswith("s3://"):
        with _spool() as path:
            yield path
            _upload(path, text, max_attempts)
        return
    local = Path(text.removeprefix("file://")).expanduser()
    local.parent.mkdir(parents=True, exist_ok=True)
    tmp = unique_temp(local)
    try:
        yield tmp
        tmp.replace(local)
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def _spool() -> Iterator[Path]:
    fd, name = tempfile.mkstemp(prefix="fleet-export-")
    os.close(fd)
    try:
        yield Path(name)
    finally:
        Path(name).unlink(missing_ok=True)


def _upload(path: Path, url: str, max_attempts: int) -> None:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    parsed = urlparse(url)
    bucket, key = parsed.netloc, parsed.path.lstrip("/")
    if not bucket or not key or key.endswith("/"):
        raise ConfigError(f"export target {url!r} names no object (s3://bucket/key)")
    client = boto3.session.Session().client(
        "s3", config=Config(retries={"mode": "adaptive", "max_attempts": max_attempts})
    )
    try:
        client.upload_file(str(path), bucket, key)
    except (BotoCoreError, ClientError) as e:
        raise StoreError(f"cannot upload the export to {url!r}: {e}") from e
