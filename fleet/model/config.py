"""What a model's config.json says about its architecture, read without any engine installed:
where the file is (the directory, or the local hub cache) and whether the model keeps a recurrent
state per request (hybrid: mamba / linear-attention layers), which decides the prefix caches of
SGLang and vLLM alike.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: Architectures SGLang serves with a mamba (linear-attention) state, from sglang 0.5.23's
#: `_MAMBA_RADIX_CACHE_ARCHS`; `extra_buffer` is refused for any other model.
HYBRID_ARCHITECTURES = frozenset(
    {
        "Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM",
        "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
        "KimiLinearForCausalLM", "NemotronHForCausalLM", "FalconH1ForCausalLM",
        "JetNemotronForCausalLM", "Lfm2ForCausalLM", "Lfm2MoeForCausalLM",
        "BailingMoeV2_5ForCausalLM",
    }
)  # fmt: skip
#: Layer kinds that carry recurrent state in hybrid configs (`layer_types`); this also covers
#: architectures that are hybrid only in some configs (GraniteMoeHybrid).
STATEFUL_LAYERS = frozenset({"linear_attention", "mamba", "gated_deltanet"})


def is_hybrid(config: dict[str, Any]) -> bool:
    """Whether a model's config.json describes a model with mamba / linear-attention state."""
    for section in (config, config.get("text_config") or {}):
        if set(section.get("architectures") or ()) & HYBRID_ARCHITECTURES:
            return True
        if set(section.get("layer_types") or ()) & STATEFUL_LAYERS:
            return True
    return False


#: config.json keys holding the MTP (nextn) layers a checkpoint carries, at the top level or in text_config
MTP_LAYER_KEYS = ("mtp_num_hidden_layers", "num_nextn_predict_layers")


def mtp_layers(config: dict[str, Any]) -> int:
    """MTP layers the checkpoint carries (0: none, so no MTP speculation is possible)."""
    for section in (config, config.get("text_config") or {}):
        for key in MTP_LAYER_KEYS:
            if section.get(key):
                return int(section[key])
    return 0


def local_config(model: str) -> dict[str, Any]:
    """config.json from the model directory or the local hub cache; {} if neither has it.

    Never downloads: engine-args must answer on a machine without the model or a network.
    """
    path: Path | str | None = Path(model).expanduser() / "config.json"
    if not Path(path).is_file():
        try:
            from huggingface_hub import try_to_load_from_cache

            path = try_to_load_from_cache(model, "config.json")
        except Exception:  # not a valid repo id either
            path = None
    if not isinstance(path, (str, Path)) or not Path(path).is_file():
        log.warning("no config.json for %r: assuming a model without mamba state", model)
        return {}
    return json.loads(Path(path).read_text())


