"""A job's audit: each of its records checked (fleet.audit.checks) with the limits it ran under, and
the counts and named defects the worker's commit, `fleet export` and `fleet verify` report."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fleet.audit.checks import Limits, Vocab, output_problems
from fleet.engines.specs import job_decoder
from fleet.model.endings import Decode
from fleet.model.repetition import RepetitionSettings
from fleet.records import InputRecord, record_sampling
from fleet.store.manifest import Manifest

#: named defects a report keeps (the counts cover them all)
MAX_NAMED = 20


@dataclass
class AuditCounts:
    """Samples checked, those that failed (each named, up to MAX_NAMED), those with no ids to check."""

    checked: int = 0
    failed: int = 0
    #: samples with nothing to check them against: stored without output ids (return_output_ids off),
    #: or of a job whose manifest records no sampling (its limits unknown)
    unchecked: int = 0
    defects: list[str] = field(default_factory=list)

    def add(self, other: AuditCounts) -> None:
        self.checked += other.checked
        self.failed += other.failed
        self.unchecked += other.unchecked
        self.defects += other.defects[: max(0, MAX_NAMED - len(self.defects))]

    def line(self) -> str:
        passed = self.checked - self.failed
        tail = f", {self.unchecked:,} not checked (no output ids, or no sampling in the manifest)" \
            if self.unchecked else ""
        return f"audit: {self.checked:,} samples checked against their ids, {passed:,} pass, {self.failed:,} fail{tail}"


class JobAudit:
    """Checks a job's rows: `decode` is the engine's own where the worker has it, else the job's
    (fleet.engines.specs.job_decoder); `context` is what the committing engine allowed."""

    def __init__(self, manifest: Manifest, decode: Decode | None = None):
        config = manifest.config
        self.defaults: dict[str, Any] = config.get("sampling") or {}
        self._decode = decode
        self.manifest = manifest
        self.eos = frozenset(self.defaults.get("eos_token_ids") or ())
        #: a manifest without sampling (a hand-made one) gives no limits to check against
        self.possible = "max_tokens" in self.defaults
        self.repetition = RepetitionSettings.of_job(config)

    def vocab(self) -> Vocab:
        if self._decode is None:  # loaded on first use: a job whose rows hold no ids needs no tokenizer
            self._decode = job_decoder(self.manifest)
        return Vocab(self._decode, self.eos, self.repetition)

    def limits(self, record: InputRecord | None, context: int | None) -> Limits:
        sampling = record_sampling(self.defaults, record, 0)
        return Limits(sampling.max_tokens, sampling.stop, context)

    def problems(self, row: dict[str, Any], record: InputRecord | None, context: int | None) -> list[str] | None:
        """What is wrong with one sample (each turn of a conversation checked alone); None when it holds
        no ids to check."""
        outputs = row.get("turns") or [row]
        if not self.possible or (row["finish_reason"] != "error" and any(o.get("output_ids") is None for o in outputs)):
            return None
        if row["finish_reason"] == "error" and row.get("output_ids") is None:
            return []
        limits, vocab = self.limits(record, context), self.vocab()
        found = []
        for o in outputs:
            where = f"turn {o['turn']}: " if "turn" in o and row.get("turns") else ""
            found += [where + p for p in output_problems(o, limits, vocab)]
        return found

    def check(self, rows: Iterable[dict[str, Any]], records: dict[int, InputRecord] | None,
              context: int | None) -> tuple[AuditCounts, set[tuple[str, int]]]:
        """Counts over `rows` (records by input position, where at hand) and the (id, sample) that failed."""
        counts, bad = AuditCounts(), set()
        for row in rows:
            found = self.problems(row, (records or {}).get(row.get("pos", -1)), context)
            if found is None:
                counts.unchecked += 1
                continue
            counts.checked += 1
            if found:
                counts.failed += 1
                bad.add((str(row["id"]), int(row.get("sample", 0))))
                if len(counts.defects) < MAX_NAMED:
                    counts.defects.append(f"chunk {row.get('chunk')} record {row['id']!r} sample "
                                          f"{row.get('sample', 0)}: {'; '.join(found)}")
        return counts, bad
