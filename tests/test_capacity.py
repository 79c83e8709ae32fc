"""The capacity model against figures worked by hand from a Qwen3.6-27B-shaped config.json.

The fixture is the text config the issue gives (64 layers, every 4th full attention, 24/4
heads of 256, GDN 16 key / 48 value heads of 128, conv 4, fp32 state, vocab 248,320, one
MTP layer) with a 27-layer 1,152-wide vision tower; hidden 5,120 and MLP 17,408 are the
27B's. Every expected number below is arithmetic written out, not read from the code.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fleet.engines.sglang.engine import engine_kwargs
from fleet.errors import ConfigError
from fleet.model.capacity import (
    GIB,
    MIB,
    Serving,
    capacity,
    kv_bytes_per_token,
    sglang_mem_fraction,
    state_bytes_per_slot,
    weight_bytes,
)
from fleet.model.gpus import gpu_spec
from fleet.settings import Settings

QWEN = Path(__file__).parent / "fixtures" / "qwen3_6_27b"
CONFIG = json.loads((QWEN / "config.json").read_text())
H200 = gpu_spec("h200").memory_mib


def test_a_state_slot_is_48_gdn_layers_of_fp32_state_and_a_bf16_conv_window() -> None:
    ssm = 48 * 128 * 128 * 4  # value heads x key dim x value dim, fp32
    conv = (2 * 16 * 128 + 48 * 128) * 3 * 2  # conv over q, k, v; kernel - 1 steps; bf16
    assert state_bytes_per_slot(CONFIG) == 48 * (ssm + conv)
    assert state_bytes_per_slot(CONFIG) / MIB == pytest.approx(146.8, abs=0.05)


def test_kv_is_kept_by_the_16_full_attention_layers_only() -> None:
    assert kv_bytes_per_token(CONFIG) == 2 * 16 * 4 * 256 * 2 == 64 * 1024
    assert kv_bytes_per_token(CONFIG, mtp=True) == 2 * 17 * 4 * 256 * 2  # the MTP layer's own KV


def test_weights_count_text_layers_embeddings_vision_tower_and_mtp() -> None:
    h, v = 5120, 248_320
    attn = h * 24 * 256 * 2 + 2 * h * 4 * 256 + 24 * 256 * h  # gated q, k, v, o
    gdn = h * (2 * 2048 + 2 * 6144 + 2 * 48) + (2 * 2048 + 6144) * 4 + 6144 * h
    mlp = 3 * h * 17408
    vision = 27 * (4 * 1152**2 + 2 * 1152 * 4304) + 4608 * 4608 + 4608 * 5120
    text = 2 * v * h + 16 * (attn + mlp) + 48 * (gdn + mlp)
    assert weight_bytes(CONFIG) == 2 * (text + vision)
    # MTP: the draft layer, its fc, and its own (untied) embedding and lm_head, resident while
    # SGLang takes the budget (swapped for the target's only after, in init_lm_head)
    assert weight_bytes(CONFIG, mtp=True) - weight_bytes(CONFIG) == 2 * (attn + mlp + 2 * h * h + 2 * v * h)
    assert 2 * 2 * v * h / GIB == pytest.approx(4.74, abs=0.01)  # the draft embedding and lm_head alone
    assert weight_bytes(CONFIG) - weight_bytes(CONFIG, vision=False) == 2 * vision  # language_model_only
    assert 27e9 < weight_bytes(CONFIG) / 2 < 28e9  # a "27B" with its vision tower


def test_radix_on_costs_5_state_slots_per_request_and_caps_the_batch_on_an_h200() -> None:
    # mem_fraction_static 0.905 of (143,771 - 1,024) MiB, less weights and the 100 MiB VLM cache
    rest = (H200 - 1024) * MIB * 0.905 - weight_bytes(CONFIG) - 100 * MIB
    slot = state_bytes_per_slot(CONFIG)
    pool = rest * 0.9 / 1.9  # mamba_full_memory_ratio 0.9: r / (1 + r) of the rest
    slots = int((pool - slot) // slot)

    cap = capacity(CONFIG, H200, Serving(mtp=False, radix=True, mem_fraction_static=0.905, context_tokens=2818))

    assert cap.state_slots == slots
    assert cap.state_slots_per_request == 5  # 3 + 2 extra_buffer tracking slots (overlap)
    assert cap.max_running_requests == slots // 5 == 49
    # With MTP: 4 draft tokens' intermediate states per request on top, joint solve
    mtp = capacity(CONFIG, H200, Serving(mtp=True, radix=True, mem_fraction_static=0.905, context_tokens=2818))
    rest_mtp = (H200 - 1024) * MIB * 0.905 - weight_bytes(CONFIG, mtp=True) - 100 * MIB
    pool_mtp = rest_mtp * 0.9 / 1.9
    assert mtp.state_slots == int((pool_mtp - slot * 5) // (slot * (1 + 4 / 5)))
    assert mtp.max_running_requests == mtp.state_slots // 5
    assert 20 <= mtp.max_running_requests <= 40  # the estimate by hand


def test_radix_off_fills_memory_with_one_slot_per_request_and_their_kv() -> None:
    cap = capacity(CONFIG, H200, Serving(mtp=False, radix=False, mem_fraction_static=0.905, context_tokens=2818))
    rest = (H200 - 1024) * MIB * 0.905 - weight_bytes(CONFIG) - 100 * MIB
    slot, per_req_kv = state_bytes_per_slot(CONFIG), 64 * 1024 * 2818

    assert cap.state_slots_per_request == 1
    assert cap.max_running_requests == int((rest - slot) // (slot + per_req_kv))
    assert cap.batch == min(cap.max_running_requests, cap.kv_bound_requests)
    assert cap.batch > 4 * capacity(CONFIG, H200, Serving(mtp=False, radix=True, context_tokens=2818)).batch
    assert cap.weights_gib == pytest.approx(weight_bytes(CONFIG) / GIB)


def test_a_worker_spanning_two_gpus_holds_half_of_everything_on_each_and_runs_a_batch_many_times_larger() -> None:
    # Qwen3.6-27B on H100s, MTP on, radix off (fleet's defaults for unique prompts): 8 workers of one GPU
    # against 4 workers of two (tensor parallel; docs: ops/runbook.md)
    h100 = gpu_spec("h100").memory_mib
    one = capacity(CONFIG, h100, Serving(mtp=True, radix=False, context_tokens=2818))
    two = capacity(CONFIG, h100, Serving(mtp=True, radix=False, context_tokens=2818, tp=2))
    # each GPU holds half the weights, half of every request's KV heads (4 KV heads: 2 each) and state
    assert two.gpus == 2 and two.weights_gib == pytest.approx(one.weights_gib / 2)
    assert two.kv_kib_per_token == pytest.approx(one.kv_kib_per_token / 2)
    assert two.state_mib_per_slot == pytest.approx(one.state_mib_per_slot / 2)
    # the weights no longer fill the card: four workers of two run far more requests than eight of one
    assert 4 * two.batch > 4 * 8 * one.batch
    # KV heads never split finer than one per GPU
    eight = capacity(CONFIG, h100, Serving(mtp=True, radix=False, context_tokens=2818, tp=8))
    assert eight.kv_kib_per_token == pytest.approx(one.kv_kib_per_token / 4)


def test_an_asked_batch_is_kept_when_it_fits_and_refused_when_weights_leave_nothing() -> None:
    cap = capacity(CONFIG, H200, Serving(mtp=False, radix=False, max_running_requests=32))
    assert cap.max_running_requests == 32 and cap.state_slots == 32
    with pytest.raises(ConfigError, match="lower sglang.max_running_requests"):
        capacity(CONFIG, H200, Serving(mtp=True, radix=False, max_running_requests=256))
    with pytest.raises(ConfigError, match="leave no memory"):
        capacity(CONFIG, 40 * 1024, Serving(mem_fraction_static=0.8))


def test_sglangs_own_headroom_without_its_vlm_cut() -> None:
    # 512 + 8192 x 1.5 + 128 + 256 x 2 + 256 = 13,696 MiB reserved on an H200
    assert sglang_mem_fraction(H200) == round((H200 - 13_696) / H200, 3) == 0.905
    # B200: 16k chunked prefill and 512 decode graphs
    b200 = gpu_spec("b200").memory_mib
    assert sglang_mem_fraction(b200) == round((b200 - (512 + 16384 * 1.5 + 128 + 1024 + 256)) / b200, 3)


def test_engine_args_for_a_named_gpu_use_the_capacity_model() -> None:
    settings = Settings(engine="sglang", model=str(QWEN))
    kwargs = engine_kwargs(settings, "h200")
    cap = capacity(CONFIG, H200, Serving(mtp=True, radix=False, context_tokens=4096))

    assert "language_model_only" not in kwargs  # SGLang 0.5.23 refuses it for Qwen3.5/3.6
    assert kwargs["max_running_requests"] == cap.batch
    assert kwargs["mem_fraction_static"] == 0.905
    assert kwargs["disable_radix_cache"] is True


def test_plan_json_has_the_capacity_and_the_roofline_at_that_batch() -> None:
    from fleet.cli import app

    args = ["plan", "--model", str(QWEN), "--gpu", "b200", "--gpus", "6", "--prompts", "902087",
            "--output-tokens", "1818", "--prompt-tokens", "1000", "--usd-per-gpu-hour", "5.49", "--no-mtp"]  # fmt: skip
    res = CliRunner().invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    cap = data["capacity"]
    for key in ("weights_gib", "kv_kib_per_token", "state_mib_per_slot", "state_slots_per_request"):
        assert cap[key] > 0
    assert cap["kv_kib_per_token"] == 64 and cap["state_slots_per_request"] == 1
    want = capacity(CONFIG, gpu_spec("b200").memory_mib, Serving(mtp=False, radix=False, context_tokens=2818))
    assert cap["max_running_requests"] == want.max_running_requests
    # Radix on: a fifth of the batch, so the roofline (and the bill) grows
    on = json.loads(CliRunner().invoke(app, [*args, "--radix", "on", "--json"]).stdout)
    assert on["capacity"]["state_slots_per_request"] == 5
    assert on["wall_hours"] > data["wall_hours"]
    text = CliRunner().invoke(app, args).stdout
    assert "sglang capacity" in text and f"{cap['batch']} requests at once" in text


def test_the_launcher_sizes_k_and_every_worker_from_the_planned_batch(tmp_path: Path, monkeypatch) -> None:
    from fleet.worker.supervisor.launcher import Supervisor, plan_workers

    # Given a host whose nvidia-smi lists two H200s, and no max_running_requests set
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nprintf '0, NVIDIA H200, {H200} MiB\\n1, NVIDIA H200, {H200} MiB\\n'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    settings = Settings(engine="sglang", model=str(QWEN), chunk_size=64)

    # When the launcher plans the workers
    supervisor = Supervisor(settings, plan_workers(settings, None, [0, 1]))

    # Then S is the capacity model's batch for an H200, and K follows it, not the 256 default
    planned = capacity(CONFIG, H200, Serving(mtp=True, radix=False, context_tokens=4096)).batch
    assert supervisor.settings.sglang.max_running_requests == planned < 256
    assert supervisor.concurrency == -(-16 * planned // 64)
    assert supervisor.settings.to_env()["FLEET_SGLANG__MAX_RUNNING_REQUESTS"] == str(planned)


def test_cpu_workers_run_the_torch_threads_their_engine_asks_for(monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet.engines.sglang.spec import CPU_THREADS
    from fleet.worker.supervisor.launcher import plan_workers

    # Given no OMP_NUM_THREADS in the operator's environment
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    # When one CPU worker is planned for each engine
    threads = {engine: {spec.env["OMP_NUM_THREADS"] for spec in plan_workers(Settings(engine=engine), 1, None)}
               for engine in ("sglang", "sim")}  # fmt: skip
    # Then SGLang's scheduler runs its one thread; an engine that asks for none takes every core
    assert threads["sglang"] == {str(CPU_THREADS)}
    assert threads["sim"] == {str(os.cpu_count() or 1)}
    # And an operator's own OMP_NUM_THREADS still wins
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert {spec.env["OMP_NUM_THREADS"] for spec in plan_workers(Settings(engine="sglang"), 1, None)} == {"3"}


def test_language_model_only_drops_the_vision_tower_where_sglang_takes_it(tmp_path: Path) -> None:
    from fleet.engines.sglang.plan import LANGUAGE_MODEL_ONLY_ARCHITECTURES

    # Qwen3.6: SGLang 0.5.23 refuses the flag, so unset means off and asking for it is an error
    assert "language_model_only" not in engine_kwargs(Settings(engine="sglang", model=str(QWEN)), "h200")
    with pytest.raises(ConfigError, match="language_model_only: SGLang 0.5.23 refuses it"):
        engine_kwargs(Settings(engine="sglang", model=str(QWEN), sglang={"language_model_only": True}), "h200")
    # A vision-language architecture SGLang takes it for: on by default (no job has images), and
    # the plan loses the tower's weights and the multimodal reserve
    arch = sorted(LANGUAGE_MODEL_ONLY_ARCHITECTURES)[0]
    (tmp_path / "config.json").write_text(json.dumps({**CONFIG, "architectures": [arch]}))
    on = Settings(engine="sglang", model=str(tmp_path), sglang={"mtp": False})
    assert engine_kwargs(on, "h200")["language_model_only"] is True
    off = on.model_copy(update={"sglang": on.sglang.model_copy(update={"language_model_only": False})})
    assert "language_model_only" not in engine_kwargs(off, "h200")
    lean = capacity(CONFIG, H200, Serving(mtp=False, language_model_only=True))
    full = capacity(CONFIG, H200, Serving(mtp=False))
    assert full.weights_gib - lean.weights_gib == pytest.approx(
        (weight_bytes(CONFIG) - weight_bytes(CONFIG, vision=False)) / GIB
    )
    assert lean.kv_tokens > full.kv_tokens
