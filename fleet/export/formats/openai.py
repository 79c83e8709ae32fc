"""OpenAI Batch output lines, so a reader of vLLM `run-batch` or OpenAI Batch API output
takes fleet's results unchanged.

Line shape as `BatchRequestOutput` in vllm-project/vllm
`vllm/entrypoints/openai/run_batch.py` and openai-python's `types/batch_request_output.py`:
`{"id", "custom_id", "response": {"status_code": 200, "request_id", "body"}, "error": null}`.
The body is a `chat.completion` (choices[].message with content and reasoning_content, as
vLLM and SGLang reasoning parsers return it) for message records, and a `text_completion`
(choices[].text) for raw prompts and input ids, as /v1/completions answers them. A
completion's text is everything generated, reasoning and `</think>` included, so `text` and
`usage` agree: the stored output ids decoded as the engine decoded them (skipping special
tokens, cut at the stop string), with the job's tokenizer; without ids (a job run with
`return_output_ids` off, or the sim engine) the reasoning, `</think>` and the answer are
joined as the Qwen format writes them. A record's
n samples are one line with n choices, as the API returns them. A record whose samples all
failed is `response: null` with an `error` object; failed samples among good ones are left
out of choices. Ids are derived from the job and record, so two exports are identical. The line shape
is fixed, so passthrough input fields are not added to it. A conversation generated turn by
turn (`turns = all`) answers with its last turn, as a chat completion of the whole
conversation would; its choice also lists every generated turn as an assistant message with
its finish reason (`turns`).
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from pathlib import Path
from typing import Any

from fleet.engines.specs import job_decoder
from fleet.export.formats.base import ExportRow, JsonLinesWriter, LeftOut
from fleet.model.endings import Decode, reported_text
from fleet.model.reasoning import THINK_CLOSE
from fleet.store.manifest import Manifest

ERROR_CODE = "record_error"


def _rid(prefix: str, *parts: str) -> str:
    return prefix + hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def joined(out: dict[str, Any]) -> str:
    """Reasoning, `</think>` and answer as the Qwen format writes them (no ids to decode)."""
    if out.get("in_thinking"):
        return out["reasoning"]
    return f"{out['reasoning']}\n{THINK_CLOSE}\n\n{out['output']}"


def choice(out: dict[str, Any], index: int, text: str | None) -> dict[str, Any]:
    """A completion choice when `text` is given, else a chat choice with the reasoning apart."""
    if text is not None:
        return {"index": index, "text": text, "logprobs": None, "finish_reason": out["finish_reason"]}
    message = {"role": "assistant", "content": out["output"], "reasoning_content": out.get("reasoning")}
    chat = {"index": index, "message": message, "logprobs": None, "finish_reason": out["finish_reason"]}
    if out.get("turns"):
        chat["turns"] = [{"role": "assistant", "content": t["output"], "reasoning_content": t.get("reasoning"),
                          "finish_reason": t["finish_reason"]} for t in out["turns"]]  # fmt: skip
    return chat


class OpenAIBatchWriter(JsonLinesWriter):
    needs_inputs = True

    def __init__(self, path: Path, manifest: Manifest, stable: bool, left_out: LeftOut):
        super().__init__(path, manifest, stable, left_out)
        self.created = int(datetime.fromisoformat(manifest.created).timestamp())
        self.decode: Decode | None = None

    def completion_text(self, row: ExportRow) -> str:
        """All a completion generated (module docstring): what `usage` counts."""
        out = row.out
        if out.get("reasoning") is None:
            return out["output"]
        ids = out.get("output_ids")
        sampling = self.manifest.config.get("sampling") or {}
        if ids is None:
            return joined(out)
        if self.decode is None:
            self.decode = job_decoder(self.manifest)
        assert row.record is not None
        own = row.record.sampling.stop if row.record.sampling and row.record.sampling.stop else None
        stops = tuple(own or sampling.get("stop") or ())
        return reported_text(ids, out["finish_reason"], sampling.get("eos_token_ids") or (), stops, self.decode)[1]

    def write(self, rows: list[ExportRow]) -> int:
        written, group = 0, []
        for row in rows:
            if group and row.out["pos"] != group[0].out["pos"]:
                written += self.emit(group)
                group = []
            group.append(row)
        return written + (self.emit(group) if group else 0)

    def emit(self, group: list[ExportRow]) -> int:
        first = group[0]
        custom_id = first.out["id"]
        line: dict[str, Any] = {"id": _rid("batch_req_", self.manifest.job, custom_id), "custom_id": custom_id}
        good = [r for r in group if r.out["finish_reason"] != "error"]
        if not good:
            line |= {"response": None, "error": {"code": ERROR_CODE, "message": first.out.get("error") or ""}}
        else:
            line |= {"response": self.response(good, custom_id), "error": None}
        self.put(line)
        return 1

    def response(self, good: list[ExportRow], custom_id: str) -> dict[str, Any]:
        assert good[0].record is not None
        chat = good[0].record.messages is not None
        prompt = good[0].out["prompt_tokens"]
        completion = sum(r.out["completion_tokens"] for r in good)
        body = {
            "id": _rid("chatcmpl-" if chat else "cmpl-", self.manifest.job, custom_id),
            "object": "chat.completion" if chat else "text_completion",
            "created": self.created,
            "model": good[0].out.get("model"),
            "choices": [choice(r.out, i, None if chat else self.completion_text(r)) for i, r in enumerate(good)],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        }
        return {"status_code": 200, "request_id": _rid("req_", self.manifest.job, custom_id), "body": body}
