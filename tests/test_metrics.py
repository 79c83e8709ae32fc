"""Worker metrics served over HTTP by prometheus-client, updated by the worker's middleware."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleet import metrics


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


@pytest.fixture
def port():
    bound = metrics.start_metrics_server(0, addr="127.0.0.1")
    assert bound
    yield bound
    metrics.stop_metrics_server()


def test_off_when_no_port() -> None:
    assert metrics.start_metrics_server(None) is None


def test_served_values_change_after_updates(port: int) -> None:
    # Given a scrape before any work
    before = scrape(port)
    comp = ("fleet_tokens_total", (("kind", "completion"),))
    done = ("fleet_chunks_done_total", ())
    assert ("fleet_running_requests", ()) in before
    # When a chunk commits, requests run, and an engine error is counted
    metrics.observe_chunk(
        42.0, prompt_tokens=1000, completion_tokens=5000, records_ok=9, records_error=1, accept_length=2.5,
        retractions=3,
    )
    metrics.RUNNING_REQUESTS.set(37)
    metrics.RUNS_FAILED.inc()
    metrics.count_error(RuntimeError("engine gone"))
    metrics.count_error(KeyError)
    metrics.set_worker_info("gpu3@hostA", gpu="3", engine="sim", model="none")
    after = scrape(port)
    # Then the served numbers moved by exactly that much
    assert after[comp] - before.get(comp, 0) == 5000
    assert (
        after[("fleet_tokens_total", (("kind", "prompt"),))]
        - before.get(("fleet_tokens_total", (("kind", "prompt"),)), 0)
        == 1000
    )
    assert after[done] - before.get(done, 0) == 1
    retracted = ("fleet_engine_retractions_total", ())
    assert after[retracted] - before.get(retracted, 0) == 3
    runs_failed = ("fleet_runs_failed_total", ())
    assert after[runs_failed] - before.get(runs_failed, 0) == 1
    assert after[("fleet_running_requests", ())] == 37
    assert after[("fleet_spec_accept_length", ())] == 2.5
    assert after[("fleet_errors_total", (("error_class", "RuntimeError"),))] >= 1
    assert after[("fleet_errors_total", (("error_class", "KeyError"),))] >= 1
    assert after[("fleet_chunk_seconds_bucket", (("le", "60.0"),))] >= 1
    assert after[("fleet_chunk_seconds_count", ())] - before.get(("fleet_chunk_seconds_count", ()), 0) == 1
    assert after[("fleet_records_total", (("outcome", "error"),))] >= 1
    info = ("fleet_worker_info", (("engine", "sim"), ("gpu", "3"), ("model", "none"), ("name", "gpu3@hostA")))
    assert after[info] == 1


def test_second_start_returns_the_same_port(port: int) -> None:
    assert metrics.start_metrics_server(0, addr="127.0.0.1") == port
