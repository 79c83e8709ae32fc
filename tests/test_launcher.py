"""`fleet worker`: GPU pinning (fake nvidia-smi), supervision, metrics, and status of a
running job, with real worker processes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
import requests

from fleet.coord.localredis import free_port
from fleet.settings import Settings
from fleet.store import open_store
from fleet.store.layout import results_prefix
from fleet.worker.supervisor import proctree
from fleet.worker.supervisor.launcher import plan_workers
from tests.conftest import run_fleet
from tests.fleetproc import (
    Workers,
    gone_before_successor,
    processes_below,
    wait_for,
    worker_pids,
    worker_with,
    write_prompts,
)
from tests.modelkit import tiny_model_fixture  # noqa: F401

pytestmark = pytest.mark.e2e
FAKE_SGLANG = Path(__file__).parent / "fake_sglang"
ROOT = Path(__file__).resolve().parents[1]


def fake_nvidia_smi(bin_dir: Path, gpus: int) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    lines = "\\n".join(f"{i}, NVIDIA B200, 183359 MiB" for i in range(gpus))
    script = bin_dir / "nvidia-smi"
    script.write_text(f"#!/bin/sh\nprintf '{lines}\\n'\n")
    script.chmod(0o755)


def two_free_ports() -> int:
    """A base port with its successor free too (workers serve metrics on base + n)."""
    import socket

    for _ in range(50):
        base = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", base + 1))
                return base
            except OSError:
                continue
    raise RuntimeError("no two consecutive free ports")


def test_gpu_workers_pinned_supervised_and_measured(tmp_path, redis_server, clean_env):
    # Given a host whose nvidia-smi lists two GPUs, and a slow job
    fake_nvidia_smi(tmp_path / "bin", 2)
    store_url = str(tmp_path / "store")
    metrics_port = two_free_ports()
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "FLEET_ENGINE": "sim",
           "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": store_url, "FLEET_CHUNK_SIZE": "4",
           "FLEET_SLOTS": "2", "FLEET_SIM__STEP_S": "0.01", "FLEET_SIM__MEAN_OUTPUT_TOKENS": "60",
           "FLEET_METRICS_PORT": str(metrics_port), "FLEET_LEASE_TTL_S": "5", "FLEET_REAPER_INTERVAL_S": "1"}
    prompts = write_prompts(tmp_path / "p.jsonl", 80)
    assert run_fleet("enqueue", str(prompts), "--job", "gpu", env=env).returncode == 0
    workers = Workers(env, tmp_path / "logs")
    launcher = workers.start_gpus("gpuhost")
    store = open_store(store_url)
    try:
        # When the job runs on one pinned worker per GPU
        wait_for(lambda: len(list(store.list(results_prefix("gpu")))) >= 2, 60, "first results")
        running = json.loads(run_fleet("status", "--job", "gpu", "--json", env=env).stdout)
        scraped = requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=60).text
        # and one worker dies
        children = proctree.children(launcher.pid)
        os.kill(children[0], signal.SIGKILL)
        wait_for(lambda: len(list(store.list(results_prefix("gpu")))) == 20, 120, "all results")
        wait_for(lambda: workers.logs().count("ready.") >= 3, 30, "the restarted worker ready")
    finally:
        workers.stop()
    logs = workers.logs()
    # Then each worker saw only its own GPU, the dead one was restarted, and metrics were served
    assert "worker gpu0@gpuhost: CUDA_VISIBLE_DEVICES='0'" in logs
    assert "worker gpu1@gpuhost: CUDA_VISIBLE_DEVICES='1'" in logs
    assert "killed by SIGKILL" in logs and "restarting" in logs
    assert "fleet_chunks_done_total" in scraped and 'fleet_worker_info{' in scraped
    assert running["chunks_done"] >= 2 and not running["done"] and running["chunks_total"] == 20
    assert running["chunks_running"] + running["chunks_queued"] > 0 and running["tok_s"] > 0
    done = json.loads(run_fleet("status", "--job", "gpu", "--json", env=env).stdout)
    assert done["done"] and done["records_done"] == 80
    assert set(done["workers"]) == {"gpu0@gpuhost", "gpu1@gpuhost"}


def test_gpu_groups_pin_each_worker_to_its_gpus_and_its_engine_spans_them(tmp_path, redis_server, tiny_model,
                                                                          clean_env):
    # Given a host whose nvidia-smi lists four GPUs and the sglang engine (its stand-in, which fails to start
    # as the real one does when tensor parallelism asks for more GPUs than it sees)
    fake_nvidia_smi(tmp_path / "bin", 4)
    journal = tmp_path / "journal.jsonl"
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "FLEET_ENGINE": "sglang",
           "FLEET_MODEL": str(tiny_model), "FLEET_BROKER_URL": redis_server.url,
           "FLEET_STORE_URL": str(tmp_path / "store"), "FLEET_CHUNK_SIZE": "4", "FLEET_SGLANG__MTP": "false",
           "PYTHONPATH": os.pathsep.join([str(FAKE_SGLANG), str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "FAKE_SGLANG_JOURNAL": str(journal), "FLEET_SGLANG__ENGINE_KWARGS": '{"fake_tokens": 8}'}
    prompts = write_prompts(tmp_path / "p.jsonl", 16)
    assert run_fleet("enqueue", str(prompts), "--job", "tp", env=env).returncode == 0
    workers = Workers(env, tmp_path / "logs")
    # When `fleet worker --gpus all --gpus-per-worker 2` runs the job
    workers.start_gpus("tphost", "all", "--gpus-per-worker", "2")
    store = open_store(str(tmp_path / "store"))
    try:
        wait_for(lambda: len(list(store.list(results_prefix("tp")))) == 4, 120, "all results")
        # (one worker may finish these short chunks alone before the other is up: wait for both)
        wait_for(lambda: workers.logs().count("CUDA_VISIBLE_DEVICES='") >= 2, 120, "both workers up")
    finally:
        workers.stop()
    logs = workers.logs()
    # Then two workers ran, each pinned to its pair of GPUs, its engine spanning both (tp_size 2)
    assert "worker gpu0+1@tphost: CUDA_VISIBLE_DEVICES='0,1'" in logs
    assert "worker gpu2+3@tphost: CUDA_VISIBLE_DEVICES='2,3'" in logs
    starts = [json.loads(line) for line in journal.read_text().splitlines() if '"start"' in line]
    assert sorted((s["visible"], s["kwargs"]["tp_size"]) for s in starts) == [("0,1", 2), ("2,3", 2)]
    assert "failed to start" not in logs
    # And a count that does not divide the GPUs, or a worker count for an engine that runs on one GPU, is refused
    refused = run_fleet("worker", "--gpus", "all", "--gpus-per-worker", "3", env=env)
    assert refused.returncode != 0 and "--gpus-per-worker 3 does not divide the 4 GPUs" in refused.stderr
    set_by_hand = run_fleet("worker", "--gpus", "all", "--gpus-per-worker", "2",
                            env={**env, "FLEET_SGLANG__TP_SIZE": "4"})
    assert set_by_hand.returncode != 0 and "sglang.tp_size is 4" in set_by_hand.stderr
    sim = run_fleet("worker", "--gpus", "all", "--gpus-per-worker", "2", env={**env, "FLEET_ENGINE": "sim"})
    assert sim.returncode != 0 and "engine sim runs on one GPU" in sim.stderr


def test_gpus_all_without_gpus_is_a_clear_error(tmp_path, redis_server, clean_env):
    empty = tmp_path / "bin"
    fake_nvidia_smi(empty, 0)
    env = {"PATH": f"{empty}:/usr/bin:/bin", "FLEET_BROKER_URL": redis_server.url}
    began = time.monotonic()
    res = run_fleet("worker", "--gpus", "all", env=env, timeout=60)
    assert res.returncode != 0 and "no GPU" in res.stderr and time.monotonic() - began < 60


def test_worker_whose_engine_cannot_start_exits_and_is_restarted(tmp_path, redis_server, clean_env):
    # Given a worker configured with a model that does not exist
    env = {"FLEET_ENGINE": "hf", "FLEET_MODEL": str(tmp_path / "missing-model"),
           "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": str(tmp_path / "store")}
    workers = Workers(env, tmp_path / "logs")
    workers.start("broken")
    try:
        # When it boots, Then it exits (instead of consuming chunks without an engine) and is restarted
        wait_for(lambda: workers.logs().count("exited with code 3") >= 2, 90, "two failed boots")
    finally:
        workers.stop()
    logs = workers.logs()
    assert "failed to start; exiting for restart" in logs and "restarting in" in logs
    assert "Task fleet.run_chunk" not in logs


def test_engine_failure_restarts_the_worker_and_never_commits_a_partial_chunk(tmp_path, redis_server, clean_env):
    # Given a job whose chunk 1 kills the engine every time
    store_url = str(tmp_path / "store")
    env = {"FLEET_ENGINE": "sim", "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": store_url,
           "FLEET_CHUNK_SIZE": "4", "FLEET_SIM__STEP_S": "0.0005", "FLEET_SIM__ENGINE_ERROR_CHUNKS": "[1]",
           "FLEET_MAX_ATTEMPTS": "2", "FLEET_MAX_CRASHES": "2", "FLEET_GRACE_S": "1",
           "FLEET_SUSPECT_HOLD_S": "1"}
    prompts = write_prompts(tmp_path / "p.jsonl", 16)
    assert run_fleet("enqueue", str(prompts), "--job", "dies", env=env).returncode == 0
    workers = Workers(env, tmp_path / "logs")
    workers.start("h")
    store = open_store(store_url)
    try:
        # When it runs
        wait_for(lambda: store.exists("dies/failed/000001.json") and "restarting in" in workers.logs()
                 and len(list(store.list(results_prefix("dies")))) == 3, 90, "3 results, chunk 1 quarantined")
    finally:
        workers.stop()
    # Then the worker went down with its engine and was restarted, and chunk 1 has no result;
    # it was quarantined on its crash budget (its engine died within seconds of starting it each time)
    logs = workers.logs()
    assert "engine failed" in logs and "restarting in" in logs
    failure = json.loads(store.get("dies/failed/000001.json"))
    assert failure["error_type"] == "EngineError" and failure["attempts"] == 2
    assert not store.exists("dies/results/000001")


def test_a_killed_launcher_takes_its_workers(tmp_path, redis_server, clean_env):
    # Given a `fleet worker` launcher with two running worker processes
    env = {"FLEET_ENGINE": "sim", "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": str(tmp_path / "s")}
    workers = Workers(env, tmp_path / "logs")
    launcher = workers.start("host", workers=2)
    try:
        wait_for(lambda: workers.logs().count("ready") >= 2, 90, "two workers ready")
        children = proctree.children(launcher.pid)
        assert len(children) == 2 and all(proctree.running(p) for p in children)
        # When the launcher is killed outright
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=10)
        # Then no worker process remains
        gone = wait_for(lambda: not any(proctree.running(p) for p in children), 10,
                        "workers to die with their launcher")
        print(f"\nworkers gone {gone:.2f}s after their launcher's SIGKILL")
    finally:
        workers.stop()


def test_a_launcher_passes_sigterm_on_to_its_workers_at_once(tmp_path, redis_server, clean_env):
    # Given four hosts, each a `fleet worker` launcher with one worker ready
    env = {"FLEET_ENGINE": "sim", "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": str(tmp_path / "s")}
    workers = Workers(env, tmp_path / "logs")
    hosts = [f"host{i}" for i in range(4)]
    launchers = [workers.start(h) for h in hosts]
    try:
        wait_for(lambda: all(workers.ready(h) for h in hosts), 90, "four workers ready")
        # When each launcher gets SIGTERM (a preemption's notice begins)
        sent = {}
        for h, launcher in zip(hosts, launchers, strict=True):
            sent[h] = time.time()
            launcher.send_signal(signal.SIGTERM)
        wait_for(lambda: all(stopped_at(tmp_path / "logs" / f"{h}.log") for h in hosts), 30, "four workers stopping")
    finally:
        workers.stop()
    # Then every worker began its hand-over within 0.25 s of its launcher's SIGTERM (where a launcher that
    # looked for it every 0.5 s passed it on 0-0.5 s later: the share of a 30 s notice it was told of; all
    # four within 0.25 s by chance 1 time in 16; the slack is for a busy machine's scheduling)
    late = {h: (stopped_at(tmp_path / "logs" / f"{h}.log") or 0.0) - sent[h] for h in hosts}
    print(f"\nSIGTERM to the worker's stop, per host: {', '.join(f'{s:.3f}s' for s in late.values())}")
    assert all(s < 0.25 for s in late.values()), late


def stopped_at(log: Path) -> float | None:
    """When the worker logged its SIGTERM's hand-over (its log's clock, this machine's local time); None before."""
    found = re.search(r"^\[([-\d: ]+,\d+): INFO/MainProcess\] worker \S+ stopping", log.read_text(), re.MULTILINE)
    return datetime.strptime(found[1], "%Y-%m-%d %H:%M:%S,%f").timestamp() if found else None


