"""The audit at export: every row checked (fleet.audit) before it is written.

A row that fails is a defect: it is left out, named with its job and chunk, and counted, so a
training set never carries a record whose text, counts or ending its ids contradict. A row that
cannot be checked (its manifest sets no limits) is written, named and counted: nothing says it is
wrong, nothing says it is right. Either makes the CLI exit non-zero unless the user asked for a
partial export (`--allow-defects`). Rows a merged export takes from a redo job are checked against that job's
manifest (its max tokens, its engine's decoding). A result that cannot be read at all is named too,
its records counted as not checked.
"""

from __future__ import annotations

from pydantic import ValidationError

from fleet.audit.job import AuditCounts, JobAudit
from fleet.errors import ChunkCorrupt
from fleet.export.formats import ExportRow, LeftOut
from fleet.store import Store
from fleet.store.manifest import Manifest, require_manifest
from fleet.store.results import ChunkStats, read_result

#: why a row is left out (LeftOut's reason)
FAILED = "failed the audit (named above)"


class ExportAudit:
    """Audits an export's rows chunk by chunk; the counts and named defects are what the CLI prints."""

    def __init__(self, store: Store, manifest: Manifest, counts: AuditCounts):
        self.store, self.job = store, manifest.job
        self.audits = {manifest.job: JobAudit(manifest)}
        self.counts = counts

    @property
    def needs_inputs(self) -> bool:
        """The records' own sampling (max tokens, stop strings) and prompts are what a row is checked against."""
        return self.audits[self.job].possible

    def of_job(self, job: str) -> JobAudit:
        if job not in self.audits:
            self.audits[job] = JobAudit(require_manifest(self.store, job))
        return self.audits[job]

    def result(self, index: int, records: int) -> tuple[ChunkStats | None, list] | None:
        """Chunk `index`'s result, or None (its `records` records counted as not checked, named) when it
        cannot be read: a result that does not decode, or whose header is not a result header."""
        try:
            return read_result(self.store, self.job, index)
        except (ChunkCorrupt, ValidationError) as e:
            what = str(e) if isinstance(e, ChunkCorrupt) else f"its header is not a result header: {e.errors()[0]}"
            self.counts.unchecked += records
            self.counts.name(f"job {self.job!r} chunk {index}: its {records} record(s) not checked: {what}")
            return None

    def keep(self, rows: list[tuple[ExportRow, str | None]], stats: ChunkStats | None,
             left_out: LeftOut, inputs: bool) -> list[ExportRow]:
        """The rows that pass or cannot be checked; each row with the job it came from (None: the exported job).
        `inputs`: the chunk's input records were read, so a row without one is a defect."""
        context = stats.context if stats is not None else None
        kept = []
        for row, job in rows:
            audit = self.of_job(job or self.job)
            verdict = audit.verdict(row.out, row.record, context, inputs)
            self.counts.count(audit.named(row.out), verdict)
            if verdict.problems:
                left_out.add(FAILED)
            else:
                kept.append(row)
        return kept
