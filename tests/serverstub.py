"""A stand-in inference server for the server engine's tests in the main venv (the real `vllm serve`
runs in the vLLM stage, tests/test_engines_vllm.py). Read from vLLM 0.32's OpenAI server and SGLang
0.5.23's HTTP server, with their edges:

- `/v1/completions` (vLLM): the prompt as token ids or text; `return_token_ids` gives each streamed
  choice its new `token_ids` (the first chunk also `prompt_token_ids`); text is detokenized
  incrementally, whatever `detokenize` says (its CompletionRequest has no such field), by the
  tokenizers' DecodeStream primed with the prompt's ids, as vLLM's FastIncrementalDetokenizer: where
  the prompt ends inside a UTF-8 character, the first delta's text begins with the prompt's own
  bytes (its last characters, or a replacement mark), not what the output ids decode to; deltas of
  `stream_interval` tokens (the request's, raised to the server's); the last choice names its
  `finish_reason` ("stop" at a `stop_token_ids` id, which is in the ids but not the text, or
  "length"); `data: [DONE]` ends the stream. A prompt that leaves no room in the context is a 400
  with vLLM's error body; an unknown model a 404.
- `/generate` (SGLang): `input_ids`, `sampling_params` with `max_new_tokens`; each line holds the whole
  output so far (`output_ids`, `text`: the tokenizer's decoding of those ids, as its detokenizer's;
  SGLang's default without incremental streaming output) and `meta_info` (`completion_tokens`,
  `finish_reason` {"type": ...} on the last). A prompt + max_new_tokens over the context is a 400 (the
  tokenizer manager's check); within it, the scheduler silently clips max_new_tokens to
  max_req_len - prompt - 1 with max_req_len = context - 1 (init_req_max_new_tokens): such a request
  ends at "length" two short of the context.
- Stop strings (`stop`) end the output at the id that completes one, its text cut before it (vLLM's
  `stop_reason` and SGLang's `matched` name it); streamed text holds back what a stop string may
  still begin with.
- A client that goes away aborts its request: the next write fails and generation stops (both servers
  cancel the request's generator on disconnect); its id is kept in `aborted`.
- Access: with `api_key` set, vLLM guards every /v1 path (its AuthenticationMiddleware) and SGLang
  every path but /health and /metrics (its api-key middleware): without the bearer key, 401
  `{"error": "Unauthorized"}`; `forbidden` paths answer 403 `{"error": "Forbidden"}` (SGLang's
  admin paths without an admin key).
- Limits: SGLang's `/server_info` holds `internal_states[0]` with
  `effective_max_running_requests_per_dp` (`running`) and `memory_usage.token_capacity`
  (`kv_tokens`), and `dp_size`; vLLM's `/server_info?config_format=json` exists only with
  `dev_mode` (VLLM_SERVER_DEV_MODE=1: `vllm_config.scheduler_config.max_num_seqs`), and its
  `/metrics` always carries `vllm:cache_config_info` with `num_gpu_blocks` and `block_size` labels.
- Faults: `fail_next` answers that many requests 500, `drop_after` closes the connection after that
  many lines of the next request.

Each output id is a function of every id before it (prompt included): a request continued from its own
prefix ends exactly as one run in one go, and one continued from another prefix does not.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

from tokenizers.decoders import DecodeStream

from tests.httpstub import StandInServer


def next_id(ids: list[int], vocab: int, eos: int) -> int:
    """The stand-in model: a hash of the last ids; the end id when the hash says so (about 1 in 90)."""
    h = 0
    for token in ids[-4:]:
        h = (h * 1_000_003 + token) & 0xFFFFFFFF
    h = (h * 2_654_435_761 + len(ids)) & 0xFFFFFFFF
    return eos if h % 89 == 0 else 10 + h % (vocab - 20)


@dataclass
class Stub:
    tokenizer: Any
    eos: int
    api: str = "vllm"
    model: str = "tiny"
    root: str = "/models/tiny"
    context: int = 512
    stream_interval: int = 4
    step_s: float = 0.002
    fail_next: int = 0
    drop_after: int | None = None
    #: the bearer key the server asks for (None: none)
    api_key: str | None = None
    #: paths that answer 403 whatever the key
    forbidden: tuple[str, ...] = ()
    #: requests the server runs at once, and its KV tokens (what its limits endpoints tell)
    running: int = 8
    kv_tokens: int = 4096
    #: vLLM served with VLLM_SERVER_DEV_MODE=1: /server_info exists
    dev_mode: bool = False
    requests: list[dict] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self) -> tuple[StandInServer, str]:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def refused(self) -> bool:
                """Answer 401 or 403 where the server's auth would (True: answered)."""
                path = urlsplit(self.path).path
                if path in stub.forbidden:
                    self.reply(403, {"error": "Forbidden"})
                    return True
                guarded = path.startswith("/v1") if stub.api == "vllm" else \
                    not path.startswith(("/health", "/metrics"))
                if stub.api_key and guarded and self.headers.get("Authorization") != f"Bearer {stub.api_key}":
                    self.reply(401, {"error": "Unauthorized"})
                    return True
                return False

            def do_GET(self) -> None:  # noqa: N802
                path = urlsplit(self.path).path
                if self.refused():
                    return
                if path == "/server_info" and (stub.api == "sglang" or stub.dev_mode):
                    self.reply(200, server_info(stub))
                elif path == "/metrics" and stub.api == "vllm":
                    self.send_text(200, f'vllm:cache_config_info{{block_size="16",engine="0",num_gpu_blocks='
                                        f'"{stub.kv_tokens // 16}",prefix_caching_hash_algo="sha256"}} 1.0\n'
                                        'vllm:num_requests_running{engine="0",model_name="tiny"} 0.0\n')
                elif self.path == "/v1/models":
                    self.reply(200, {"object": "list", "data": [
                        {"id": stub.model, "object": "model", "root": stub.root, "max_model_len": stub.context}]})
                elif self.path == "/version" and stub.api == "vllm":
                    self.reply(200, {"version": "0.32.0"})
                elif self.path == "/get_model_info" and stub.api == "sglang":
                    self.reply(200, {"model_path": stub.root, "tokenizer_path": stub.root, "is_generation": True,
                                     "weight_version": "default"})
                else:
                    self.reply(404, {"detail": "Not Found"})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with stub.lock:
                    stub.requests.append({"path": self.path, **body})
                if self.refused():
                    return
                with stub.lock:
                    failing = stub.fail_next > 0
                    stub.fail_next -= failing
                    drop, stub.drop_after = stub.drop_after, None
                if failing:
                    return self.reply(500, error("Internal server error", 500))
                if self.path == "/v1/completions":
                    return self.completions(body, drop)
                if self.path == "/generate" and stub.api == "sglang":
                    return self.generate(body, drop)
                self.reply(404, {"detail": "Not Found"})

            def reply(self, status: int, doc: dict) -> None:
                self.send_text(status, json.dumps(doc), "application/json")

            def send_text(self, status: int, text: str, kind: str = "text/plain") -> None:
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def completions(self, body: dict, drop: int | None) -> None:
                if body.get("model") != stub.model:
                    return self.reply(404, error(f"The model `{body.get('model')}` does not exist.", 404))
                prompt = body["prompt"]
                ids = prompt if isinstance(prompt, list) else stub.tokenizer.encode(prompt, add_special_tokens=False)
                max_new = body.get("max_tokens", 16)
                if len(ids) + max_new > stub.context:
                    return self.reply(400, error(
                        f"This model's maximum context length is {stub.context} tokens. However, you requested "
                        f"{len(ids) + max_new} tokens ({len(ids)} in the messages, {max_new} in the completion).",
                        400))
                interval = max(stub.stream_interval, body.get("stream_interval") or 1)
                stops = set(body.get("stop_token_ids") or [])
                with_ids = bool(body.get("return_token_ids"))

                def line(new: list[int], text: str, reason: str | None, first: bool, whole: str,
                         matched: str | None) -> dict:  # fmt: skip
                    choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": reason,
                                              "stop_reason": matched}
                    if with_ids:
                        choice["token_ids"] = new
                        if first:
                            choice["prompt_token_ids"] = ids
                    return {"id": "cmpl-1", "object": "text_completion", "model": stub.model, "choices": [choice]}

                self.stream(body.get("request_id", "?"), ids, max_new, stops, body.get("stop") or [], interval, drop,
                            line, primed=True)

            def generate(self, body: dict, drop: int | None) -> None:
                ids, params = body["input_ids"], body["sampling_params"]
                max_new = params["max_new_tokens"]
                if len(ids) >= stub.context or len(ids) + max_new > stub.context:  # the tokenizer manager's check
                    message = f"Requested token count exceeds the model's maximum context length of {stub.context}"
                    return self.reply(400, {"error": {"message": message, "code": 400}})
                # the scheduler's silent clip: max_req_len - prompt - 1, max_req_len = context - 1
                max_new = min(max_new, stub.context - 1 - len(ids) - 1)
                made: list[int] = []

                def line(new: list[int], text: str, reason: str | None, first: bool, whole: str,
                         matched: str | None) -> dict:  # fmt: skip
                    made.extend(new)
                    finish = ({"type": reason, "matched": matched} if matched else {"type": reason}) if reason else None
                    meta = {"prompt_tokens": len(ids), "completion_tokens": len(made), "cached_tokens": 0,
                            "finish_reason": finish}
                    return {"text": whole, "output_ids": list(made), "meta_info": meta}

                self.stream(body.get("rid", "?"), ids, max_new, set(params.get("stop_token_ids") or []),
                            params.get("stop") or [], stub.stream_interval, drop, line)

            def stream(self, rid: str, prompt: list[int], max_new: int, stops: set[int], stop_strs: list[str],
                       interval: int, drop: int | None, line: Any, primed: bool = False) -> None:
                """Stop strings end the output at the id that completes one, the text before it (both
                servers' default); while they are set, a streamed text holds back the last characters a
                stop string might still begin with (vLLM's detokenizer's stop buffer). `primed`: the text
                is a DecodeStream's primed with the prompt's ids (vLLM's), else the output ids' own."""
                decoder = DecodeStream(ids=prompt, skip_special_tokens=True) if primed else None
                streamed = ""
                stop_strs = [stop_strs] if isinstance(stop_strs, str) else list(stop_strs)
                hold = max((len(x) for x in stop_strs), default=1) - 1
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                out: list[int] = []
                sent, shown, lines = 0, "", 0
                try:
                    while True:
                        token = next_id(prompt + out, len(stub.tokenizer), stub.eos)
                        out.append(token)
                        time.sleep(stub.step_s)
                        reason = "stop" if token in stops or token == stub.eos else \
                            "length" if len(out) >= max_new else None
                        body = out[:-1] if reason == "stop" else out  # the stop id is not detokenized
                        if decoder is None:
                            text = stub.tokenizer.decode(body, skip_special_tokens=True)
                        else:
                            if reason != "stop":
                                streamed += decoder.step(stub.tokenizer.backend_tokenizer, token) or ""
                            text = streamed
                        hits = [(text.find(x), x) for x in stop_strs if x in text] if reason != "stop" else []
                        matched = min(hits)[1] if hits else None
                        if matched is not None:
                            reason, text = "stop", text[: text.find(matched)]
                        if reason is None and len(out) - sent < interval:
                            continue
                        if reason is None and hold:
                            text = text[: max(len(shown), len(text) - hold)]
                        self.chunk(line(out[sent:], text[len(shown):], reason, sent == 0, text, matched))
                        sent, shown, lines = len(out), text, lines + 1
                        if drop is not None and lines >= drop:  # the server's process dies, say
                            self.connection.shutdown(socket.SHUT_RDWR)
                            self.close_connection = True
                            return
                        if reason is not None:
                            self.write(b"data: [DONE]\n\n")
                            self.write(b"")
                            with stub.lock:
                                stub.finished.append(rid)
                            return
                except (BrokenPipeError, ConnectionResetError, OSError):
                    with stub.lock:
                        stub.aborted.append(rid)

            def chunk(self, doc: dict) -> None:
                self.write(f"data: {json.dumps(doc)}\n\n".encode())

            def write(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

        server = StandInServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True, name="server-stub").start()
        return server, f"http://127.0.0.1:{server.server_address[1]}"


def server_info(stub: Stub) -> dict:
    """What SGLang's /server_info, or vLLM's in dev mode, says of the stub's limits (the fields fleet reads)."""
    if stub.api == "sglang":
        state = {"effective_max_running_requests_per_dp": stub.running,
                 "memory_usage": {"token_capacity": stub.kv_tokens}}
        return {"dp_size": 1, "max_running_requests": stub.running, "internal_states": [state]}
    return {"vllm_config": {"scheduler_config": {"max_num_seqs": stub.running},
                            "parallel_config": {"data_parallel_size": 1},
                            "cache_config": {"block_size": 16, "num_gpu_blocks": stub.kv_tokens // 16}}}


def error(message: str, code: int) -> dict:
    """vLLM's ErrorResponse body."""
    kind = "BadRequestError" if code == 400 else "NotFoundError" if code == 404 else "InternalServerError"
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}
