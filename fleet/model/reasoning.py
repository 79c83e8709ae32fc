"""The reasoning in an output's text: split at the think block's end, and whether the output
ended inside it."""

from __future__ import annotations

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def split_reasoning(text: str, opened: bool) -> tuple[str | None, str]:
    """(reasoning, answer) split at the first `</think>`.

    When the prompt opened the think block, the output holds only its end; an output
    without `</think>` then is all reasoning (cut by max_tokens). When the model opens the
    block itself, the leading `<think>` is dropped.
    """
    head, sep, tail = text.partition(THINK_CLOSE)
    stripped = head.lstrip()
    if sep:
        return stripped.removeprefix(THINK_OPEN).strip(), tail.lstrip()
    if opened:
        return head.strip(), ""
    if stripped.startswith(THINK_OPEN):
        return stripped.removeprefix(THINK_OPEN).strip(), ""
    return None, text


def ended_in_thinking(text: str, opened: bool) -> bool:
    """True when the output ends inside its think block (opened by the prompt or by the
    model, never closed): reasoning with no answer, whatever the finish reason says."""
    if THINK_CLOSE in text:
        return False
    return opened or text.lstrip().startswith(THINK_OPEN)