def test_a_tag_names_its_launcher_by_the_kernels_start_ticks():
    # Given this process as a launcher, and its start as the kernel counts it (field 22 of /proc/<pid>/stat),
    # which every tag a launcher of this scope ever wrote holds
    me = os.getpid()
    ticks = int(Path(f"/proc/{me}/stat").read_bytes().rsplit(b")", 1)[1].split()[19])
    # When it tags its third worker
    tag = proctree.make_tag(me, 3, "scope")
    # Then the tag holds those ticks; the launcher is not gone, but a launcher of that pid with another start
    # is (the pid was reused), and a tag of another scope is never this one's to judge
    assert tag == f"{me}.{ticks}.3.scope"
    assert not proctree.launcher_gone(tag, "scope")
    assert proctree.launcher_gone(f"{me}.{ticks + 1}.3.scope", "scope")
    assert not proctree.launcher_gone(f"{me}.{ticks + 1}.3.other", "scope")


def test_kill_tree_ends_a_descendant_in_its_own_session_that_ignores_sigterm(tmp_path):
    # Given a process whose child left its session and ignores SIGTERM (a group kill misses it)
    ready = tmp_path / "ready"
    deaf = (f"import pathlib, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            f"pathlib.Path({str(ready)!r}).touch(); time.sleep(600)")
    parent = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys, time; subprocess.Popen("
                               f"[sys.executable, '-c', {deaf!r}], start_new_session=True); time.sleep(600)"])
    try:
        wait_for(ready.exists, 30, "the grandchild to ignore SIGTERM")
        tree = proctree.descendants(parent.pid)
        assert len(tree) == 1 and proctree.stat(tree[0]).session != proctree.stat(parent.pid).session
        # When the tree is killed with a short grace
        began = time.monotonic()
        ended = proctree.kill_tree([parent.pid, *tree], grace_s=0.5)
        took = time.monotonic() - began
        # Then both ended: the parent at SIGTERM, the deaf one at SIGKILL after the grace and the
        # time it gets to exit once the others are gone
        assert ended == sorted([parent.pid, *tree])
        assert parent.wait(timeout=5) == -signal.SIGTERM
        st = proctree.stat(tree[0])
        assert st is None or not st.running
        # (no later than a SIGKILLed process's wait: it was not waited out as one that outlives SIGKILL)
        assert 0.5 + proctree.DEAF_WAIT_S <= took < 0.5 + proctree.DEAF_WAIT_S + proctree.KILL_WAIT_S
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_kill_tree_kills_a_stopped_process_at_once(tmp_path):
    # Given a process frozen by SIGSTOP (as the real-engine tests freeze an engine): it acts on no
    # SIGTERM until it is continued
    frozen = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        os.kill(frozen.pid, signal.SIGSTOP)
        wait_for(lambda: proctree.stat(frozen.pid).stopped, 10, "the process stopped", interval=0.01)
        # When its tree is killed with a SIGTERM grace longer than any busy machine's delay
        began = time.monotonic()
        assert proctree.kill_tree([frozen.pid], grace_s=600) == [frozen.pid]
        took = time.monotonic() - began
        # Then it is SIGKILLed at once, not after the SIGTERM grace, and never continued
        assert frozen.wait(timeout=5) == -signal.SIGKILL
        assert took < 300
    finally:
        if frozen.poll() is None:
            frozen.kill()
            frozen.wait()


