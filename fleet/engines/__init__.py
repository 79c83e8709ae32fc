"""Inference engines (sim, hf, sglang, vllm), one package each; fleet.engines.registry names them."""
