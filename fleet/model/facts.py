"""The facts about a model that shape outputs: its identity and the effective sampling.

The effective sampling defaults come from the model's `generation_config.json` because
SGLang's Engine path does not apply it (docs/architecture.md).
"""

from __future__ import annotations

import copy
import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from fleet.model.modeldir import require_model, resolve_model_dir
from fleet.model.outputlen import default_max_tokens
from fleet.model.rendering import load_tokenizer
from fleet.model.revision import model_revision
from fleet.records import Sampling
from fleet.settings import Settings

#: Values that make a sampler a no-op, used when neither settings nor the model set one.
NEUTRAL = {
    "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
    "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
}  # fmt: skip


def fill_sampling(sampling: Sampling, defaults: dict[str, Any]) -> Sampling:
    """The request's sampling with unset fields taken from `model_facts(...)["sampling"]`."""
    from dataclasses import replace

    # .get: a manifest written before the penalties existed has none; unset means neutral.
    missing = {k: defaults.get(k) for k in NEUTRAL if getattr(sampling, k) is None}
    if sampling.stop is None and defaults.get("stop"):
        missing["stop"] = tuple(defaults["stop"])
    return replace(sampling, **missing)


def model_facts(settings: Settings) -> dict[str, Any]:
    """Model identity and effective sampling for the job manifest (and its config hash)."""
    model = require_model(settings)
    return copy.deepcopy(_model_facts(model, settings.sampling.model_dump_json()))


@lru_cache(maxsize=8)
def _model_facts(model: str, sampling_json: str) -> dict[str, Any]:
    model_dir = resolve_model_dir(model)
    tokenizer = load_tokenizer(model)
    template = tokenizer.chat_template
    if template is not None and not isinstance(template, str):
        template = json.dumps(template, sort_keys=True)
    job = json.loads(sampling_json)
    max_tokens, max_tokens_from = default_max_tokens(model_dir, job["max_tokens"])
    return {
        "model": {
            "path": model,
            "name": Path(model).name or model,
            "revision": model_revision(model_dir),
            "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest() if template else None,
        },
        "sampling": effective_sampling(model_dir, tokenizer, job, max_tokens),
        "max_tokens_from": max_tokens_from,
    }


def effective_sampling(model_dir: Path, tokenizer: Any, job: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """generation_config.json values, overridden by the job's non-None settings; `max_tokens`
    is the one fleet.model.outputlen resolved."""
    from transformers import GenerationConfig

    try:
        gen = GenerationConfig.from_pretrained(str(model_dir))
    except OSError:  # no generation_config.json: the model sets no defaults
        gen = GenerationConfig()
    out: dict[str, Any] = {}
    for key, neutral in NEUTRAL.items():
        value = job.get(key)
        if value is None:
            value = getattr(gen, key, None)
        out[key] = neutral if value is None else value
    if job.get("temperature") is None and gen.do_sample is False:
        out["temperature"] = 0.0  # the model asks for greedy decoding
    eos = gen.eos_token_id if gen.eos_token_id is not None else tokenizer.eos_token_id
    out.update(
        max_tokens=max_tokens,
        n=job["n"],
        stop=job.get("stop"),
        eos_token_ids=sorted({eos} if isinstance(eos, int) else set(eos or ())),
    )
    return out
