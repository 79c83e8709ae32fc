"""What token capture costs in the results: bytes per record, stored as fleet stores them
(a chunk of JSON lines, zstd level 3), and the total at the reference job's size.

The token formats need the output ids (stored with `return_output_ids`) and the exact
prompt ids. Prompt ids are not stored: pre-tokenized input keeps them in its chunk object,
and rendered prompts are rebuilt at export and checked against a 16-hex-digit digest of
what the engine saw (`prompt_digest`). This prints that choice's cost next to the
alternative of storing prompt ids in every record.

Token ids are drawn log-uniformly over a Qwen-sized vocabulary (BPE vocabularies give
frequent tokens low ids, so real ids are mostly short numbers) and, as a worst case,
uniformly; the text is the sim engine's words, about five bytes a token.
"""

from __future__ import annotations

import random
from typing import Any

from fleet.bench.reference import REFERENCE
from fleet.engines.sim.tokenchain import sim_text
from fleet.records import OutputRecord, prompt_digest
from fleet.store.results import ChunkStats, encode_result, sample_counts

QWEN_VOCAB = 151_936


def _ids(rng: random.Random, n: int, uniform: bool) -> list[int]:
    if uniform:
        return [rng.randrange(QWEN_VOCAB) for _ in range(n)]
    return [int(QWEN_VOCAB ** rng.random()) - 1 for _ in range(n)]


def _row(pos: int, rng: random.Random, output_tokens: int, prompt_ids: list[int], variant: str,
         uniform: bool) -> dict[str, Any]:
    text = sim_text(pos, output_tokens)
    reasoning, _, answer = text.removeprefix("<think>").partition("</think>")
    row = OutputRecord(
        id=f"prompt-{pos:07d}", output=answer, reasoning=reasoning, prompt_tokens=len(prompt_ids),
        completion_tokens=output_tokens, finish_reason="stop", chunk=0, worker="gpu0@host", model="Qwen3.6-27B",
        latency_s=41.5, pos=pos,
    ).model_dump(mode="json")
    if variant != "text":
        row["output_ids"] = _ids(rng, output_tokens, uniform)
        row["prompt_digest"] = prompt_digest(prompt_ids)
    if variant == "prompt ids stored":
        row["prompt_ids"] = prompt_ids
    return row


def measure(records: int = 256, output_tokens: int = int(REFERENCE.output_tokens), prompt_tokens: int = 512,
            seed: int = 0) -> list[dict[str, Any]]:
    """Bytes per record of one chunk of `records` for each variant, and the reference total."""
    out = []
    for uniform in (False, True):
        for variant in ("text", "output ids + digest", "prompt ids stored"):
            rng = random.Random(seed)
            rows = [_row(p, rng, output_tokens, _ids(rng, prompt_tokens, uniform), variant, uniform)
                    for p in range(records)]
            data = encode_result(ChunkStats(**sample_counts(rows)), rows)
            per_record = len(data) / records
            out.append({
                "ids": "uniform" if uniform else "log-uniform", "variant": variant,
                "bytes_per_record": round(per_record), "reference_gb": round(per_record * REFERENCE.prompts / 1e9, 2),
            })
    return out
