"""The planner: the worked example of docs/architecture.md and the roofline's physics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fleet.errors import ConfigError
from fleet.model.gpus import GPU_TABLE
from fleet.tools.jobplan import (
    ModelFacts,
    kv_bytes_per_token,
    make_plan,
    model_facts_from_dir,
    recurrent_state_bytes,
)
from tests.cliload import cli_app

WORKED = [
    "plan", "--gpus", "6", "--gpu", "b200", "--usd-per-gpu-hour", "5.49",
    "--prompts", "902087", "--output-tokens", "1818", "--tok-s-per-gpu", "3000",
]  # fmt: skip


def test_worked_example_numbers() -> None:
    # Given the reference job on 6 x B200, When planned, Then the docs/architecture.md figures come out.
    p = make_plan(
        gpus=6, gpu="b200", usd_per_gpu_hour=5.49, prompts=902087, output_tokens=1818,
        tok_s_per_gpu=3000,
    )  # fmt: skip
    assert p.fleet_tok_s == 18_000
    assert p.usd_per_hour == pytest.approx(32.94)
    assert p.total_output_tokens == pytest.approx(1.64e9, rel=1e-3)
    assert p.wall_hours == pytest.approx(25.3, abs=0.05)
    assert p.cost_usd == pytest.approx(833, abs=1.0)
    assert p.usd_per_m_output_tokens == pytest.approx(0.51, abs=0.005)
    assert p.roofline is None and p.basis == "estimate"


def test_worked_example_cli_json_and_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEET_USD_PER_GPU_HOUR", raising=False)
    runner = CliRunner()
    res = runner.invoke(cli_app(), [*WORKED, "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["fleet_tok_s"] == 18_000
    assert round(data["wall_hours"], 1) == 25.3
    assert round(data["cost_usd"]) in (833, 834)
    assert round(data["usd_per_m_output_tokens"], 2) == 0.51
    res = runner.invoke(cli_app(), WORKED)
    assert res.exit_code == 0, res.output
    for text in ("18,000 tok/s", "25.3 hours", "$833.66", "$0.508", "$32.94/hour"):
        assert text in res.stdout


def test_roofline_weights_only_is_bandwidth_over_weight_bytes() -> None:
    # Given a 27B BF16 model with no KV, When decoding at batch 1 on a B200,
    # Then one step reads 54 GB at 8 TB/s: 6.75 ms, ~148 tok/s.
    p = make_plan(
        gpus=1, gpu="b200", usd_per_gpu_hour=1, prompts=1, output_tokens=100, tok_s_per_gpu=100,
        model=ModelFacts(params_b=27, batch=1),
    )  # fmt: skip
    r = p.roofline
    assert r is not None
    assert r.step_ms == pytest.approx(6.75)
    assert r.memory_tok_s == pytest.approx(1 / 0.00675)
    assert r.bound == "memory"
    assert p.estimate_vs_roofline == pytest.approx(100 / r.tok_s)


def test_roofline_batch_amortises_weights_but_kv_does_not() -> None:
    def tok_s(batch: int, kv: float) -> float:
        facts = ModelFacts(params_b=27, batch=batch, kv_bytes_per_token=kv, context_tokens=2000)
        p = make_plan(
            gpus=1, gpu="h100", usd_per_gpu_hour=1, prompts=1, output_tokens=1, tok_s_per_gpu=1,
            model=facts,
        )  # fmt: skip
        assert p.roofline is not None
        return p.roofline.memory_tok_s

    # Without KV, tok/s grows linearly with the batch (weights read once per step).
    assert tok_s(64, 0) == pytest.approx(64 * tok_s(1, 0))
    # With KV, doubling the batch gains less than 2x, and the limit is bandwidth / KV per token.
    assert tok_s(512, 65536) < 2 * tok_s(256, 65536)
    limit = GPU_TABLE["h100"].hbm_tb_s * 1e12 / (65536 * 2000)
    assert tok_s(100_000, 65536) < limit
    assert tok_s(100_000, 65536) == pytest.approx(limit, rel=0.01)


def test_roofline_compute_bound_and_memory_fit() -> None:
    # A tiny model at a huge batch hits the FLOP/s ceiling, not bandwidth.
    p = make_plan(
        gpus=1, gpu="b200", usd_per_gpu_hour=1, prompts=1, output_tokens=1, tok_s_per_gpu=1,
        model=ModelFacts(params_b=1, batch=100_000),
    )  # fmt: skip
    assert p.roofline is not None and p.roofline.bound == "compute"
    assert p.roofline.tok_s == pytest.approx(2250e12 / 2e9)
    # A 100B BF16 model (200 GB) does not fit a 192 GB B200.
    big = make_plan(
        gpus=1, gpu="b200", usd_per_gpu_hour=1, prompts=1, output_tokens=1, tok_s_per_gpu=1,
        model=ModelFacts(params_b=100),
    )  # fmt: skip
    assert big.roofline is not None and not big.roofline.fits


def test_no_rate_falls_back_to_roofline_or_errors() -> None:
    p = make_plan(
        gpus=2, gpu="h200", usd_per_gpu_hour=3, prompts=10, output_tokens=10,
        model=ModelFacts(params_b=8, batch=32),
    )  # fmt: skip
    assert p.basis == "roofline" and p.roofline is not None
    assert p.fleet_tok_s == pytest.approx(2 * p.roofline.tok_s)
    with pytest.raises(ConfigError, match="tok-s-per-gpu"):
        make_plan(gpus=1, gpu="b200", usd_per_gpu_hour=1, prompts=1, output_tokens=1)
    with pytest.raises(ConfigError, match="unknown GPU kind 'a100'"):
        make_plan(gpus=1, gpu="a100", usd_per_gpu_hour=1, prompts=1, output_tokens=1, tok_s_per_gpu=1)


def test_cli_error_is_clear() -> None:
    res = CliRunner().invoke(cli_app(), ["plan", "--gpu", "a100", "--tok-s-per-gpu", "1"])
    assert res.exit_code == 2
    assert "unknown GPU kind" in res.output


def test_model_facts_from_a_hybrid_model_dir(tmp_path: Path) -> None:
    # Given a hybrid config (1 full-attention layer in 4) and a safetensors index,
    # When read, Then only the attention layers count for KV and the index gives the weights.
    config = {
        "architectures": ["Qwen3NextForCausalLM"],
        "text_config": {
            "num_hidden_layers": 48, "full_attention_interval": 4, "num_attention_heads": 16,
            "num_key_value_heads": 4, "head_dim": 256, "hidden_size": 4096,
            "linear_num_value_heads": 32, "linear_num_key_heads": 16, "linear_key_head_dim": 128,
            "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
        },
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    index = {"metadata": {"total_size": 54_000_000_000}, "weight_map": {}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    facts = model_facts_from_dir(tmp_path, batch=128)
    assert facts.kv_bytes_per_token == 2 * 12 * 4 * 256 * 2
    # 36 Gated-DeltaNet layers: an FP32 32 x 128 x 128 state and a 3-step conv window each.
    assert facts.state_bytes_per_request == 36 * (32 * 128 * 128 * 4 + (2 * 16 * 128 + 32 * 128) * 3 * 2)
    assert facts.params_b == pytest.approx(27)
    assert facts.batch == 128
    # A plain GQA model: every layer has KV.
    dense = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096}
    assert kv_bytes_per_token(dense) == 2 * 32 * 8 * 128 * 2
    assert recurrent_state_bytes(dense) == 0
    res = CliRunner().invoke(
        cli_app(), ["plan", "--prompts", "10", "--output-tokens", "100", "--model", str(tmp_path), "--json"]
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["basis"] == "roofline"


def test_a_plan_of_workers_spanning_gpus_counts_each_gpus_share(monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet.cli import app

    qwen = str(Path(__file__).parent / "fixtures" / "qwen3_6_27b")
    args = ["plan", "--gpus", "8", "--gpu", "h100", "--model", qwen, "--usd-per-gpu-hour", "2.5", "--json"]
    one = json.loads(CliRunner().invoke(app, args).stdout)
    two = json.loads(CliRunner().invoke(app, [*args, "--gpus-per-worker", "2"]).stdout)
    assert (one["gpus_per_worker"], two["gpus_per_worker"]) == (1, 2) and two["capacity"]["gpus"] == 2
    # per GPU: half the weights read each step, a batch the freed memory makes larger
    assert two["roofline"]["weight_bytes"] == pytest.approx(one["roofline"]["weight_bytes"] / 2)
    assert two["capacity"]["batch"] > 2 * one["capacity"]["batch"] and two["tok_s_per_gpu"] > one["tok_s_per_gpu"]
    refused = CliRunner().invoke(app, [*args, "--gpus-per-worker", "3"])
    assert refused.exit_code != 0 and "does not divide --gpus 8" in refused.output
