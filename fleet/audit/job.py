"""A job's audit: each of its records held to everything its ids and the job's configuration fix
(fleet.audit.shape, .checks, .turns, .prompts) with the limits it ran under, and the counts and named
defects the worker's commit, `fleet export` and `fleet verify` report.

A record passes, fails (a defect, named: job, chunk, record id, sample, field, what is wrong) or cannot
be checked (a defect of its own kind: its job's manifest holds no sampling to check it against). A job
fleet made has no defect and nothing unchecked.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fleet.audit.checks import Limits, Vocab, count_problems, output_problems
from fleet.audit.prompts import PromptTokens, prompt_problems
from fleet.audit.shape import row_name, shape_problems
from fleet.audit.turns import turn_problems
from fleet.engines.specs import job_decoder, spec_for
from fleet.errors import FleetError
from fleet.model.endings import Decode
from fleet.model.repetition import RepetitionSettings
from fleet.records import InputRecord, record_sampling
from fleet.store.manifest import Manifest

#: named defects a report keeps (the counts cover them all)
MAX_NAMED = 20
#: why a record of a manifest without sampling cannot be checked
NO_SAMPLING = "not checked: the job's manifest holds no sampling.max_tokens (a manifest fleet did not write)"


@dataclass
class Verdict:
    """One record's audit: its defects ([]: it passes), or why it could not be checked."""

    problems: list[str] = field(default_factory=list)
    unchecked: str | None = None
    #: checked without output ids (its job keeps none): counts, endings and prompt only
    blind: bool = False

    @property
    def passed(self) -> bool:
        return not self.problems and self.unchecked is None


@dataclass
class AuditCounts:
    """Samples checked, those that failed and those that could not be checked (each named, up to
    MAX_NAMED), and those checked without ids."""

    checked: int = 0
    failed: int = 0
    #: samples with nothing to check them against (a manifest without sampling): a defect of their own
    unchecked: int = 0
    #: of the checked, those stored without output ids (return_output_ids off): checked without them
    blind: int = 0
    defects: list[str] = field(default_factory=list)

    def add(self, other: AuditCounts) -> None:
        self.checked += other.checked
        self.failed += other.failed
        self.unchecked += other.unchecked
        self.blind += other.blind
        self.defects += other.defects[: max(0, MAX_NAMED - len(self.defects))]

    def count(self, name: str, verdict: Verdict) -> None:
        """Count one record's verdict; `name` says which record it is."""
        if verdict.unchecked is not None:
            self.unchecked += 1
            self.name(f"{name}: {verdict.unchecked}")
            return
        self.checked += 1
        self.blind += verdict.blind
        if verdict.problems:
            self.failed += 1
            self.name(f"{name}: {'; '.join(verdict.problems)}")

    def name(self, defect: str) -> None:
        if len(self.defects) < MAX_NAMED:
            self.defects.append(defect)

    @property
    def bad(self) -> int:
        """Samples that failed or could not be checked: what `fleet verify` and `fleet export` fail on."""
        return self.failed + self.unchecked

    def line(self) -> str:
        passed = self.checked - self.failed
        blind = f" ({self.blind:,} without ids: the job keeps none)" if self.blind else ""
        tail = f", {self.unchecked:,} not checked" if self.unchecked else ""
        return f"audit: {self.checked:,} samples checked against their ids{blind}, {passed:,} pass, " \
               f"{self.failed:,} fail{tail}"


