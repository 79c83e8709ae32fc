"""What one output (a sample, or one turn of a conversation) must agree with: its own ids.

A record's text is what its ids decode to, its token count is their count, and it ends exactly where
its ids say it ends: at the first of its end id, the first occurrence of a stop string, its max tokens,
the context its engine allowed, or a loop the repetition stop takes, with the finish reason that
ending gives. Rows continued across hand-overs are where these break first (a row continued past its
own end, a seam that lost or doubled ids), and a drafter trains on exactly these ids, so a defect is
named, never exported silently.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from fleet.model.endings import Decode, first_end, reported_text, stop_string_end
from fleet.model.reasoning import ended_in_thinking, split_reasoning
from fleet.model.repetition import RepetitionSettings, RepetitionWatch

#: the endings a length limit gives (the others give stop)
LIMITS = ("max tokens", "context")


@dataclass(frozen=True)
class Limits:
    """What could end one output: its max tokens, stop strings, and the context its engine allowed."""

    max_tokens: int
    stops: tuple[str, ...] | None
    #: prompt + output tokens the engine allowed (None: unknown, a length cut then needs its max tokens)
    context: int | None = None

    def room(self, prompt_tokens: int) -> int | None:
        """Output tokens the context leaves a prompt of `prompt_tokens` (None: no context known)."""
        return None if self.context is None else self.context - prompt_tokens


@dataclass(frozen=True)
class Vocab:
    """A job's ids as its engine reads them: how they decode, which end a sample, and whether its
    engine reports an end id or stop string on its last allowed id as stop (EngineSpec.ends_before_length)."""

    decode: Decode
    eos: Collection[int]
    repetition: RepetitionSettings
    ends_before_length: bool = False


def output_problems(out: dict[str, Any], limits: Limits, vocab: Vocab, prompt_tokens: int | None = None) -> list[str]:
    """What is wrong with one output against its own ids ([] when nothing); it must carry its ids (a list
    of ints: fleet.audit.shape). `prompt_tokens` is its prompt's count as the audit made it (None: the
    record's own)."""
    prompt_tokens = out["prompt_tokens"] if prompt_tokens is None else prompt_tokens
    ids = out["output_ids"]
    reason = out["finish_reason"]
    if reason == "error":
        return [] if not ids else [f"an error row holds {len(ids)} output ids"]
    problems = []
    if out.get("completion_tokens") != len(ids):
        problems.append(f"completion_tokens {out.get('completion_tokens')} but {len(ids)} output ids")
    if len(ids) > limits.max_tokens:
        problems.append(f"{len(ids)} output ids, more than its max tokens {limits.max_tokens}")
    _, text, _ = reported_text(ids, reason, vocab.eos, limits.stops, vocab.decode)
    if not _text_matches(out, text):
        problems.append("its text and reasoning are not what its ids decode to")
    return problems + ending_problems(out, ids, reason, limits, vocab, prompt_tokens)


def _text_matches(out: dict[str, Any], text: str) -> bool:
    """The record's answer, reasoning and in-thinking flag are the ids' text split as the engine split it
    (at `</think>`, the prompt having opened the think block or not)."""
    mine = (out.get("reasoning"), out.get("output") or "", bool(out.get("in_thinking")))
    return any((*split_reasoning(text, opened), ended_in_thinking(text, opened)) == mine for opened in (True, False))


def endings(ids: list[int], limits: Limits, vocab: Vocab, prompt_tokens: int) -> list[tuple[int, str]]:
    """Every place the ids, the job and the context could end this output: (its length there, what ends it)."""
    ends = [(k + 1, "end id") for k in [first_end(ids, vocab.eos)] if k is not None]
    ends += [(k, "stop string") for k in [stop_string_end(ids, limits.stops, vocab.decode)] if k is not None]
    ends.append((limits.max_tokens, "max tokens"))
    room = limits.room(prompt_tokens)
    if room is not None:
        ends.append((room, "context"))
    return ends


def ending_problems(out: dict[str, Any], ids: list[int], reason: str, limits: Limits, vocab: Vocab,
                    prompt_tokens: int) -> list[str]:
    """It ends at its first ending, and its finish reason is that ending's."""
    ends = endings(ids, limits, vocab, prompt_tokens)
    first = min(at for at, _ in ends)
    here = {what for at, what in ends if at == len(ids)}
    if first < len(ids):
        why = ", ".join(f"{what} at {at}" for at, what in sorted(ends) if at < len(ids))
        return [f"{len(ids)} output ids run past where its ids end it ({why}): continued past its own end"]
    if reason == "repetition":
        return _repetition_problems(out, ids, vocab)
    stops, cuts = here - set(LIMITS), here & set(LIMITS)
    if reason == "stop":
        if not stops:
            return ["finish reason stop, but neither an end id nor a stop string ends its ids"]
        return []  # on the length limit too: an engine that checks the length first may say either
    if reason == "length":
        if not cuts:
            return [f"finish reason length at {len(ids)} output ids, neither its max tokens {limits.max_tokens} "
                    f"nor the context ({_context(limits, prompt_tokens)}) ends it there"]
        if stops and vocab.ends_before_length:
            return [f"finish reason length, but its {' and '.join(sorted(stops))} ends it there: its engine "
                    "reports that as stop"]
        return []
    return [f"unknown finish reason {reason!r}"]


def _context(limits: Limits, prompt_tokens: int) -> str:
    room = limits.room(prompt_tokens)
    return "unknown" if room is None else f"{limits.context} less {prompt_tokens} prompt tokens leaves {room}"


def _repetition_problems(out: dict[str, Any], ids: list[int], vocab: Vocab) -> list[str]:
    """A loop the repetition stop takes, of the period it names (the worker cuts at the delta it
    finds the loop in, so it may stand a few ids before the end)."""
    cycle = RepetitionWatch(vocab.repetition).feed(ids)
    if cycle is None:
        return ["finish reason repetition, but its ids hold no cycle the repetition stop takes"]
    if out.get("repetition_period") not in (None, cycle.period):
        return [f"repetition period {out['repetition_period']}, its ids repeat a block of {cycle.period}"]
    return []


def count_problems(out: dict[str, Any], limits: Limits, prompt_tokens: int) -> list[str]:
    """What an output stored without its ids (the job keeps none) must still agree with: its counts, its
    finish reason against them, and a text no stop string is left in."""
    reason, made = out["finish_reason"], out.get("completion_tokens")
    if reason == "error":
        return [] if not made else [f"an error row counts {made} completion tokens"]
    problems = []
    if made > limits.max_tokens:
        problems.append(f"completion_tokens {made}, more than its max tokens {limits.max_tokens}")
    room = limits.room(prompt_tokens)
    if reason == "length" and made != limits.max_tokens and (room is None or made != room):
        problems.append(f"finish reason length at {made} completion tokens, neither its max tokens "
                        f"{limits.max_tokens} nor the context ({_context(limits, prompt_tokens)})")
    left = [s for s in limits.stops or () if s in (out.get("output") or "") or s in (out.get("reasoning") or "")]
    if left:
        problems.append(f"its text holds a stop string ({', '.join(map(repr, left))}): it runs past where "
                        "the stop string ends it")
    if reason == "repetition" and not out.get("repetition_period"):
        problems.append("finish reason repetition, but no repetition period")
    return problems
