"""What one output (a sample, or one turn of a conversation) must agree with: its own ids.

A record's text is what its ids decode to, its token count is their count, no end id stands before
its last position, and its finish reason is what the ids say: stop ends on an end id or a stop string,
length fills its max tokens (or the context), repetition ends in the cycle it names. Rows continued
across hand-overs are where these break first (a row continued past its own end, a seam that lost or
doubled ids), and a drafter trains on exactly these ids, so a defect is named, never exported silently.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from fleet.model.endings import Decode, first_end, reported_text
from fleet.model.reasoning import ended_in_thinking, split_reasoning
from fleet.model.repetition import RepetitionSettings, RepetitionWatch


@dataclass(frozen=True)
class Limits:
    """What could end one output: its max tokens, stop strings, and the context its engine allowed."""

    max_tokens: int
    stops: tuple[str, ...] | None
    #: prompt + output tokens the engine allowed (None: unknown, a length cut then needs its max tokens)
    context: int | None = None


@dataclass(frozen=True)
class Vocab:
    """A job's ids as its engine reads them: how they decode and which end a sample."""

    decode: Decode
    eos: Collection[int]
    repetition: RepetitionSettings


def output_problems(out: dict[str, Any], limits: Limits, vocab: Vocab) -> list[str]:
    """What is wrong with one output against its own ids ([] when nothing); it must carry its ids."""
    ids = out["output_ids"]
    reason = out["finish_reason"]
    if reason == "error":
        return [] if not ids else [f"an error row holds {len(ids)} output ids"]
    problems = []
    if out.get("completion_tokens") != len(ids):
        problems.append(f"completion_tokens {out.get('completion_tokens')} but {len(ids)} output ids")
    end = first_end(ids, vocab.eos)
    if end is not None and end < len(ids) - 1:
        problems.append(f"end id {ids[end]} at position {end} of {len(ids)}: continued past its own end")
    if len(ids) > limits.max_tokens:
        problems.append(f"{len(ids)} output ids, more than its max tokens {limits.max_tokens}")
    _, text, by_string = reported_text(ids, reason, vocab.eos, limits.stops, vocab.decode)
    if not _text_matches(out, text):
        problems.append("its text and reasoning are not what its ids decode to")
    problems += _reason_problems(out, ids, reason, limits, vocab, by_string)
    return problems


def _text_matches(out: dict[str, Any], text: str) -> bool:
    """The record's answer, reasoning and in-thinking flag are the ids' text split as the engine split it
    (at `</think>`, the prompt having opened the think block or not)."""
    mine = (out.get("reasoning"), out.get("output") or "", bool(out.get("in_thinking")))
    return any((*split_reasoning(text, opened), ended_in_thinking(text, opened)) == mine for opened in (True, False))


def _reason_problems(out: dict[str, Any], ids: list[int], reason: str, limits: Limits, vocab: Vocab,
                     by_string: bool) -> list[str]:
    if reason == "stop":
        if (ids and ids[-1] in vocab.eos) or by_string:
            return []
        return ["finish reason stop, but neither an end id nor a stop string ends its ids"]
    if reason == "length":
        full = limits.context is not None and out.get("prompt_tokens", 0) + len(ids) >= limits.context
        if len(ids) == limits.max_tokens or full:
            return []
        return [f"finish reason length at {len(ids)} output ids, its max tokens {limits.max_tokens}"]
    if reason == "repetition":
        cycle = RepetitionWatch(vocab.repetition).feed(ids)
        if cycle is None:
            return ["finish reason repetition, but its ids hold no cycle the repetition stop takes"]
        if out.get("repetition_period") not in (None, cycle.period):
            return [f"repetition period {out['repetition_period']}, its ids repeat a block of {cycle.period}"]
        return []
    return [f"unknown finish reason {reason!r}"]
