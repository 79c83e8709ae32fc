"""What the redo jobs of a job (fleet.producer.redo) have done for it: `fleet status --job J`.

Redo jobs are found in the store, where each names itself under J (`<J>/redos/<J2>`), and
the redos of those in turn; a name whose manifest is not written yet is no job yet. Their
results are read, not their headers: only a sample J left unfinished that a redo finished
counts (a record is redone whole when any of its samples did not finish).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fleet.coord.chunkstate import done_indexes
from fleet.store import Store
from fleet.store.layout import redos_prefix
from fleet.store.manifest import Manifest, load_manifest, require_manifest
from fleet.store.results import finished, iter_records


@dataclass
class RedoProgress:
    #: redo jobs of J (and of those), each "name": "done/total chunks"
    jobs: dict[str, str] = field(default_factory=dict)
    #: J's samples that did not finish and that a redo job has since finished
    finished: int = 0


def redo_jobs(store: Store, job: str) -> list[Manifest]:
    """The manifests of `job`'s redo jobs and of theirs, breadth first."""
    out: list[Manifest] = []
    todo, seen = [job], {job}
    while todo:
        parent = todo.pop(0)
        for key in sorted(store.list(redos_prefix(parent))):
            manifest = load_manifest(store, key.rsplit("/", 1)[-1])
            if manifest is not None and manifest.redo_of == parent and manifest.job not in seen:
                seen.add(manifest.job)
                out.append(manifest)
                todo.append(manifest.job)
    return out


def redo_progress(store: Store, job: str) -> RedoProgress | None:
    """None when `job` has no redo job (nothing is read then)."""
    redos = redo_jobs(store, job)
    if not redos:
        return None
    progress = RedoProgress()
    done_by_redo: set[tuple[int, int]] = set()
    for manifest in redos:
        done = sorted(done_indexes(store, manifest.job))
        progress.jobs[manifest.job] = f"{len(done)}/{manifest.chunks} chunks done"
        done_by_redo |= {(r["pos"], r["sample"]) for r in iter_records(store, manifest.job, done) if finished(r)}
    base = require_manifest(store, job)
    chunks = sorted({pos // base.chunk_size for pos, _ in done_by_redo} & done_indexes(store, job))
    progress.finished = sum(1 for r in iter_records(store, job, chunks)
                            if not finished(r) and (r["pos"], r["sample"]) in done_by_redo)
    return progress
