"""Flower's tasks page in a real headless Chromium, for a job run by real GPU-pinned workers:
each task shows its job and chunk and the GPU worker that ran it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.coord.localredis import free_port
from fleet.monitor.flower import TASKS_COLUMNS
from tests.browser import render
from tests.conftest import run_fleet
from tests.fleetproc import FAST_SIM, Workers, wait_for, write_prompts
from tests.test_flower import clean_env, get, wait_healthy
from tests.test_gpus import fake_smi

CHUNKS = 6


def flower_tasks(base: str) -> list[dict]:
    """The rows the tasks page itself fetches (its datatables AJAX endpoint)."""
    query = "draw=1&start=0&length=100&search%5Bvalue%5D=&order%5B0%5D%5Bcolumn%5D=0&order%5B0%5D%5Bdir%5D=asc"
    status, body = get(f"{base}/tasks/datatable?{query}&columns%5B0%5D%5Bdata%5D=name")
    return json.loads(body)["data"] if status == 200 else []


@pytest.mark.slow
def test_tasks_page_shows_job_chunk_and_gpu(tmp_path: Path, redis_server) -> None:
    # Given fleet flower, then two workers pinned to (fake) GPUs 0 and 1
    smi = fake_smi(tmp_path / "smi", "".join(f"{i}, NVIDIA B200, 183359 MiB\n" for i in range(2)))
    port = free_port()
    env = clean_env(
        **{**FAST_SIM, "FLEET_SIM__STEP_S": "0.02"},
        FLEET_BROKER_URL=redis_server.url, FLEET_STORE_URL=str(tmp_path / "store"),
        FLEET_CHUNK_SIZE="4", FLEET_FLOWER_PORT=str(port),
        PATH=f"{smi}:{clean_env()['PATH']}",
    )  # fmt: skip
    flower = subprocess.Popen(
        [sys.executable, "-m", "fleet", "flower"], cwd=tmp_path, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    workers = Workers(env, tmp_path / "logs")
    try:
        wait_healthy(base, flower)
        prompts = write_prompts(tmp_path / "p.jsonl", 4 * CHUNKS)
        assert run_fleet("enqueue", str(prompts), "--job", "browserjob", env=env).returncode == 0
        workers.start_gpus("gpuhost", "0,1")
        # When every chunk has run and Flower has seen it succeed
        wait_for(
            lambda: sum(t["state"] == "SUCCESS" for t in flower_tasks(base)) == CHUNKS,
            240,
            "Flower to see every chunk succeed",
        )
        shot = tmp_path / "flower-tasks.png"
        dom = render(base + "/tasks", tmp_path / "chromium", screenshot=shot)
    finally:
        workers.stop()
        flower.terminate()
        flower.communicate(timeout=20)
    # Then the page's table has one row per chunk naming job, chunk and the GPU worker
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", dom, flags=re.S)
    cells = [re.sub(r"<[^>]+>", " ", r) for r in rows]
    for index in range(CHUNKS):
        row = [c for c in cells if f"chunk browserjob/{index} " in c]
        assert len(row) == 1, f"chunk {index} not on the page once: {cells}"
        assert re.search(r"gpu[01]@gpuhost", row[0]), row[0]
        assert "SUCCESS" in row[0]
    # And the headers are fleet's columns, not Flower's defaults (UUID is not among them)
    headers = [re.sub(r"<[^>]+>|\s+", " ", h).strip() for h in re.findall(r"<th[^>]*>(.*?)</th>", dom, flags=re.S)]
    assert headers[: len(TASKS_COLUMNS.split(","))][:3] == ["Name", "State", "Worker"], headers
    assert "UUID" not in headers
    assert shot.stat().st_size > 10_000
