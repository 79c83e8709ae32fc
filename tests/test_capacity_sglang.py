"""fleet's capacity model against SGLang 0.5.23's own sizing functions, on a CPU.

tests/sglang_cpu/sizing.py runs SGLang's ModelConfig, spec-aux resolution, mamba state pool
(`_handle_max_mamba_cache`) and `resolve_max_num_reqs` for the kwargs `fleet engine-args` gives a
Qwen3.6-27B-shaped checkpoint on an H100, H200 and B200, MTP on (the default), radix cache off
(the default for unique prompts) and on. The weights resident when SGLang takes its budget are
fleet's figure (`weight_bytes`, the NEXTN draft's own embedding and lm_head included): a CPU
cannot load 27B parameters, so that term is checked by arithmetic in tests/test_capacity.py.
Runs in the sglang virtualenv (.ci/run); elsewhere it skips.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.engines.sglang.plan import plan_capacity
from fleet.model.capacity import kv_bytes_per_token, state_bytes_per_slot, weight_bytes
from fleet.settings import Settings
from tests.sglangcpu import LOADER_DIR, have_real_sglang, process_env

pytestmark = pytest.mark.skipif(not have_real_sglang(), reason="needs the real sglang (ops/sglang-venv.sh)")

QWEN = Path(__file__).parent / "fixtures" / "qwen3_6_27b"
CONFIG = json.loads((QWEN / "config.json").read_text())
GPUS = ("h100", "h200", "b200")


@pytest.fixture(scope="module")
def sglang_sizes(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], dict]:
    tmp = tmp_path_factory.mktemp("sizing")
    weights = weight_bytes(CONFIG, mtp=True)
    cases = [{"gpu": g, "radix": r, "weight_bytes": weights} for g in GPUS for r in (False, True)]
    (tmp / "in.json").write_text(json.dumps({"model": str(QWEN), "cases": cases}))
    proc = subprocess.run(
        [sys.executable, str(LOADER_DIR / "sizing.py"), str(tmp / "in.json"), str(tmp / "out.json")],
        env=process_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {(r["gpu"], r["radix"]): r for r in json.loads((tmp / "out.json").read_text())}


def plan(gpu: str, radix: bool):  # noqa: ANN201
    settings = Settings(engine="sglang", model=str(QWEN), sglang={"radix_cache": "on" if radix else "auto"})
    return plan_capacity(settings, gpu)


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("radix", [False, True], ids=["radix_off", "radix_on"])
def test_real_sglang_grants_what_fleet_asks_with_mtp(sglang_sizes, gpu: str, radix: bool) -> None:
    real = sglang_sizes[(gpu, radix)]
    cap = plan(gpu, radix)
    assert cap is not None
    # the kwargs SGLang sized are the defaults fleet sends: MTP on, the planned batch asked
    assert real["kwargs"]["speculative_algorithm"] == "NEXTN"
    assert real["kwargs"]["max_running_requests"] == cap.batch
    assert ("disable_radix_cache" in real["kwargs"]) is not radix
    # the NEXTN draft's KV is not in the per-token cost SGLang budgets (its pool is outside)
    assert real["eagle_draft_num_layers"] is None
    assert real["state_bytes_per_slot"] == state_bytes_per_slot(CONFIG)
    assert real["slots_per_request"] == cap.state_slots_per_request - 4  # + 4 draft-token copies
    # and SGLang's pools come out as fleet planned them, to the token: nothing asked is cut
    assert (real["state_slots"], real["kv_tokens"]) == (cap.state_slots, cap.kv_tokens)
    assert real["max_running_requests"] == cap.max_running_requests == cap.batch
    # the draft layer's own pool lives outside the budget, in SGLang's runtime reserve
    assert cap.draft_kv_gib == pytest.approx(
        real["kv_tokens"] * (kv_bytes_per_token(CONFIG, mtp=True) - kv_bytes_per_token(CONFIG)) / 2**30
    )


def test_real_sglang_takes_language_model_only_where_fleet_sends_it() -> None:
    from sglang.srt.server_args import ServerArgs

    from fleet.engines.sglang.engine import engine_kwargs
    from fleet.engines.sglang.plan import LANGUAGE_MODEL_ONLY_ARCHITECTURES

    assert set(ServerArgs.LANGUAGE_MODEL_ONLY_ARCHITECTURES) == LANGUAGE_MODEL_ONLY_ARCHITECTURES
    # Qwen3.6 is vision-language, but SGLang refuses the flag for it: fleet leaves it out
    kwargs = engine_kwargs(Settings(engine="sglang", model=str(QWEN), sglang={"mtp": False}), "h200")
    assert "language_model_only" not in kwargs
    with pytest.raises(ValueError, match="language-model-only does not support"):
        ServerArgs(**kwargs, language_model_only=True, device="cpu").resolve_once()
