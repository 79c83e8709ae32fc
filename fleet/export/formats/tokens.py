"""Token rows for drafter training: the exact ids the engine saw and produced.

Shape: `{"id", "input_ids": prompt ids + output ids, "loss_mask": 0 per prompt id, 1 per
output id}`, the tokenized-sample shape of vllm-project/speculators' data generation
(`scripts/DATAGEN.md`: input_ids with a loss mask over the trainable tokens).

Output ids come from the results (stored unless the job turned `return_output_ids` off). Prompt ids
are not stored per record, to keep results small: pre-tokenized input ids come from the
chunk objects, and chat/raw prompts are rendered again with the model's tokenizer and
chat template, which is deterministic. The rebuild is proven, not trusted: each record
carries a digest of the ids the engine saw (`prompt_digest`), and a mismatch (other
tokenizer files, another transformers version) fails the export instead of writing a
subtly different prompt (the SpecForge#296 class of mismatch). The chat template's hash
must also equal the manifest's. Error rows are left out and counted; passthrough input
fields follow at top level, and `sample` is added to every sample after a record's first.

A conversation generated turn by turn (`turns = all`, fleet/model/turns.py) gives one row per
generated turn, named by its `turn`: turn k's prompt is rebuilt over the turns generated
before it, as the worker rendered it, and checked against that turn's digest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleet.engines.specs import job_tokenizer
from fleet.errors import FleetError
from fleet.export.formats.base import ExportRow, JsonLinesWriter, LeftOut, with_sample_and_extra
from fleet.model.turns import turn_prompt
from fleet.records import InputRecord, Message, prompt_digest
from fleet.store.manifest import Manifest


class PromptIds:
    """The prompt ids a job's engine saw, rebuilt per record and checked against its digest."""

    def __init__(self, manifest: Manifest):
        self.manifest = manifest
        self.tokenizer: Any = None
        self.last: tuple[int, list[int]] | None = None

    def of(self, record: InputRecord, digest: str | None, messages: list[Message] | None = None) -> list[int]:
        """The record's prompt ids; with `messages`, those of one turn of its conversation."""
        if messages is not None:
            ids = self.render(record, messages)
        elif self.last is not None and self.last[0] == record.pos:
            ids = self.last[1]
        else:
            ids = list(record.input_ids) if record.input_ids is not None else self.render(record)
            self.last = (record.pos, ids)
        if digest is not None and prompt_digest(ids) != digest:
            raise FleetError(
                f"record {record.id!r}: the rebuilt prompt ids differ from those the engine saw "
                "(tokenizer or chat template changed since the job ran); export with the job's model files"
            )
        return ids

    def render(self, record: InputRecord, messages: list[Message] | None = None) -> list[int]:
        from fleet.model.rendering import record_prompt_ids

        thinking = self.manifest.config.get("enable_thinking", True)
        return record_prompt_ids(self._tokenizer(), record, thinking, messages)

    def _tokenizer(self) -> Any:
        if self.tokenizer is None:
            self.tokenizer = job_tokenizer(self.manifest)
        return self.tokenizer


class TokensWriter(JsonLinesWriter):
    needs_inputs = True
    skip_errors = True
    separators = (",", ":")

    def __init__(self, path: Path, manifest: Manifest, stable: bool, left_out: LeftOut):
        super().__init__(path, manifest, stable, left_out)
        self.prompts = PromptIds(manifest)

    def write(self, rows: list[ExportRow]) -> int:
        """A conversation's generated turns are a row each; any other sample is one row."""
        flat = []
        for row in rows:
            turns = row.out.get("turns") if row.out["finish_reason"] != "error" else None
            flat += [ExportRow({**row.out, **turn}, row.record) for turn in turns] if turns else [row]
        return super().write(flat)

    def line(self, row: ExportRow) -> dict[str, Any] | None:
        out, record = row.out, row.record
        assert record is not None
        output = out.get("output_ids")
        if output is None:
            raise FleetError(
                f"job {self.manifest.job!r} stored no output ids (it ran with return_output_ids off): "
                "run it again with FLEET_RETURN_OUTPUT_IDS=true, the default, for --format tokens"
            )
        turns, turn = out.get("turns"), out.get("turn")
        messages = None
        if turns and record.messages:
            messages = turn_prompt(record.messages, turns[:turn])
        prompt = self.prompts.of(record, out.get("prompt_digest"), messages)
        line: dict[str, Any] = {
            "id": out["id"], "input_ids": prompt + output, "loss_mask": [0] * len(prompt) + [1] * len(output),
        }  # fmt: skip
        if turns:
            line["turn"] = turn
        return with_sample_and_extra(out, line)
