"""What a rendered prompt must fit before it reaches an engine: the model's vocab and its context."""

from __future__ import annotations

from fleet.errors import RecordError
from fleet.records import GenRequest


def check_vocab(request: GenRequest, ids: list[int], vocab: int | None) -> None:
    """RecordError for a token id the model has no embedding row for. SGLang 0.5.23 does not
    check: its scheduler dies on the embedding lookup and takes the worker with it."""
    if vocab is None:
        return
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise RecordError(
            f"record {request.record_id!r} has token ids outside the model's vocab size ({vocab}): {bad[:5]}"
        )


def check_length(request: GenRequest, prompt_len: int, context: int | None) -> int:
    """Max new tokens after the request's prefix ids that fit the context (0 or less: none
    fit, the sample ends at "length"); RecordError when the prompt alone does not fit."""
    max_new = request.sampling.max_tokens - len(request.prefix_ids)
    if context is None:
        return max_new
    if prompt_len >= context:
        raise RecordError(
            f"prompt of record {request.record_id!r} is {prompt_len} tokens after templating, "
            f"the context is {context}"
        )
    return min(max_new, context - prompt_len - len(request.prefix_ids))