def leaky_workers(tmp_path: Path, redis_url: str) -> Workers:
    """Workers whose engine starts a process (`sleep 3600`) in a session of its own and never ends it."""
    env = {"FLEET_ENGINE": "sim", "FLEET_SIM__LEAK_PROCESS": "true", "FLEET_BROKER_URL": redis_url,
           "FLEET_STORE_URL": str(tmp_path / "s")}
    return Workers(env, tmp_path / "logs")


def test_a_sigkilled_workers_processes_are_gone_before_its_successor_starts(tmp_path, redis_server, clean_env):
    # Given a worker whose engine started a process in a session of its own and never ends it
    workers = leaky_workers(tmp_path, redis_server.url)
    try:
        launcher, worker, helper = worker_with(workers, "leaky", "sleep 3600")
        assert proctree.stat(helper).session != proctree.stat(worker).session
        # When the worker process (not the launcher) is SIGKILLed
        os.kill(worker, signal.SIGKILL)
        # Then it is gone before its successor starts, reaped by the launcher that adopted it
        gone = gone_before_successor(launcher.pid, worker, helper)
        assert proctree.stat(helper) is None
        print(f"\nhelper gone {gone:.2f}s after its worker's SIGKILL, before the successor started")
        # and the successor becomes ready, its own helper the only one under the launcher
        wait_for(lambda: workers.logs().count("ready.") >= 2, 90, "the successor ready")
        [successor] = worker_pids(launcher.pid)
        [helper2] = processes_below(launcher.pid, "sleep 3600")
        assert helper2 in processes_below(successor, "sleep 3600")
    finally:
        workers.stop()
    # Then when `fleet worker` stops, no process of its workers is left
    assert launcher.returncode == 0 and proctree.stat(helper2) is None
    logs = workers.logs()
    assert "killed by SIGKILL" in logs and "left 1 process(es)" in logs


