"""`fleet verify --job J`: the export's audit of every record, without writing anything."""

from __future__ import annotations

from fleet.audit.job import AuditCounts
from fleet.export.audit import ExportAudit
from fleet.export.check import ExportCheck
from fleet.export.formats import LeftOut
from fleet.export.writer import chunk_rows, done_chunks
from fleet.progress import Progress
from fleet.store import Store
from fleet.store.manifest import require_manifest


def verify_job(store: Store, job: str, audited: AuditCounts, allow_incomplete: bool = False,
               progress: Progress | None = None) -> None:
    """Audit every record of `job` (its done chunks with `allow_incomplete`) into `audited`."""
    manifest = require_manifest(store, job)
    indexes = done_chunks(store, manifest, allow_incomplete)
    check, audit = ExportCheck(manifest, indexes), ExportAudit(store, manifest, audited)
    report = progress or (lambda phase, done, total: None)
    for n, index in enumerate(indexes):
        chunk_rows(store, job, index, False, False, check, audit, LeftOut())
        report("verify", n + 1, len(indexes))
    check.verify("the audit")
