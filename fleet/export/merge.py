"""`fleet export --job J --job J2 ...`: J's rows with its redo jobs' versions merged in.

Each (id, sample) of J is written once, in J's input order, as the version of the job that
finished it; between two finished versions, and when none finished, the later job's (the
order of the --job flags). A redo job's records keep J's input positions
(fleet.producer.redo), so every job's rows come sorted by (pos, sample) and the merge is one
streaming pass that holds one chunk per job; J's manifest still sets the export's counts.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fleet.errors import ExportMismatch, FleetError
from fleet.store import Store
from fleet.store.manifest import Manifest, require_manifest
from fleet.store.results import finished, iter_records

Row = dict[str, Any]


def redo_manifests(store: Store, jobs: list[str]) -> list[Manifest]:
    """The manifests of `jobs` after the first, each a redo of the first or of one named before it."""
    if len(set(jobs)) != len(jobs):
        raise FleetError(f"--job names a job twice: {', '.join(jobs)}")
    out = []
    for job in jobs[1:]:
        manifest = require_manifest(store, job)
        if manifest.redo_of not in jobs[: jobs.index(job)]:
            what = f"a redo of {manifest.redo_of!r}" if manifest.redo_of else "not a redo job"
            raise FleetError(f"job {job!r} is {what}: each --job after the first must redo the first or one "
                             f"named before it (`fleet run --job {job} --redo {jobs[0]}`)")
        out.append(manifest)
    return out


class RedoRows:
    """One redo job's rows in (pos, sample) order, read a chunk at a time."""

    def __init__(self, store: Store, job: str, indexes: list[int]):
        self.job = job
        self._rows: Iterator[Row] = iter_records(store, job, indexes)
        self._head: Row | None = next(self._rows, None)

    def take(self, pos: int, sample: int) -> Row | None:
        """This job's row of (pos, sample), or None; rows before it are passed by."""
        while self._head is not None and (self._head["pos"], self._head["sample"]) < (pos, sample):
            self._head = next(self._rows, None)
        head = self._head
        return head if head is not None and (head["pos"], head["sample"]) == (pos, sample) else None


class Merge:
    """Picks each row's version among J and its redo jobs, in --job order."""

    def __init__(self, redos: list[RedoRows]):
        self.redos = redos
        self.picked_from: str | None = None

    def pick(self, row: Row) -> Row:
        """The version of `row` to export; `picked_from` names the job it came from (None: the first)."""
        best, self.picked_from = row, None
        for redo in self.redos:
            other = redo.take(row["pos"], row.get("sample", 0))
            if other is None:
                continue
            if other["id"] != row["id"]:
                raise ExportMismatch(f"job {redo.job!r} holds {other['id']!r} at input record {row['pos']} where "
                                     f"the job it redoes holds {row['id']!r}: it is not a redo of this job's input")
            if finished(other) or not finished(best):
                best, self.picked_from = other, redo.job
        return best
