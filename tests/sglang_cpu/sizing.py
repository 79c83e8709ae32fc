"""SGLang 0.5.23's own pool sizing, run on a CPU for the kwargs `fleet engine-args` gives.

    python sizing.py IN.json OUT.json      IN: {"model": DIR, "cases": [{"gpu", "radix", "weight_bytes"}]}

Builds ServerArgs from fleet's kwargs as the GPU host would, then runs SGLang's ModelConfig,
its spec-aux resolution (which decides whether the NEXTN draft's KV is in the per-token cost),
`_handle_max_mamba_cache` and `resolve_max_num_reqs` on the memory a GPU of that size has left
once the weights (WEIGHT_BYTES, what was resident when SGLang takes the budget) are loaded.
What a CPU resolves differently from a GPU is set back to the GPU's choice: the overlap
scheduler with speculation, and extra_buffer's state snapshots. Run it in its own process:
it sets SGLang's process-wide runtime context (each case replaces it).
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path


def main() -> None:
    spec_in = json.loads(Path(sys.argv[1]).read_text())
    results = [size(spec_in["model"], c["gpu"], c["radix"], c["weight_bytes"]) for c in spec_in["cases"]]
    Path(sys.argv[2]).write_text(json.dumps(results))


def size(model: str, gpu: str, radix: bool, weight_bytes: float) -> dict:
    import sglang.srt.arg_groups.mamba_hook as mamba_hook
    import sglang.srt.arg_groups.speculative_hook as speculative_hook

    # a GPU keeps the overlap scheduler with NEXTN and has Mamba state snapshots
    speculative_hook._disable_overlap_schedule_for_cpu = lambda server_args: None
    mamba_hook._platform_supports_mamba_cache_extra_buffer = lambda: True

    from sglang.srt.configs.hybrid_arch import hybrid_gdn_config, hybrid_kda_config, mambaish_config
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator, mm_runtime_reservation_gb
    from sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state import (
        resolve_spec_aux_hidden_state_config,
    )
    from sglang.srt.runtime_context import get_context, get_schedule
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from fleet.engines.sglang.engine import engine_kwargs
    from fleet.model.capacity import CUDA_CONTEXT_MIB, MIB, kv_bytes_per_token
    from fleet.model.gpus import gpu_memory_mib
    from fleet.settings import Settings

    settings = Settings(engine="sglang", model=model, sglang={"radix_cache": "on" if radix else "auto"})
    kwargs = engine_kwargs(settings, gpu)
    args = ServerArgs(**kwargs, device="cpu")
    args.resolve_once()
    get_context().set_server_args(args)
    config = ModelConfig.from_server_args(args)
    spec = SpeculativeAlgorithm.from_string(kwargs.get("speculative_algorithm"))
    aux = resolve_spec_aux_hidden_state_config(
        server_args=args, model_config=config, spec_algorithm=spec, is_draft_worker=False
    )
    # the attributes the sizing methods read, as ModelRunner sets them for tp=pp=dp=1
    kvc = types.SimpleNamespace(
        mambaish_config=mambaish_config(config), hybrid_gdn_config=hybrid_gdn_config(config),
        hybrid_kda_config=hybrid_kda_config(config), pp_size=1, attn_dp_size=1, spec_algorithm=spec,
        model_config=config, extra_mamba_cache_bytes_per_req=0, fused_entry_bytes=lambda name: None,
    )  # fmt: skip
    kvc._calculate_mamba_ratio = types.MethodType(KVCacheConfigurator._calculate_mamba_ratio, kvc)

    # _profile_available_bytes, with the GPU's free memory after the weights loaded
    pre_load_gb = (gpu_memory_mib(gpu) - CUDA_CONTEXT_MIB) * MIB / (1 << 30)
    available_gb = pre_load_gb - weight_bytes / (1 << 30)
    slack_gb = pre_load_gb * (1 - get_schedule().mem_fraction_static)
    mm_gb = mm_runtime_reservation_gb(is_multimodal=config.is_multimodal, mm_feature_transport=None)
    rest_gb = KVCacheConfigurator._handle_max_mamba_cache(kvc, available_gb - slack_gb - mm_gb)
    if aux.eagle_draft_num_layers:  # pool_configurator.py: the draft's layers join the cell
        raise SystemExit("this model's draft KV is in the per-token cost: extend the cell")
    cell = kv_bytes_per_token(json.loads((Path(model) / "config.json").read_text()))
    tokens = int(rest_gb * (1 << 30) // cell)
    return {
        "gpu": gpu,
        "radix": radix,
        "kwargs": kwargs,
        "eagle_draft_num_layers": aux.eagle_draft_num_layers,
        "state_bytes_per_slot": kvc.mambaish_config.mamba2_cache_params.mamba_cache_per_req,
        "state_slots": get_schedule().max_mamba_cache_size,
        "slots_per_request": kvc._calculate_mamba_ratio(),
        "kv_tokens": tokens,
        "max_running_requests": KVCacheConfigurator.resolve_max_num_reqs(kvc, tokens),
        "is_multimodal": config.is_multimodal,
    }


if __name__ == "__main__":
    main()
