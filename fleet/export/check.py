"""An export is checked against the job's manifest before it replaces the output file.

A store holding chunks of two configurations (or two copies of a record) once exported
60 records of a 40-record job and said success; now the count, id uniqueness and input
order are verified while streaming, and a wrong file is never renamed into place.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from fleet.errors import ExportMismatch
from fleet.producer.seen import SeenIds
from fleet.store.manifest import Manifest

MAX_SHOWN = 5


def chunk_records(manifest: Manifest, index: int) -> int:
    """Records chunk `index` holds: chunk_size, less for the last one."""
    return max(0, min(manifest.chunk_size, manifest.records - index * manifest.chunk_size))


class ExportCheck:
    """Counts and checks the rows of one export of `indexes` (all chunks unless incomplete)."""

    def __init__(self, manifest: Manifest, indexes: list[int]):
        self.job, self.manifest = manifest.job, manifest
        self.expect_records = sum(chunk_records(manifest, i) for i in indexes)
        #: exact for a full export; per-record n makes an incomplete one's unknown
        self.expect_samples = manifest.samples if len(indexes) == manifest.chunks else None
        self.records = self.samples = 0
        self.last_pos = -1
        self.ids = SeenIds()
        self.problems: list[str] = []
        self.problem_count = 0

    def rows(self, rows: Iterable[Any]) -> Iterator[Any]:
        """`rows` unchanged, checked on the way through; `commit` reports what is wrong. A malformed row
        (the audit names it) counts as its record's first sample unless it says otherwise."""
        for row in rows:
            self.samples += 1
            sample = row.get("sample", 0) if isinstance(row, dict) else 0
            if not isinstance(sample, int) or sample == 0:
                self._record(row if isinstance(row, dict) else {})
            yield row

    def _record(self, row: dict[str, Any]) -> None:
        self.records += 1
        if self.ids.add(str(row.get("id")), self.records) is not None:
            self._problem(f"record id {row.get('id')!r} appears twice")
        pos = row.get("pos")
        pos = pos if isinstance(pos, int) else self.last_pos + 1
        if pos <= self.last_pos:
            self._problem(f"record {row.get('id')!r} (input record {pos}) is out of input order")
        self.last_pos = max(pos, self.last_pos)

    def unreadable(self, index: int) -> None:
        """Chunk `index`'s result cannot be read (the audit names it): its records are not expected."""
        self.expect_records -= chunk_records(self.manifest, index)
        self.expect_samples = None

    def _problem(self, text: str) -> None:
        self.problem_count += 1
        if len(self.problems) < MAX_SHOWN:
            self.problems.append(text)

    def verify(self, out: Path | str) -> None:
        """Raise ExportMismatch unless the rows seen match the manifest; the caller then
        discards its temp file, so `out` is never replaced by a wrong export."""
        wrong = list(self.problems)
        if self.problem_count > len(self.problems):
            wrong.append(f"and {self.problem_count - len(self.problems)} more")
        if self.records != self.expect_records:
            wrong.append(f"{self.records} records, the manifest says {self.expect_records}")
        if self.expect_samples is not None and self.samples != self.expect_samples:
            wrong.append(f"{self.samples} samples, the manifest says {self.expect_samples}")
        if wrong:
            raise ExportMismatch(
                f"job {self.job!r}: the results hold {'; '.join(wrong)}; {out} was not written. "
                "The store's results do not belong to this manifest: re-run the job under a new --job name"
            )