def test_what_workers_of_a_killed_launcher_left_is_ended_by_the_next_launcher(tmp_path, redis_server, clean_env):
    # Given a launcher killed outright: its worker dies with it, the process its engine started does not
    workers = leaky_workers(tmp_path, redis_server.url)
    try:
        first, worker, helper = worker_with(workers, "first", "sleep 3600")
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
        wait_for(lambda: not proctree.running(worker), 10, "the worker to die with its launcher")
        assert proctree.running(helper)
        # When the next launcher starts on the host
        second = workers.start("second")
        # Then the orphan is gone before its first worker starts
        gone = gone_before_successor(second.pid, -1, helper, timeout=30)
        print(f"\norphan of a killed launcher gone {gone:.2f}s after the next launcher started")
    finally:
        workers.stop()
    assert "left by workers of a launcher that is gone" in workers.logs()


def test_each_worker_process_gets_its_own_metrics_port(monkeypatch, clean_env):
    # Given a launcher whose environment names the base port by the flat name of before sections
    monkeypatch.setenv("FLEET_METRICS_PORT", "9400")
    settings = Settings()
    # When it plans two workers, each started with its environment, its settings and its spec's
    ports = []
    for spec in plan_workers(settings, 2, None, host="h"):
        with monkeypatch.context() as m:
            for key, value in {**settings.to_env(), **spec.env}.items():
                m.setenv(key, value)
            ports.append(Settings().monitor.metrics_port)
    # Then each serves its metrics on the base port plus its number
    assert ports == [9400, 9401]
