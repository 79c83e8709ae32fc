"""What a request looks like on each server API, and how one streamed line of its answer reads.

Pure: no network. `vllm`: `/v1/completions` with the prompt as token ids and `return_token_ids`
(vLLM 0.32's OpenAI server: `CompletionRequest`, each streamed choice carries its new `token_ids`).
Whatever the API, a record's text is decoded from its ids at its end (ModelEngine.assemble), never
taken from the server's stream: vLLM's server detokenizes every request (its completions API has no
`detokenize`), primed with the prompt's ids, so where a pre-tokenized prompt ends inside a UTF-8
character the streamed text begins with the prompt's own bytes.
`sglang`: the native `/generate` with `input_ids` (each line carries `output_ids` and `meta_info`;
whole so far unless the server streams increments). `openai`: `/v1/completions` with the rendered
prompt as text: no ids either way, so ids are the output text encoded by the model's tokenizer and a
stopped record restarts from token 0 (docs/architecture.md, "Engines").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from fleet.engines.stream import Step
from fleet.engines.wire import sglang_sampling, vllm_sampling
from fleet.errors import RecordError
from fleet.records import Sampling

ApiName = Literal["vllm", "sglang", "openai"]
FINISHES = ("stop", "length")
#: statuses under 500 that say the server cannot serve now (a timeout, overload), not that the request
#: is bad: sent again, then the server counts as down for them, as for a 5xx
RETRIED_STATUSES = frozenset({408, 429})
#: statuses that say the server refuses fleet itself (its key, its permission, the model or path it
#: names): no retry passes them, the job's settings must change (fleet.engines.server.refusal)
REFUSING_STATUSES = frozenset({401, 403, 404})


class ServerRefused(Exception):
    """The server answered with an error: an HTTP status, or an error line inside a stream."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status, self.message = status, message


@dataclass
class Call:
    """One request on the wire: where it goes and its JSON body."""

    path: str
    body: dict[str, Any]


def call(api: ApiName, model: str, ids: list[int], text: str | None, sampling: Sampling, max_new: int,
         eos_ids: list[int], request_id: str, interval: int) -> Call:
    """The request for prompt + prefix `ids` (`text`: the same rendered as text, for the openai API)."""
    if api == "sglang":
        params = sglang_sampling(sampling, max_new, eos_ids, seeded=True)
        return Call("/generate", {"input_ids": ids, "sampling_params": params, "stream": True,
                                  **({"rid": request_id} if request_id else {})})
    body = {"model": model, "stream": True, **vllm_sampling(sampling, max_new, eos_ids)}
    body.pop("detokenize")  # not a field of vLLM's completions API: its server detokenizes every request
    if api == "vllm":
        body |= {"prompt": ids, "return_token_ids": True, "skip_special_tokens": True, "stream_interval": interval,
                 **({"request_id": request_id} if request_id else {})}
    else:
        body |= {"prompt": text}
    return Call("/v1/completions", body)


@dataclass
class Reader:
    """Reads one request's streamed lines into Steps; keeps what a line's meaning depends on (SGLang's
    ids and text so far)."""

    api: ApiName
    eos_ids: Sequence[int] = ()
    #: ids read so far (SGLang may stream the whole output so far)
    sent: int = 0
    #: the openai API's stop came from a stop string (vLLM says so in `stop_reason`)
    stopped_by_string: bool = False

    def read(self, line: dict[str, Any], record_id: str) -> Step | None:
        error = line.get("error")
        if error:
            if isinstance(error, dict):
                raise ServerRefused(int(error.get("code") or 500), str(error.get("message") or error))
            raise ServerRefused(500, str(error))
        if self.api == "sglang":
            return self._sglang(line, record_id)
        choices = line.get("choices") or []
        if not choices:
            return None  # a usage line
        choice = choices[0]
        text = choice.get("text") or ""
        reason = choice.get("finish_reason")
        if reason is not None and reason not in FINISHES:
            raise RecordError(f"the server finished record {record_id!r} with {reason!r}")
        if self.api == "vllm":  # the text is the prompt's and the ids' together at a split character: not kept
            return Step(list(choice.get("token_ids") or ()), None, reason)
        self.stopped_by_string = isinstance(choice.get("stop_reason"), str)
        return Step(None, text, reason)  # type: ignore[arg-type]  # ids: the engine encodes the text, then drops it

    def _sglang(self, line: dict[str, Any], record_id: str) -> Step:
        meta = line.get("meta_info") or {}
        ids = line.get("output_ids") or []
        made = meta.get("completion_tokens")
        if made is not None and len(ids) == made and made >= self.sent:  # the whole output so far
            ids = ids[self.sent:]
        self.sent += len(ids)
        raw = meta.get("finish_reason")
        if raw is None:
            return Step(ids)
        kind = raw.get("type") if isinstance(raw, dict) else raw
        if kind not in FINISHES:
            status = raw.get("status_code") if isinstance(raw, dict) else None
            message = raw.get("message") if isinstance(raw, dict) else raw
            raise RecordError(f"the server finished record {record_id!r} with {kind!r} ({status}): {message}")
        facts = {"cached_tokens": meta["cached_tokens"]} if meta.get("cached_tokens") else {}
        # SGLang's streamed text is the whole so far (unless incremental): it is decoded from the ids instead
        return Step(ids, None, kind, facts)
