"""The input's digest: what makes two enqueues of one job name the same job.

It covers exactly the rows the chunk objects hold (fleet.producer.chunker.chunk_row), so
equal digests under one configuration mean byte-equal chunks: a second enqueue may
rewrite them safely, and a changed input is seen before anything is written.
"""

from __future__ import annotations

import hashlib
import json

from fleet.producer.chunker import chunk_row
from fleet.records import InputRecord

ALGORITHM = "blake2b-256"


class InputDigest:
    """Streaming: constant memory whatever the input's size."""

    def __init__(self) -> None:
        self._hash = hashlib.blake2b(digest_size=32)

    def update(self, record: InputRecord) -> None:
        row = json.dumps(chunk_row(record), ensure_ascii=False, separators=(",", ":"))
        self._hash.update(row.encode() + b"\n")

    def hexdigest(self) -> str:
        return f"{ALGORITHM}:{self._hash.hexdigest()}"
