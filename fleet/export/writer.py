"""Write a job's results in input order in one of the formats of fleet.export.formats,
streaming chunk by chunk to a target of fleet.export.target (a local path, `-` or a remote URL)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleet.audit.job import AuditCounts
from fleet.coord.chunkstate import done_indexes
from fleet.errors import FleetError
from fleet.export.audit import ExportAudit
from fleet.export.card import card
from fleet.export.check import ExportCheck, chunk_records
from fleet.export.formats import FORMATS, VOLATILE_FIELDS, ExportRow, LeftOut
from fleet.export.merge import Merge, RedoRows, redo_manifests
from fleet.export.target import folder_target, target
from fleet.monitor.status import job_status
from fleet.progress import Progress
from fleet.store import Store
from fleet.store.layout import read_chunk
from fleet.store.manifest import Manifest, require_manifest
from fleet.store.results import finished
from fleet.store.schemes import default_format

__all__ = ["VOLATILE_FIELDS", "export_job"]

#: rows `--only-finished` leaves out (LeftOut's reason): the user's filter, not a defect
NOT_FINISHED = "not finished (--only-finished: cut at max tokens, ended inside the thinking, loops, errors)"


def chunk_rows(
    store: Store, job: str, index: int, inputs: bool, only_finished: bool, check: ExportCheck, audit: ExportAudit,
    left_out: LeftOut, merge: Merge | None = None,
) -> list[ExportRow]:
    """One chunk's samples in input order (each the version `merge` picks among the job and its
    redo jobs), each with its input record where the format or the audit reads it; every row passes
    `check` before any filter, so the manifest's counts hold for every format, then the audit
    (fleet.export.audit), which leaves out and names a defect, and last `only_finished`, the user's filter."""
    result = audit.result(index, chunk_records(check.manifest, index))
    if result is None:
        check.unreadable(index)
        return []
    stats, rows = result
    picked = [(merge.pick(r), merge.picked_from) if merge and mergeable(r) else (r, None) for r in rows]
    checked = list(zip(check.rows(r for r, _ in picked), (j for _, j in picked), strict=True))
    read = inputs or audit.needs_inputs
    records = {rec.pos: rec for rec in read_chunk(store, job, index)} if read else {}
    kept = audit.keep([(ExportRow(r, records.get(position(r))), j) for r, j in checked], stats, left_out, read)
    if only_finished:
        for row in kept:
            if not finished(row.out):
                left_out.add(NOT_FINISHED)
        kept = [row for row in kept if finished(row.out)]
    return kept


def position(row: Any) -> int | None:
    """A row's input position, None for a row too broken to hold one (the audit names it)."""
    pos = row.get("pos") if isinstance(row, dict) else None
    return pos if isinstance(pos, int) else None


def mergeable(row: Any) -> bool:
    """A row a redo job's version can be matched to (the audit names one that is not)."""
    return position(row) is not None and isinstance(row.get("sample", 0), int) and "id" in row


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
    progress: Progress | None = None, redo_jobs: list[str] | None = None, audited: AuditCounts | None = None,
    max_attempts: int = 10,
) -> int:
    """Returns the number of lines written; refuses an unfinished job unless `allow_incomplete`.

    `stable` leaves out the volatile run facts, so two runs of one job export the same bytes;
    `only_finished` keeps only samples that stopped on their own with an answer (not at max
    tokens, not inside the thinking, not failed); rows a format cannot hold are counted in `left_out`.
    `redo_jobs` (redo jobs of `job`, fleet.export.merge) give each row the version that finished.
    Every row is audited first (fleet.export.audit); a row that fails or cannot be checked is left out,
    and `audited` gets the counts and the named defects: the caller decides what they mean for its exit.
    A folder format (hf) writes its folder and its dataset card; a remote target's client tries each
    call up to `max_attempts` times (settings.store_client.max_attempts).
    """
    manifest = require_manifest(store, job)
    indexes = done_chunks(store, manifest, allow_incomplete)
    redos = redo_manifests(store, [job, *(redo_jobs or [])])
    merge = Merge([RedoRows(store, m.job, done_chunks(store, m, allow_incomplete)) for m in redos]) if redos else None
    fmt = fmt or default_format(str(out)) or ("parquet" if str(out).endswith(".parquet") else "jsonl")
    if fmt not in FORMATS:
        raise FleetError(f"unknown export format {fmt!r}: use one of {', '.join(FORMATS)}")
    writer_cls = FORMATS[fmt]
    count = 0
    left_out = left_out or LeftOut()
    check = ExportCheck(manifest, indexes)
    audit = ExportAudit(store, manifest, audited if audited is not None else AuditCounts())
    total = check.expect_samples  # one checked row per sample; unknown for an incomplete export
    report = progress or (lambda phase, done, total: None)
    report("export", 0, total)
    spots = folder_target(out, max_attempts) if writer_cls.folder else target(out, max_attempts)
    with spots as spot:
        # Only the writer's own calls go through spot.call: an OSError there is the target's
        # (a full disk), while one from reading the store stays the store's.
        writer = spot.call(writer_cls, spot.path, manifest, stable, left_out)
        try:
            for index in indexes:
                rows = chunk_rows(store, job, index, writer_cls.needs_inputs, only_finished, check, audit, left_out,
                                  merge)
                count += spot.call(writer.write, rows)
                report("export", check.samples, total)
        finally:
            spot.call(writer.close)
        check.verify(out)  # raising here leaves `out` as it was
        if writer_cls.folder:
            text = card(manifest, job_status(store, None, job, manifest=manifest), count, only_finished)
            spot.call((spot.path / "README.md").write_text, text, "utf-8")
    report("export", check.samples, check.samples)
    return count
