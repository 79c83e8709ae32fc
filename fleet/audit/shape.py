"""A stored row's shape: every field the audit and the exports read, of the type fleet writes.

A row a bug (in fleet, an engine, a storage layer) left without its finish reason, or with ids that
are not a list of ints, is a named defect (its field and what is wrong), never a traceback out of
`fleet verify` or `fleet export`. Strict: a JSON string where fleet writes a number is wrong too.
Fields fleet added later (in_thinking, repetition_period, turns) may be absent from older rows.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from fleet.records import FinishReason

#: the field problems named per row (the rest counted)
MAX_FIELDS = 3


class _Generated(BaseModel):
    """What an output (a sample, or one turn of it) holds of its generation."""

    model_config = ConfigDict(extra="allow", strict=True)

    output: StrictStr
    reasoning: StrictStr | None
    output_ids: list[StrictInt] | None
    prompt_tokens: StrictInt = Field(ge=0)
    completion_tokens: StrictInt = Field(ge=0)
    finish_reason: FinishReason
    in_thinking: StrictBool | None = None
    repetition_period: StrictInt | None = None


class TurnShape(_Generated):
    """One generated turn of a conversation (fleet.records.TURN_FIELDS)."""

    turn: StrictInt = Field(ge=0)


class RowShape(_Generated):
    """One stored sample (fleet.records.OutputRecord)."""

    id: StrictStr
    sample: StrictInt = Field(0, ge=0)
    pos: StrictInt = Field(ge=0)
    chunk: StrictInt = Field(ge=0)
    turns: list[TurnShape] | None = None


def shape_problems(row: Any) -> list[str]:
    """What is wrong with a stored row's fields ([] when nothing), each naming its field."""
    if not isinstance(row, dict):
        return [f"a {type(row).__name__}, not a record object"]
    try:
        RowShape.model_validate(row)
    except ValidationError as e:
        found = [f"{'.'.join(map(str, err['loc']))}: {err['msg'].lower()}"
                 + ("" if err["type"] == "missing" else f" (holds {_kind(err['input'])})") for err in e.errors()]
        more = [f"and {len(found) - MAX_FIELDS} more"] if len(found) > MAX_FIELDS else []
        return found[:MAX_FIELDS] + more
    return []


def _kind(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def row_name(row: Any) -> str:
    """How a defect names a row, however broken: its chunk, record id and sample."""
    if not isinstance(row, dict):
        return "a row"
    return f"chunk {row.get('chunk')} record {row.get('id')!r} sample {row.get('sample', 0)}"
