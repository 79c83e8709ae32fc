"""What a conversation's record (`turns = all`) must agree with besides each turn's own ids: its turns
are numbered in order, every turn but the last finished (the first that does not finish ends the
record), a record that finished holds every turn its conversation asks for, and its top-level fields
are its last turn's (fleet.worker.run.generate, `conversation`; an error row's are the error's, with the
turns finished before it). A bug that rewrote one and not the other would export a row whose top level
says one thing and whose turns another.
"""

from __future__ import annotations

from typing import Any

from fleet.model.turns import turn_count
from fleet.records import TURN_FIELDS, InputRecord
from fleet.store.results import finished

#: what the top level of a conversation's record repeats of its last turn (the worker that made it
#: aside: run facts, not generation)
GENERATED = tuple(f for f in TURN_FIELDS if f not in ("turn", "worker"))


def turn_problems(row: dict[str, Any], record: InputRecord | None, every_turn: bool) -> list[str]:
    """What is wrong with how a record's turns hang together ([] when nothing, or it has none to have)."""
    turns = row.get("turns")
    conversation = record is not None and bool(record.messages)
    if turns is None:
        if every_turn and conversation:
            return ["turns: missing: a conversation of a turns = all job keeps every turn it generated"]
        return []
    if not every_turn:
        return ["turns: present in a record of a turns = last job"]
    if record is not None and not conversation:
        return ["turns: present in a record without messages"]
    problems = []
    numbers = [t["turn"] for t in turns]
    if numbers != list(range(len(turns))):
        problems.append(f"turns: numbered {numbers}, not 0 to {len(turns) - 1}")
    error = row["finish_reason"] == "error"
    unfinished = [t["turn"] for t in (turns if error else turns[:-1]) if not finished(t)]
    if unfinished:
        problems.append(f"turns: turn(s) {unfinished} did not finish, yet the record went on after them")
    if not error:
        if not turns:
            return [*problems, "turns: none, in a record that did not fail"]
        differs = [f for f in GENERATED if row.get(f) != turns[-1].get(f)]
        if differs:
            problems.append(f"{', '.join(differs)}: the top level is not its last turn's")
    if record is not None and record.messages:
        count = turn_count(record.messages)
        if len(turns) > count or (not error and finished(turns[-1]) and len(turns) != count):
            problems.append(f"turns: {len(turns)} turns, its conversation has {count}")
    return problems
