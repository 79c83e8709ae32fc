"""Store layout (docs/architecture.md) and the codec of chunk and result objects.

<job>/claim.json (written once, before any chunk), <job>/manifest.json, <job>/options.json (the job's
options, outside its identity), <job>/chunks/<index>,
<job>/results/<index> (written once), <job>/partial/<index>/<seq>-<worker> (checkpoints),
<job>/failed/<index>.json, <job>/redos/<redo job> (a redo job of this one names itself here).
Indexes are zero-padded to six digits. Chunks, results and
checkpoints are zstd-compressed JSON lines.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

import zstandard
from pydantic import ValidationError

from fleet.errors import ChunkCorrupt, ConfigError
from fleet.records import InputRecord
from fleet.store import Store

INDEX_WIDTH = 6
_ZSTD_LEVEL = 3


def idx(index: int) -> str:
    return f"{index:0{INDEX_WIDTH}d}"


#: A job's name is its folder in the store and a part of its broker keys: letters, digits and
#: `._-`, not starting with a dot or a dash (no `..`, no `/`, no hidden or option-like folder).
JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_job_name(job: str) -> str:
    if not JOB_NAME.fullmatch(job):
        raise ConfigError(f"job name {job!r}: use letters, digits and ._- (up to 128, the first a letter or "
                          "digit)")
    return job


def manifest_key(job: str) -> str:
    return f"{job}/manifest.json"


def options_key(job: str) -> str:
    """What a job may change without becoming another job (fleet.store.options): beside the
    manifest, outside its hash."""
    return f"{job}/options.json"


def claim_key(job: str) -> str:
    return f"{job}/claim.json"


def redos_prefix(job: str) -> str:
    """Where the redo jobs of `job` name themselves (fleet.producer.redo): `fleet status` finds them
    in the store, the source of truth, without a scan of every job."""
    return f"{job}/redos/"


def redo_key(job: str, redo: str) -> str:
    return f"{redos_prefix(job)}{redo}"


def chunk_key(job: str, index: int) -> str:
    return f"{job}/chunks/{idx(index)}"


def results_prefix(job: str) -> str:
    return f"{job}/results/"


def result_key(job: str, index: int) -> str:
    return f"{job}/results/{idx(index)}"


def checkpoints_prefix(job: str) -> str:
    """Checkpoints live under `partial/`, the prefix's name since the first stores: renaming
    it would orphan the checkpoints of jobs running across an upgrade."""
    return f"{job}/partial/"


def checkpoint_prefix(job: str, index: int) -> str:
    return f"{checkpoints_prefix(job)}{idx(index)}/"


def checkpoint_key(job: str, index: int, seq: int, worker: str) -> str:
    safe = worker.replace("/", "_").replace("@", "_at_")
    return f"{checkpoint_prefix(job, index)}{seq:06d}-{safe}"


def failed_prefix(job: str) -> str:
    return f"{job}/failed/"


def failed_key(job: str, index: int) -> str:
    return f"{job}/failed/{idx(index)}.json"


def index_of(key: str) -> int:
    """The chunk index from a results/ or failed/ key."""
    name = key.rsplit("/", 1)[-1]
    return int(name.split(".", 1)[0])


def encode_lines(rows: Iterable[dict[str, Any]]) -> bytes:
    body = "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in rows)
    return zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress(body.encode())


def decode_lines(data: bytes, what: str) -> Iterator[dict[str, Any]]:
    try:
        stream = zstandard.ZstdDecompressor().decompressobj()
        text = stream.decompress(data).decode()
        if not stream.eof:  # a cut object decodes to fewer rows without complaint
            raise ChunkCorrupt(f"{what} is truncated")
        rows = [json.loads(line) for line in text.splitlines() if line]
    except (zstandard.ZstdError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ChunkCorrupt(f"{what} cannot be decoded: {e}") from e
    yield from rows


def read_chunk(store: Store, job: str, index: int) -> list[InputRecord]:
    """A chunk's input records, in input order; ChunkCorrupt when they cannot be read back."""
    key = chunk_key(job, index)
    rows = decode_lines(store.get(key), key)
    try:
        return [InputRecord.model_validate(row) for row in rows]
    except ValidationError as e:
        raise ChunkCorrupt(f"{key} holds an invalid record: {e}") from e
