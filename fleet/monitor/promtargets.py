"""Prometheus file_sd targets for the head: every worker's /metrics and the job exporter.

Workers listen on settings.monitor.metrics_port + their number on each GPU host (fleet.worker.supervisor.launcher),
so a host list and the workers per host name every endpoint. Prometheus re-reads the file
when it changes: adding a GPU host is rewriting it, no restart.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from fleet.errors import ConfigError


def worker_targets(hosts: list[str], workers_per_host: int, base_port: int) -> list[dict[str, Any]]:
    if workers_per_host < 1:
        raise ConfigError(f"workers per host must be at least 1, not {workers_per_host}")
    if not (base_port > 0 and base_port + workers_per_host - 1 < 65536):
        raise ConfigError(f"metrics ports {base_port}..{base_port + workers_per_host - 1} are not TCP ports")
    groups = []
    for host in hosts:
        host = host.strip()
        if not host or ":" in host or "/" in host:
            raise ConfigError(f"metrics host {host!r}: give a host name or IPv4 address, no port or scheme")
        targets = [f"{host}:{base_port + n}" for n in range(workers_per_host)]
        groups.append({"targets": targets, "labels": {"role": "worker", "host": host}})
    return groups


def head_targets(job_metrics: str | None) -> list[dict[str, Any]]:
    return [{"targets": [job_metrics], "labels": {"role": "jobs"}}] if job_metrics else []


def write_targets(path: Path, groups: list[dict[str, Any]]) -> None:
    """Atomically: Prometheus may read the file at any moment."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(groups, indent=2) + "\n")
    tmp.replace(path)
