"""SpecForge's conversation rows: the input messages plus one regenerated assistant turn.

Shape: `{"id", "conversations": [...input messages..., {"role": "assistant", "content":
<answer>, "reasoning_content": <thinking>}]}`, the "Conversation Format" of
sgl-project/SpecForge `docs/basic_usage/data_preparation.md`, with the assistant turn as
its `scripts/regenerate_train_data.py --reasoning save` writes it and as
`specforge/data/parse.py` (ThinkingParser: role, content, tool_calls, reasoning_content)
reads it for the qwen3.5 thinking template. The template re-inserts the think markers
around `reasoning_content`, so markers left in `content` would train the drafter on
`<think>` twice (SpecForge#296, #455): such rows are left out and counted, as
SpecForge's regeneration does.

Records without messages (a raw prompt or pre-tokenized ids) have no conversation to
extend, and a file mixing SpecForge's pre-formatted `{"id", "text"}` rows with
conversation rows cannot be loaded (`is_preformatted` is per dataset), so they are
left out and counted; `--format tokens` covers every record. Error rows are left out too.
Passthrough input fields follow at top level; `sample` is added to every sample after
a record's first.

A conversation generated turn by turn (`turns = all`, fleet/model/turns.py) is written
whole, every assistant turn the model's own (`content` + `reasoning_content`), the given
ones dropped: SpecForge's `train_only_last_turn=False` then trains every turn.
"""

from __future__ import annotations

from typing import Any

from fleet.export.formats.base import ExportRow, JsonLinesWriter, with_sample_and_extra
from fleet.model.reasoning import THINK_CLOSE, THINK_OPEN
from fleet.model.turns import conversation


def assistant_turn(out: dict[str, Any]) -> dict[str, Any]:
    turn: dict[str, Any] = {"role": "assistant", "content": out["output"]}
    if out.get("reasoning") is not None:
        turn["reasoning_content"] = out["reasoning"]
    return turn


def has_marker(text: str | None) -> bool:
    return bool(text) and (THINK_OPEN in text or THINK_CLOSE in text)  # type: ignore[operator]


class SpecForgeWriter(JsonLinesWriter):
    needs_inputs = True
    skip_errors = True

    def line(self, row: ExportRow) -> dict[str, Any] | None:
        out, record = row.out, row.record
        assert record is not None
        if not record.messages:
            self.left_out.add("records without messages (raw prompt or input_ids): use --format tokens")
            return None
        turns = out.get("turns") or [out]
        if any(has_marker(t["output"]) or has_marker(t.get("reasoning")) for t in turns):
            self.left_out.add("a think marker left in the answer or the reasoning")
            return None
        if out.get("turns"):
            messages = [m.model_dump(exclude_none=True) for m in conversation(record.messages, out["turns"])]
        else:
            messages = [*(m.model_dump(exclude_none=True) for m in record.messages), assistant_turn(out)]
        line: dict[str, Any] = {"id": out["id"], "conversations": messages}
        return with_sample_and_extra(out, line)
