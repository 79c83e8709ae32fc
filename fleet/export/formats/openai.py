"""OpenAI Batch output lines, so a reader of vLLM `run-batch` or OpenAI Batch API output
takes fleet's results unchanged.

Line shape as `BatchRequestOutput` in vllm-project/vllm
`vllm/entrypoints/openai/run_batch.py` and openai-python's `types/batch_request_output.py`:
`{"id", "custom_id", "response": {"status_code": 200, "request_id", "body"}, "error": null}`.
The body is a `chat.completion` (choices[].message with content and reasoning_content, as
vLLM and SGLang reasoning parsers return it) for message records, and a `text_completion`
(choices[].text) for raw prompts and input ids, as /v1/completions answers them. A record's
n samples are one line with n choices, as the API returns them. A record whose samples all
failed is `response: null` with an `error` object; failed samples among good ones are left
out of choices. Ids are derived from the job and record, so two exports are identical. The line shape
is fixed, so passthrough input fields are not added to it.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from pathlib import Path
from typing import Any

from fleet.export.formats.base import ExportRow, JsonLinesWriter, LeftOut
from fleet.store.manifest import Manifest

ERROR_CODE = "record_error"


def _rid(prefix: str, *parts: str) -> str:
    return prefix + hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def choice(out: dict[str, Any], index: int, chat: bool) -> dict[str, Any]:
    if not chat:
        return {"index": index, "text": out["output"], "logprobs": None, "finish_reason": out["finish_reason"]}
    message = {"role": "assistant", "content": out["output"], "reasoning_content": out.get("reasoning")}
    return {"index": index, "message": message, "logprobs": None, "finish_reason": out["finish_reason"]}


class OpenAIBatchWriter(JsonLinesWriter):
    needs_inputs = True

    def __init__(self, path: Path, manifest: Manifest, stable: bool, left_out: LeftOut):
        super().__init__(path, manifest, stable, left_out)
        self.created = int(datetime.fromisoformat(manifest.created).timestamp())

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
            "choices": [choice(r.out, i, chat) for i, r in enumerate(good)],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        }
        return {"status_code": 200, "request_id": _rid("req_", self.manifest.job, custom_id), "body": body}
