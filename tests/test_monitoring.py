"""Prometheus and Grafana on the head: the dashboard's queries name only metrics that
fleet exports, the scrape config passes promtool, and a real Prometheus started by
`ops/start-head.sh --native` scrapes a real worker and the job exporter."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client import REGISTRY

from fleet import metrics
from fleet.coord.localredis import free_port
from fleet.monitor.jobmetrics import FAMILIES
from fleet.monitor.promtargets import worker_targets
from tests.conftest import ROOT, run_fleet
from tests.fleetproc import FAST_SIM, Workers, wait_for, write_prompts
from tests.test_ops_scripts import base_env, fleet_shim, settings_file

DASHBOARD = ROOT / "ops" / "grafana" / "fleet.json"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "info": ("_info",),
            "gauge": ("",), "summary": ("", "_count", "_sum")}  # fmt: skip


def exported_names() -> set[str]:
    """Every series name a worker (fleet.metrics) or the job exporter can expose."""
    names = set()
    for family in REGISTRY.collect():
        if family.name.startswith("fleet_"):
            names |= {family.name + s for s in SUFFIXES[family.type]}
    assert metrics.TOKENS and "fleet_tokens_total" in names  # the registry is fleet's
    return names | set(FAMILIES)


def dashboard_queries() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p["targets"]]


def metric_names(expr: str) -> set[str]:
    """Series names in a PromQL expression: identifiers outside label matchers and strings
    that are not functions, keywords or aggregation label lists."""
    expr = re.sub(r'"[^"]*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        if expr[m.end() :].lstrip().startswith("("):
            continue  # a function or an aggregation
        if m.start() and (expr[m.start() - 1].isdigit() or expr[m.start() - 1] == "."):
            continue  # the exponent of 1e6
        if m.group() not in ("by", "on", "and", "or", "unless", "bool", "offset"):
            names.add(m.group())
    return names


def test_metric_name_parser() -> None:
    assert metric_names('sum by (instance) (rate(a_total{kind="x"}[2m])) * on (instance) group_left (g) b') == {
        "a_total", "b",
    }  # fmt: skip
    assert metric_names("histogram_quantile(0.5, sum by (le) (rate(c_bucket[5m]))) / 3600 * 1e6") == {"c_bucket"}


def test_every_dashboard_query_names_an_exported_metric() -> None:
    exported = exported_names()
    queries = dashboard_queries()
    used = set().union(*(metric_names(q) for q in queries))
    assert used, queries
    assert used <= exported, f"not exported: {sorted(used - exported)}"
    # And the panels are there
    titles = [p["title"] for p in json.loads(DASHBOARD.read_text())["panels"]]
    for want in (
        "Output tok/s per GPU",
        "Running requests vs the engine's effective concurrency",
        "Speculative acceptance",
        "Chunks done / failed / requeued",
        "ETA",
        "$ per million output tokens",
    ):
        assert any(t.startswith(want) for t in titles), (want, titles)
    assert {"fleet_engine_max_running", "fleet_chunks_requeued_total", "fleet_job_eta_seconds"} <= used


def test_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus; .ci/run does)")
    conf = tmp_path / "prometheus.yml"
    shutil.copy(ROOT / "ops" / "prometheus" / "prometheus.yml", conf)
    (tmp_path / "targets").mkdir()
    (tmp_path / "targets" / "fleet.json").write_text(json.dumps(worker_targets(["10.0.0.5", "gpu-b"], 2, 9400)))
    res = subprocess.run([promtool, "check", "config", str(conf)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_compose_head_runs_prometheus_and_grafana_with_the_dashboard() -> None:
    head = yaml.safe_load((ROOT / "docker" / "compose.head.yml").read_text())["services"]
    assert "../ops/prometheus:/etc/prometheus:ro" in head["prometheus"]["volumes"]
    assert "../ops/grafana/fleet.json:/var/lib/grafana/dashboards/fleet.json:ro" in head["grafana"]["volumes"]
    assert head["job-metrics"]["command"][0] == "job-metrics"
    for svc in ("prometheus", "grafana"):
        assert ":latest" not in head[svc]["image"] and head[svc]["ports"][0].startswith("${")


def prom_query(port: int, expr: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]["result"]


@pytest.mark.slow
def test_head_prometheus_scrapes_a_real_worker(tmp_path: Path) -> None:
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus not installed (apt-get install prometheus; .ci/run does)")
    redis_port, metrics_port, prom_port, jobs_port = free_port(), free_port(), free_port(), free_port()
    env_file = settings_file(
        tmp_path, REDIS_PASSWORD="feedface", REDIS_PORT=str(redis_port),
        FLEET_BROKER_URL=f"redis://:feedface@127.0.0.1:{redis_port}/0", FLEET_STORE_URL=str(tmp_path / "store"),
        LOG_DIR=str(tmp_path / "logs"), REDIS_DIR=str(tmp_path / "redis"), FLEET_FLOWER_PORT=str(free_port()),
        METRICS_HOSTS="127.0.0.1", METRICS_WORKERS_PER_HOST="1", FLEET_METRICS_PORT=str(metrics_port),
        PROMETHEUS_PORT=str(prom_port), JOB_METRICS_PORT=str(jobs_port), FLEET_USD_PER_GPU_HOUR="5.49",
    )  # fmt: skip
    fleet_shim(tmp_path / "bin")
    env = base_env(tmp_path, tmp_path / "bin", FLEET_ENV_FILE=str(env_file))
    script = str(ROOT / "ops" / "start-head.sh")
    lines = [line for line in env_file.read_text().splitlines() if "=" in line and not line.startswith("#")]
    fleet_env = {k: v for k, v in (line.split("=", 1) for line in lines) if k.startswith("FLEET_")}
    fleet_env = {**fleet_env, **FAST_SIM, "FLEET_BROKER_URL": f"redis://:feedface@127.0.0.1:{redis_port}/0"}
    workers = Workers(fleet_env, tmp_path / "wlogs")
    try:
        res = subprocess.run([script, "--native", "--no-flower"], env=env, capture_output=True, text=True, timeout=90)
        assert res.returncode == 0, res.stderr
        assert json.loads((tmp_path / "logs" / "prometheus-conf" / "targets" / "fleet.json").read_text())[0][
            "targets"] == [f"127.0.0.1:{metrics_port}"]  # fmt: skip
        # Given a job run by a real worker serving its metrics on the configured port
        prompts = write_prompts(tmp_path / "p.jsonl", 40)
        assert (
            run_fleet("enqueue", str(prompts), "--job", "promjob", "--chunk-size", "10", env=fleet_env).returncode == 0
        )
        workers.start("gpuhost", 1)

        # Then Prometheus has both targets up and the worker's and the job's series
        def up() -> bool:
            try:
                return (
                    len([r for r in prom_query(prom_port, "up == 1")]) == 2
                    and bool(prom_query(prom_port, "fleet_chunks_done_total >= 4"))
                    and bool(prom_query(prom_port, 'fleet_job_chunks{state="done"} == 4'))
                )
            except OSError:
                return False

        wait_for(up, 180, "Prometheus to scrape the worker and the job exporter", interval=2)
        assert prom_query(prom_port, "fleet_engine_max_running")[0]["value"][1] == "64"
        assert prom_query(prom_port, "fleet_usd_per_gpu_hour")[0]["value"][1] == "5.49"
        # And every dashboard query is valid PromQL there
        for expr in dashboard_queries():
            prom_query(prom_port, expr)
    finally:
        workers.stop()
        stop = subprocess.run([script, "--native", "--stop"], env=env, capture_output=True, text=True, timeout=90)
    assert stop.returncode == 0, stop.stderr
    assert (
        not (tmp_path / "logs" / "prometheus.pid").exists()
        or subprocess.run(
            ["kill", "-0", (tmp_path / "logs" / "prometheus.pid").read_text().strip()], capture_output=True
        ).returncode
        != 0
    )
