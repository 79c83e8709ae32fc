"""Where a sample's output ids end it, read from the ids themselves.

One definition serves the two places that must agree: the worker, which never continues a sample
whose checkpointed ids already end it (an end-of-sequence id, a stop string, its max tokens), and
the audit, which checks that every record's finish reason is what its ids say
(docs/architecture.md, "Tokens as they are made" and "Audit"). `trim_at_stop` cuts an output's
text at its first stop string, as the engines that match stops on text do.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from fleet.records import Ending

#: decodes output ids to text as the engines report it (special tokens skipped)
Decode = Callable[[Sequence[int]], str]


def first_end(ids: Sequence[int], eos: Collection[int]) -> int | None:
    """The position of the first end-of-sequence id, or None."""
    if not eos:
        return None
    return next((k for k, token in enumerate(ids) if token in eos), None)


def stop_string_end(ids: Sequence[int], stops: Sequence[str] | None, decode: Decode) -> int | None:
    """How many ids it takes for the decoded output to hold a stop string (the id that completes it
    included), or None when none is there."""
    if not stops or not trim_at_stop(decode(ids), tuple(stops))[1]:
        return None
    lo, hi = 1, len(ids)  # the shortest prefix whose text holds a stop string
    while lo < hi:
        mid = (lo + hi) // 2
        if trim_at_stop(decode(ids[:mid]), tuple(stops))[1]:
            hi = mid
        else:
            lo = mid + 1
    return lo


def prefix_ending(ids: Sequence[int], eos: Collection[int], stops: Sequence[str] | None, max_tokens: int,
                  decode: Decode) -> Ending | None:
    """The ending the ids already hold, else None: a sample that made its end id, a stop string or
    its max tokens is finished, and an engine handed such ids as a prefix would go on past its end."""
    ends = [(k + 1, "stop") for k in [first_end(ids, eos)] if k is not None]
    ends += [(k, "stop") for k in [stop_string_end(ids, stops, decode)] if k is not None]
    if len(ids) >= max_tokens:
        ends.append((max_tokens, "length"))
    if not ends:
        return None
    # An end id or stop string on the last id max tokens allows ends it as stop, as the sim and hf
    # report it (vLLM and SGLang say length there: the audit takes either from them, fleet.audit.checks).
    length, reason = min(ends, key=lambda end: (end[0], end[1] != "stop"))
    return Ending(reason, length)


def reported_text(ids: Sequence[int], reason: str, eos: Collection[int], stops: Sequence[str] | None,
                  decode: Decode) -> tuple[list[int], str, bool]:
    """(ids, text, stopped by a string) as the engines report a sample: the text without its end id
    or special tokens, cut before the first stop string; the ids then end with the id that completed
    that string."""
    body = list(ids[:-1]) if reason == "stop" and ids and ids[-1] in eos else list(ids)
    text, hit = trim_at_stop(decode(body), tuple(stops) if stops else None)
    if hit:
        body = body[: stop_string_end(body, stops, decode)]
        return body, text, True
    return list(ids), text, False


def trim_at_stop(text: str, stops: tuple[str, ...] | None) -> tuple[str, bool]:
    """Text up to the earliest stop string (excluded, as OpenAI and SGLang do) and whether one hit."""
    cut = min((i for i in (text.find(s) for s in stops or ()) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)
