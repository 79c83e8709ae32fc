"""The input forms beyond messages and prompt: pre-tokenized ids, conversation datasets,
and the fields fleet does not read, which travel to the output unchanged.

Conversation rows are the `{"id", "conversations": [...]}` shape of SpecForge
(sgl-project/SpecForge `docs/basic_usage/data_preparation.md`), with role/content messages
or ShareGPT's from/value ones; roles are normalised as `specforge/data/parse.py`
(`Parser._normalize_message`) does: human -> user, gpt -> assistant. The prompt is the
conversation up to its last user turn and trailing assistant turns are dropped, which is
what SpecForge's `scripts/regenerate_train_data.py` regenerates (its last assistant reply).
A job with `turns = all` keeps the whole conversation instead: the worker generates every
assistant turn in place of the given ones (fleet/model/turns.py).
"""

from __future__ import annotations

from typing import Any

from fleet.records import OutputRecord

#: Top-level keys the reader understands; every other key is passed through.
KNOWN_KEYS = frozenset(
    {"id", "custom_id", "messages", "prompt", "body", "sampling", "input_ids", "conversations",
     "method", "url"}  # method and url: an OpenAI batch line's, meaningless here
)  # fmt: skip
#: ShareGPT role names, as SpecForge's parser maps them.
SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "user": "user", "assistant": "assistant"}
#: Output field names a passthrough field would shadow on the exported record.
RESERVED = frozenset(OutputRecord.model_fields) - {"id"}


def check_input_ids(value: Any, vocab: int | None, problems: list[str]) -> None:
    """A non-empty array of non-negative integers below the vocabulary size when known."""
    if not isinstance(value, list) or not value:
        problems.append("input_ids: must be a non-empty array of token ids")
        return
    for i, tok in enumerate(value):
        if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0:
            problems.append(f"input_ids[{i}]: must be a non-negative integer (got {tok!r})")
            return
        if vocab is not None and tok >= vocab:
            problems.append(f"input_ids[{i}]: token id {tok} is outside the model's vocabulary of {vocab}")
            return


def _message(turn: Any, at: str, problems: list[str]) -> dict[str, Any] | None:
    if not isinstance(turn, dict):
        problems.append(f"{at}: must be an object with role/content or from/value")
        return None
    if "from" in turn or "value" in turn:
        rest = {k: v for k, v in turn.items() if k not in ("from", "value")}
        role, content = turn.get("from"), turn.get("value")
        if role not in SHAREGPT_ROLES and role != "system":
            problems.append(f"{at}.from: must be human, gpt or system (got {role!r})")
            return None
        return {**rest, "role": SHAREGPT_ROLES.get(role, role), "content": content}
    return dict(turn)


def conversation_prompt(value: Any, problems: list[str], whole: bool = False) -> list[dict[str, Any]] | None:
    """The conversation up to and including its last user turn, as role/content messages; every
    turn with `whole` (turns = all: the worker generates each assistant turn)."""
    if not isinstance(value, list) or not value:
        problems.append("conversations: must be a non-empty array of turns")
        return None
    messages = [_message(turn, f"conversations[{i}]", problems) for i, turn in enumerate(value)]
    if problems:
        return None
    users = [i for i, m in enumerate(messages) if m and m.get("role") == "user"]
    if not users:
        problems.append("conversations: no user turn, so nothing to answer")
        return None
    return [m for m in (messages if whole else messages[: users[-1] + 1]) if m is not None]


def passthrough(obj: dict[str, Any], sampling_keys: frozenset[str], problems: list[str]) -> dict[str, Any] | None:
    """Fields fleet does not read, to be returned on the output record unchanged."""
    extra = {k: v for k, v in obj.items() if k not in KNOWN_KEYS and k not in sampling_keys}
    for key in sorted(extra.keys() & RESERVED):
        problems.append(f"{key}: an output field has this name; put it under another key (e.g. metadata)")
    return extra or None
