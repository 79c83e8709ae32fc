"""Monitoring commands for the head: `fleet job-metrics` (the job exporter) and
`fleet prom-targets` (Prometheus' list of worker endpoints)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from fleet.cli.app import BrokerOpt, StoreOpt, app, console, run_guarded, settings_from, setup_logging

#: the job exporter's default port (the workers use settings.monitor.metrics_port and up)
JOB_METRICS_PORT = 9399


@app.command("job-metrics")
def job_metrics(
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="port of /metrics")] = JOB_METRICS_PORT,
    address: Annotated[str, typer.Option("--address", help="bind address")] = "127.0.0.1",
    broker_url: BrokerOpt = None,
    store_url: StoreOpt = None,
) -> None:
    """Serve job progress (chunks, records, ETA, cost) of every job as Prometheus metrics."""
    from prometheus_client import CollectorRegistry, start_http_server

    from fleet.coord.broker import redis_client
    from fleet.monitor.jobmetrics import JobCollector
    from fleet.store import store_for

    setup_logging()
    settings = settings_from(broker_url=broker_url, store_url=store_url)
    # No preflight: the head may start this before Redis answers; each scrape retries.
    registry = CollectorRegistry()
    registry.register(JobCollector(run_guarded(store_for, settings), redis_client(settings), settings))
    start_http_server(port, addr=address, registry=registry)
    console.print(f"job metrics on http://{address}:{port}/metrics", highlight=False)
    while True:
        time.sleep(3600)


@app.command("prom-targets")
def prom_targets(
    hosts: Annotated[str, typer.Option("--hosts", help="GPU hosts, comma-separated (METRICS_HOSTS)")],
    out: Annotated[Path, typer.Option("--out", help="file_sd JSON to write")],
    workers: Annotated[int, typer.Option("--workers", help="workers per host (GPUs)")] = 8,
    port: Annotated[int | None, typer.Option("--port", help="first worker port (FLEET_METRICS_PORT)")] = None,
    job_metrics_at: Annotated[str | None, typer.Option("--job-metrics", help="host:port of fleet job-metrics")] = None,
) -> None:
    """Write Prometheus' targets: each host's worker ports and the job exporter."""
    from fleet.monitor.promtargets import head_targets, worker_targets, write_targets

    base = port or settings_from().monitor.metrics_port or 9400
    groups = run_guarded(worker_targets, [h for h in hosts.split(",") if h.strip()], workers, base)
    write_targets(out, groups + head_targets(job_metrics_at))
    console.print(f"{sum(len(g['targets']) for g in groups)} worker targets written to {out}", highlight=False)
