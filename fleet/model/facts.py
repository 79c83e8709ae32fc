"""The facts about a model that shape outputs: its identity, its end ids and the job's sampling.

The job's sampling takes its defaults from the model's `generation_config.json` because neither
SGLang's nor vLLM's engine path applies it; it is resolved once, at enqueue, into the job's manifest,
and engines take nothing from the model but its end ids (docs/architecture.md, "Sampling").
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
from fleet.records import NEUTRAL
from fleet.settings import Settings


def model_facts(settings: Settings) -> dict[str, Any]:
    """Model identity and the job's sampling for its manifest (and its config hash)."""
    model = require_model(settings)
    sampling, max_tokens_from = _job_sampling(model, settings.sampling.model_dump_json())
    return copy.deepcopy({"model": model_fingerprint(model), "sampling": sampling, "max_tokens_from": max_tokens_from})


@lru_cache(maxsize=8)
def model_fingerprint(model: str) -> dict[str, Any]:
    """What names the model's files: its path and name, its revision and its chat template's hash."""
    tokenizer = load_tokenizer(model)
    template = tokenizer.chat_template
    if template is not None and not isinstance(template, str):
        template = json.dumps(template, sort_keys=True)
    return {
        "path": model,
        "name": Path(model).name or model,
        "revision": model_revision(resolve_model_dir(model)),
        "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest() if template else None,
    }


@lru_cache(maxsize=8)
def _job_sampling(model: str, sampling_json: str) -> tuple[dict[str, Any], str]:
    """The job's sampling (and where its max_tokens came from), its settings' `sampling_json` over the model's."""
    model_dir = resolve_model_dir(model)
    gen = generation_config(model_dir)
    return job_sampling(json.loads(sampling_json), gen, model_dir, _end_ids(gen, load_tokenizer(model)))


def job_sampling(job: dict[str, Any], gen: Any, model_dir: Path | None,
                 eos_token_ids: list[int]) -> tuple[dict[str, Any], str]:
    """The job's sampling for its manifest, the one resolution every engine's spec calls (the sim's too):
    the settings' `job` sampling over the model's generation config `gen` (None: a model without one,
    as the sim), every sampler neither sets off (NEUTRAL), max_tokens' one default
    (fleet.model.outputlen, from `model_dir`), and the end ids. Returns it and where max_tokens came from."""
    max_tokens, max_tokens_from = default_max_tokens(model_dir, job["max_tokens"])
    return effective_sampling(gen, job, max_tokens) | {"eos_token_ids": list(eos_token_ids)}, max_tokens_from


def generation_config(model_dir: Path) -> Any:
    """The model's generation_config.json; an empty one where it has none (it sets no defaults)."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(str(model_dir))
    except OSError:
        return GenerationConfig()


def effective_sampling(gen: Any, job: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """generation_config.json values (`gen`; None: no model defaults), overridden by the job's non-None
    settings; `max_tokens` is the one fleet.model.outputlen resolved."""
    out: dict[str, Any] = {}
    for key, neutral in NEUTRAL.items():
        value = job.get(key)
        if value is None:
            value = getattr(gen, key, None)
        out[key] = neutral if value is None else value
    if job.get("temperature") is None and getattr(gen, "do_sample", None) is False:
        out["temperature"] = 0.0  # the model asks for greedy decoding
    out.update(max_tokens=max_tokens, n=job["n"], stop=job.get("stop"))
    return out


def _end_ids(gen: Any, tokenizer: Any) -> list[int]:
    eos = gen.eos_token_id if gen.eos_token_id is not None else tokenizer.eos_token_id
    return sorted({eos} if isinstance(eos, int) else set(eos or ()))


@lru_cache(maxsize=8)
def model_end_ids(model: str) -> tuple[int, ...]:
    """The ids that end a sample: generation_config.json's eos ids, else the tokenizer's. The one
    thing an engine takes from the model's defaults: a request's sampling comes whole (fleet.records)."""
    return tuple(_end_ids(generation_config(resolve_model_dir(model)), load_tokenizer(model)))
