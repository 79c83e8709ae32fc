"""A resumed job's batch is sized for the context its done chunks measured, not 4,096 tokens."""

from __future__ import annotations

import logging
from pathlib import Path

from fleet.engines.sglang.plan import plan_capacity
from fleet.monitor.status import JobStatus
from fleet.settings import Settings
from fleet.tools.jobcontext import measured_context, with_job_context

QWEN = Path(__file__).parent / "fixtures" / "qwen3_6_27b"


def status(samples: int, prompt: int, completion: int) -> JobStatus:
    return JobStatus(job="j", chunks_total=10, samples_done=samples, prompt_tokens=prompt, completion_tokens=completion)


def test_a_short_job_gets_the_batch_its_measured_context_fits(caplog) -> None:
    # Given a job whose 100 done samples held 300 prompt + 700 output tokens on average
    settings = Settings(engine="sglang", model=str(QWEN))
    done = status(100, 30_000, 70_000)
    # When fleet run sizes its workers
    with caplog.at_level(logging.INFO, logger="fleet.tools.jobcontext"):
        sized = with_job_context(settings, done)
    # Then the batch is planned for 1,000 tokens a request, and the log says it was measured
    assert measured_context(done) == 1000 and sized.sglang.context_tokens == 1000
    assert "batch sized for 1000 tokens a request, measured over 100 done samples" in caplog.text
    short, default = plan_capacity(sized, "b200"), plan_capacity(settings, "b200")
    assert short is not None and default is not None
    assert short.kv_bound_requests > default.kv_bound_requests  # 4,096 would leave KV idle


def test_a_set_context_or_nothing_measured_keeps_the_setting() -> None:
    chosen = Settings(engine="sglang", model=str(QWEN), sglang={"context_tokens": 8000})
    assert with_job_context(chosen, status(100, 30_000, 70_000)).sglang.context_tokens == 8000
    fresh = Settings(engine="sglang", model=str(QWEN))
    assert with_job_context(fresh, status(0, 0, 0)) is fresh
    sim = Settings(engine="sim")
    assert with_job_context(sim, status(100, 30_000, 70_000)) is sim
