"""A bare `vllm.LLM`, for the vllm tests to compare fleet's records with: greedy output ids (and
their text) for given prompt ids and engine kwargs. Its own script because vLLM spawns its engine
core process, which re-imports the main module (hence the `__main__` guard).

    python tests/vllm_bare.py SPEC.json OUT.json
    # SPEC: {"kwargs": {...}, "prompts": [[ids]], "max_tokens": N, "stop_token_ids": [...]}
    # OUT: [{"ids": [output ids], "text": its text}, ...] (a file: vLLM writes its own lines to
    # stdout, even at exit)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(spec_path: str, out_path: str) -> None:
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec = json.loads(Path(spec_path).read_text())
    llm = LLM(**spec["kwargs"])
    params = SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"], stop_token_ids=spec["stop_token_ids"])
    outs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in spec["prompts"]], params, use_tqdm=False)
    got = [{"ids": list(o.outputs[0].token_ids), "text": o.outputs[0].text} for o in outs]
    Path(out_path).write_text(json.dumps(got))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
