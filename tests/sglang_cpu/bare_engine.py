"""A plain `sglang.Engine`, no fleet: the reference a test compares fleet's records with, and
the probe that shows which of the stand-in's edges (tests/fake_sglang) the real engine has.

    python bare_engine.py IN.json OUT.json

IN: {"kwargs": {...Engine kwargs}, "greedy": [[ids, max_new], ...], "eos": [ids],
     "context_probe": [ids], "vocab_probe": [ids]}
OUT: what the engine answered, as JSON. Run it with tests/sglang_cpu on PYTHONPATH (the loader).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any


def error(e: BaseException) -> dict[str, Any]:
    return {"type": type(e).__name__, "message": str(e), "status_code": getattr(e, "status_code", None)}


async def probes(engine: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """On one loop, as fleet's worker does: the read-back, the refusals, an abort."""
    out: dict[str, Any] = {}
    states = await engine.tokenizer_manager.get_internal_state()
    out["internal_state"] = {
        "effective_max_running_requests_per_dp": states[0].get("effective_max_running_requests_per_dp"),
        "token_capacity": (states[0].get("memory_usage") or {}).get("token_capacity"),
    }
    try:  # the sync helper on a running loop
        engine.get_server_info()
        out["server_info_on_a_running_loop"] = None
    except BaseException as e:  # noqa: BLE001
        out["server_info_on_a_running_loop"] = error(e)
    out["context_length"] = engine.tokenizer_manager.context_len
    greedy = {"temperature": 0.0, "stop_token_ids": spec["eos"]}
    refusals = {
        "over_context": (spec["context_probe"], {**greedy, "max_new_tokens": 4}),
        "over_context_with_output": (spec["greedy"][0][0], {**greedy, "max_new_tokens": out["context_length"]}),
        # within the tokenizer manager's check, refused by the scheduler's (max_req_len - 5)
        "scheduler_input_limit": ([5] * (out["context_length"] - 6), {**greedy, "max_new_tokens": 1}),
        # sampled: greedy requests turn top_k into 1 before SamplingParams.verify looks at it
        "top_k_zero": (spec["greedy"][0][0], {"temperature": 1.0, "max_new_tokens": 4, "top_k": 0}),
    }
    out["refusals"] = {}
    for name, (ids, params) in refusals.items():
        try:
            res = await engine.async_generate(input_ids=ids, sampling_params=params)
            out["refusals"][name] = {"type": None, "finish_reason": res["meta_info"]["finish_reason"]}
        except BaseException as e:  # noqa: BLE001
            out["refusals"][name] = error(e)
    # An abort while the request is generating, as tokenizer_manager.abort_request does it: sent once its stream
    # has given a first output (it is generating then, whatever the machine's speed; no sleep decides it)
    try:
        stream = await engine.async_generate(input_ids=spec["greedy"][0][0], stream=True,
                                             sampling_params={**greedy, "max_new_tokens": 1500})
        last: dict[str, Any] = {}
        async for chunk in stream:
            if not last:
                for rid in list(engine.tokenizer_manager.rid_to_state):
                    engine.tokenizer_manager.abort_request(rid=rid)
            last = chunk
        meta = last["meta_info"]
        out["aborted"] = {"meta_info": meta, "output_tokens": meta["completion_tokens"]}
    except BaseException as e:  # noqa: BLE001
        out["aborted"] = error(e)
    return out


def main() -> None:
    import sglang

    spec = json.loads(Path(sys.argv[1]).read_text())
    root = logging.getLogger()
    mine = logging.StreamHandler(sys.stderr)
    root.addHandler(mine)
    began = time.monotonic()
    engine = sglang.Engine(**spec["kwargs"])
    out: dict[str, Any] = {"start_s": time.monotonic() - began}
    out["host_handler_kept"] = mine in root.handlers
    try:
        prompts = [ids for ids, _ in spec["greedy"]]
        params = [{"temperature": 0.0, "max_new_tokens": n, "stop_token_ids": spec["eos"]} for _, n in spec["greedy"]]
        began = time.monotonic()
        results = engine.generate(input_ids=prompts, sampling_params=params)
        out["greedy_s"] = time.monotonic() - began
        out["greedy"] = [
            {"output_ids": r["output_ids"], "text": r["text"], "finish_reason": r["meta_info"]["finish_reason"],
             "meta_keys": sorted(r["meta_info"])}
            for r in results
        ]  # fmt: skip
        out.update(engine.loop.run_until_complete(probes(engine, spec)))
    finally:
        engine.shutdown()
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