class JobAudit:
    """Checks a job's rows: `decode` is the engine's own where the worker has it, else the job's
    (fleet.engines.specs.job_decoder); `context` is what the committing engine allowed; `prompts`
    recounts each record's prompt tokens (verify and export; the commit's counts are its own rendering's)."""

    def __init__(self, manifest: Manifest, decode: Decode | None = None, prompts: bool = True):
        config = manifest.config
        self.job = manifest.job
        self.defaults: dict[str, Any] = config.get("sampling") or {}
        self._decode = decode
        self.manifest = manifest
        self.eos = frozenset(self.defaults.get("eos_token_ids") or ())
        #: a manifest without sampling (a hand-made one) gives no limits to check against
        self.possible = self.defaults.get("max_tokens") is not None
        self.repetition = RepetitionSettings.of_job(config)
        self.keeps_ids = bool(config.get("return_output_ids", False))
        self.every_turn = config.get("turns") == "all"
        self.prompts = PromptTokens(manifest) if prompts else None
        self._vocab: Vocab | None = None

    def vocab(self) -> Vocab:
        if self._vocab is None:  # loaded on first use: a job whose rows hold no ids needs no tokenizer
            decode = self._decode or job_decoder(self.manifest)
            ends_first = spec_for(self.manifest.config.get("engine", "")).ends_before_length
            self._vocab = Vocab(decode, self.eos, self.repetition, ends_first)
        return self._vocab

    def limits(self, record: InputRecord | None, context: int | None) -> Limits:
        sampling = record_sampling(self.defaults, record, 0)
        return Limits(sampling.max_tokens, sampling.stop, context)

    def verdict(self, row: Any, record: InputRecord | None, context: int | None, inputs: bool = True) -> Verdict:
        """One stored sample held to its ids, its input record (`inputs`: the chunk's records were read, so
        a row without one is a defect) and the job's configuration."""
        shape = shape_problems(row)
        if shape:
            return Verdict(shape)
        if not self.possible:
            return Verdict(unchecked=NO_SAMPLING)
        problems = []
        if record is None and inputs:
            problems.append(f"pos: {row['pos']} is no input record of chunk {row['chunk']}")
        elif record.id != row["id"]:
            problems.append(f"id: input record {row['pos']} of its chunk is {record.id!r}")
        problems += turn_problems(row, record, self.every_turn)
        turns = row.get("turns")
        outputs = [(t, turns[: t["turn"]]) for t in turns] if turns is not None else [(row, None)]
        if turns is not None and row["finish_reason"] == "error":
            outputs.append((row, None))
        limits, blind = self.limits(record, context), False
        for out, before in outputs:
            where = f"turn {out['turn']}: " if out is not row else ""
            found, without_ids = self.output(out, record, before, limits)
            problems += [where + p for p in found]
            blind = blind or without_ids
        return Verdict(problems, blind=blind)

    def output(self, out: dict[str, Any], record: InputRecord | None, before: list[dict[str, Any]] | None,
               limits: Limits) -> tuple[list[str], bool]:
        """One output's defects, and whether it was checked without its ids."""
        if out["finish_reason"] == "error":
            made = [n for n in ("completion_tokens", "prompt_tokens", "output_ids") if out[n]]
            return [f"{', '.join(made)}: an error row holds none"] if made else [], False
        problems, prompt = [], out["prompt_tokens"]
        if self.prompts is not None and record is not None:
            try:
                prompt = self.prompts.count(record, before)
            except FleetError as e:
                return [f"prompt_tokens: its prompt cannot be built again: {e}"], False
            problems += prompt_problems(out, prompt)
        if out["output_ids"] is None:
            if self.keeps_ids:
                return [*problems, "output_ids: missing, and the job keeps them (return_output_ids)"], False
            return problems + count_problems(out, limits, prompt), True
        return problems + output_problems(out, limits, self.vocab(), prompt), False

    def check(self, rows: Iterable[Any], records: dict[int, InputRecord] | None,
              context: int | None) -> tuple[AuditCounts, set[tuple[str, int]]]:
        """Counts over `rows` (records by input position, where at hand: None takes none) and the
        (id, sample) that failed or could not be checked."""
        counts, bad = AuditCounts(), set()
        for row in rows:
            pos = row.get("pos") if isinstance(row, dict) else None
            record = records.get(pos) if records is not None and isinstance(pos, int) else None
            verdict = self.verdict(row, record, context, records is not None)
            counts.count(self.named(row), verdict)
            if not verdict.passed:
                bad.add((str(row.get("id")) if isinstance(row, dict) else "", _sample(row)))
        return counts, bad

    def named(self, row: Any) -> str:
        return f"job {self.job!r} {row_name(row)}"


def _sample(row: Any) -> int:
    sample = row.get("sample", 0) if isinstance(row, dict) else 0
    return sample if isinstance(sample, int) else 0
