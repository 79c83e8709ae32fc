"""Write a job's results in input order in one of the formats of fleet.export.formats,
streaming chunk by chunk to a target of fleet.export.target (a local path, `-` or an s3:// URL)."""

from __future__ import annotations

from pathlib import Path

from fleet.coord.chunkstate import done_indexes
from fleet.errors import FleetError
from fleet.export.check import ExportCheck
from fleet.export.formats import FORMATS, VOLATILE_FIELDS, ExportRow, LeftOut
from fleet.export.merge import Merge, RedoRows, redo_manifests
from fleet.export.target import target
from fleet.progress import Progress
from fleet.store import Store
from fleet.store.layout import read_chunk
from fleet.store.manifest import Manifest, require_manifest
from fleet.store.results import finished, read_result

__all__ = ["VOLATILE_FIELDS", "export_job"]


def chunk_rows(
    store: Store, job: str, index: int, inputs: bool, only_finished: bool, check: ExportCheck,
    merge: Merge | None = None,
) -> list[ExportRow]:
    """One chunk's samples in input order (each the version `merge` picks among the job and its
    redo jobs), each with its input record when `inputs`; every row passes `check` before any
    filter, so the manifest's counts hold for every format."""
    rows = read_result(store, job, index)[1]
    rows = list(check.rows(map(merge.pick, rows) if merge else rows))
    if only_finished:
        rows = [r for r in rows if finished(r)]
    if not inputs:
        return [ExportRow(r) for r in rows]
    records = {rec.pos: rec for rec in read_chunk(store, job, index)}
    return [ExportRow(r, records[r["pos"]]) for r in rows]


def done_chunks(store: Store, manifest: Manifest, allow_incomplete: bool) -> list[int]:
    """The job's chunks with a result; an unfinished job is refused unless `allow_incomplete`."""
    done = done_indexes(store, manifest.job)
    missing = [i for i in range(manifest.chunks) if i not in done]
    if missing and not allow_incomplete:
        head = ", ".join(map(str, missing[:10]))
        raise FleetError(
            f"job {manifest.job!r} has {len(missing)} of {manifest.chunks} chunks without a result "
            f"(first: {head}); wait for them, or pass --allow-incomplete"
        )
    return [i for i in range(manifest.chunks) if i in done]


def export_job(
    store: Store, job: str, out: Path | str, fmt: str | None = None, allow_incomplete: bool = False,
    stable: bool = False, only_finished: bool = False, left_out: LeftOut | None = None,
    progress: Progress | None = None, redo_jobs: list[str] | None = None,
) -> int:
    """Returns the number of lines written; refuses an unfinished job unless `allow_incomplete`.

    `stable` leaves out the volatile run facts, so two runs of one job export the same bytes;
    `only_finished` keeps only samples that stopped on their own with an answer (not at max
    tokens, not inside the thinking, not failed); rows a format cannot hold are counted in `left_out`.
    `redo_jobs` (redo jobs of `job`, fleet.export.merge) give each row the version that finished.
    """
    manifest = require_manifest(store, job)
    indexes = done_chunks(store, manifest, allow_incomplete)
    redos = redo_manifests(store, [job, *(redo_jobs or [])])
    merge = Merge([RedoRows(store, m.job, done_chunks(store, m, allow_incomplete)) for m in redos]) if redos else None
    fmt = fmt or ("parquet" if str(out).endswith(".parquet") else "jsonl")
    if fmt not in FORMATS:
        raise FleetError(f"unknown export format {fmt!r}: use one of {', '.join(FORMATS)}")
    writer_cls = FORMATS[fmt]
    count = 0
    check = ExportCheck(manifest, indexes)
    total = check.expect_samples  # one checked row per sample; unknown for an incomplete export
    report = progress or (lambda phase, done, total: None)
    report("export", 0, total)
    with target(out) as spot:
        # Only the writer's own calls go through spot.call: an OSError there is the target's
        # (a full disk), while one from reading the store stays the store's.
        writer = spot.call(writer_cls, spot.path, manifest, stable, left_out or LeftOut())
        try:
            for index in indexes:
                rows = chunk_rows(store, job, index, writer_cls.needs_inputs, only_finished, check, merge)
                count += spot.call(writer.write, rows)
                report("export", check.samples, total)
        finally:
            spot.call(writer.close)
        check.verify(out)  # raising here leaves `out` as it was
    report("export", check.samples, check.samples)
    return count
