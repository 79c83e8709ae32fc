"""The audit at export: every row checked against its own ids before it is written (fleet.audit).

A row that fails is a defect: it is left out, named with its chunk, and counted, so a training set
never carries a record whose text, counts or ending its ids contradict. Rows a merged export takes
from a redo job are checked against that job's manifest (its max tokens, its engine's decoding).
"""

from __future__ import annotations

from fleet.audit.job import AuditCounts, JobAudit
from fleet.export.formats import ExportRow, LeftOut
from fleet.store import Store
from fleet.store.manifest import Manifest, require_manifest
from fleet.store.results import ChunkStats

#: why a failed row is left out (LeftOut's reason)
FAILED = "failed the audit against its own ids (named above)"


class ExportAudit:
    """Audits an export's rows chunk by chunk; the counts and named defects are what the CLI prints."""

    def __init__(self, store: Store, manifest: Manifest, counts: AuditCounts):
        self.store, self.job = store, manifest.job
        self.audits = {manifest.job: JobAudit(manifest)}
        self.counts = counts

    @property
    def needs_inputs(self) -> bool:
        """The records' own sampling (max tokens, stop strings) is part of what a row is checked against."""
        return self.audits[self.job].possible

    def of_job(self, job: str) -> JobAudit:
        if job not in self.audits:
            self.audits[job] = JobAudit(require_manifest(self.store, job))
        return self.audits[job]

    def keep(self, rows: list[tuple[ExportRow, str | None]], stats: ChunkStats | None,
             left_out: LeftOut) -> list[ExportRow]:
        """The rows that pass; each row with the job it came from (None: the exported job itself)."""
        context = stats.context if stats is not None else None
        kept = []
        for row, job in rows:
            audit = self.of_job(job or self.job)
            counts, bad = audit.check([row.out], {row.record.pos: row.record} if row.record else None, context)
            self.counts.add(counts)
            if bad:
                left_out.add(FAILED)
            else:
                kept.append(row)
        return kept

