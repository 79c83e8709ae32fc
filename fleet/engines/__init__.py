"""Inference engines (sim, hf, sglang, vllm, server), one package each; fleet.engines.registry names them."""
