"""Every flag of every command is checked before anything is written (issue 44, item 3): a bad
number, path or choice, on the command line or in a FLEET_* variable, is one line naming it and
exit 2, and the store and the broker are as they were: no store folder, no key in Redis."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fleet.cli import app
from fleet.coord.localredis import LocalRedis
from tests.conftest import run_fleet

#: command line, where IN is an input that exists; what the one line must say
CASES: list[tuple[list[str], str]] = [
    # run: `--workers -3` once enqueued the job, started no worker and waited forever; 0 meant 2 (and
    # test_fleet_run_refuses_workers_below_one_as_a_process runs these two as the console script)
    (["run", "IN", "--job", "j", "--workers", "-3"], "--workers -3: Input should be greater than or equal to 1"),
    (["run", "IN", "--job", "j", "--workers", "0"], "--workers 0: Input should be greater than or equal to 1"),
    (["run", "IN", "--job", "j", "-w", "0"], "--workers 0: Input should be greater than or equal to 1"),
    (["run", "missing.jsonl", "--job", "j"], "input 'missing.jsonl' does not exist"),
    (["run", "s4://bucket/in.jsonl", "--job", "j"], "unknown scheme s4://"),
    (["run", "IN", "--job", "../x"], "--job: job name '../x': use letters, digits and ._-"),
    (["run", "--job", "j", "--redo", "a/b"], "--redo: job name 'a/b'"),
    (["run", "IN", "--job", "j", "--chunk-size", "0"], "--chunk-size 0: Input should be greater than or equal to 1"),
    (["run", "IN", "--job", "j", "--slots", "0"], "--slots 0: Input should be greater than or equal to 1"),
    (["run", "IN", "--job", "j", "--max-tokens", "-1"], "--max-tokens -1: Input should be greater than or equal"),
    (["run", "IN", "--job", "j", "--turns", "some"], "--turns some: Input should be 'last' or 'all'"),
    (["run", "IN", "--job", "j", "--engine", "nope"], "--engine nope: Input should be 'sim', 'hf'"),
    (["run", "IN", "--job", "j", "--model", "MISSING"], "--model: model 'MISSING' does not exist"),
    (["run", "IN", "--job", "j", "--gpus", "x"], "--gpus 'x': 'x' is not a GPU index"),
    (["run", "IN", "--job", "j", "--columns", "id"], "--columns 'id': give FIELD=COLUMN"),
    (["run", "IN", "--job", "j", "--broker-url", "http://h"], "--broker-url http://h: Redis URL must specify one of"),
    (["run", "IN", "--job", "j", "--bogus"], "No such option: --bogus"),
    (["enqueue", "IN", "--job", "j", "--chunk-size", "-1"], "--chunk-size -1: Input should be greater than or"),
    (["enqueue", "missing.jsonl", "--job", "j"], "input 'missing.jsonl' does not exist"),
    (["enqueue", "IN", "--job", ".hidden"], "--job: job name '.hidden'"),
    (["enqueue", "IN", "--job", "j", "--max-tokens", "0"], "--max-tokens 0: Input should be greater than or equal"),
    (["validate", "missing.jsonl"], "input 'missing.jsonl' does not exist"),
    (["validate", "IN", "--turns", "first"], "--turns first: Input should be 'last' or 'all'"),
    (["status", "--job", "j", "--watch", "0"], "--watch 0.0: Input should be greater than 0"),
    (["status", "--job", "j", "--watch", "-2"], "--watch -2.0: Input should be greater than 0"),
    (["status", "--job", "a/../b"], "--job: job name 'a/../b'"),
    (["export", "--job", "j", "--out", "x.jsonl", "--format", "csv"], "--format csv: 'csv' is not one of 'jsonl'"),
    (["export", "--job", "j", "--job", "../r", "--out", "x.jsonl"], "--job: job name '../r'"),
    (["verify", "--job", "/abs"], "--job: job name '/abs'"),
    (["worker", "--workers", "0"], "--workers 0: Input should be greater than or equal to 1"),
    (["worker", "--gpus", "0,0"], "--gpus '0,0': GPU 0 is listed twice"),
    (["worker", "--gpus-per-worker", "0"], "--gpus-per-worker 0: Input should be greater than or equal to 1"),
    (["worker", "--store-url", "s4://bucket/p"], "unknown scheme s4://"),
    (["plan", "--gpus", "0"], "--gpus 0: Input should be greater than or equal to 1"),
    (["plan", "--bytes-per-param", "0"], "--bytes-per-param 0.0: Input should be greater than 0"),
    (["plan", "--context", "-1", "--params-b", "8"], "--context -1.0: Input should be greater than 0"),
    (["plan", "--batch", "0"], "--batch 0: Input should be greater than or equal to 1"),
    (["plan", "--accept-length", "0.5"], "--accept-length 0.5: Input should be greater than or equal to 1"),
    (["plan", "--usd-per-gpu-hour", "-1"], "--usd-per-gpu-hour -1.0: Input should be greater than or equal to 0"),
    (["plan", "--gpu", "a100"], "--gpu: unknown GPU kind 'a100'"),
    (["plan", "--radix", "maybe"], "--radix maybe: 'maybe' is not one of 'auto', 'on', 'off'"),
    (["plan", "--engine", "nope"], "--engine nope: Input should be 'sim', 'hf'"),
    (["engine-args", "--gpu", "a100"], "--gpu: unknown GPU kind 'a100'"),
    (["doctor", "--model", "MISSING"], "--model: model 'MISSING' does not exist"),
    (["flower", "--port", "0"], "--port 0: Input should be greater than or equal to 1"),
    (["flower", "--port", "70000"], "--port 70000: Input should be less than or equal to 65535"),
    (["job-metrics", "--port", "0"], "--port 0: Input should be greater than or equal to 1"),
    (["prom-targets", "--hosts", "a", "--out", "t.json", "--workers", "0"], "workers per host must be at least 1"),
    (["bench", "--engine", "nope"], "--engine nope: 'nope' is not one of 'sim', 'hf', 'vllm', 'sglang'"),
    (["bench", "--engine", "vllm", "--pairs", "0"], "--pairs 0: Input should be greater than or equal to 1"),
    (["bench", "--engine", "sglang", "--requests", "0"], "--requests 0: Input should be greater than or equal"),
    (["bench", "--engine", "vllm", "--min-window-s", "-1"], "--min-window-s -1: Input should be greater than or"),
    (["bench", "result-size", "--output-tokens", "0"], "--output-tokens 0: Input should be greater than or equal"),
    (["bench", "control-plane", "--workers", "10,x"], "--workers: 'x' is not a whole number of at least 1"),
    (["bench", "control-plane", "--window-s", "0"], "--window-s 0.0: Input should be greater than 0"),
]  # fmt: skip

#: FLEET_* variables: the same rules, named by the variable
ENV_CASES: list[tuple[list[str], dict[str, str], str]] = [
    (["run", "IN", "--job", "j"], {"FLEET_CHUNK_SIZE": "0"}, "FLEET_CHUNK_SIZE: Input should be greater than or"),
    (["enqueue", "IN", "--job", "j"], {"FLEET_BROKER_URL": "localhost:6379"}, "FLEET_BROKER_URL: Redis URL must"),
    (["worker"], {"FLEET_BROKER_URL": "redis://h:port/0"}, "FLEET_BROKER_URL: Port could not be cast to integer"),
    (["worker"], {"FLEET_METRICS_PORT": "70000"}, "FLEET_METRICS_PORT: Input should be less than or equal to 65535"),
    (["flower"], {"FLEET_FLOWER_PORT": "-1"}, "FLEET_FLOWER_PORT: Input should be greater than or equal to 1"),
    (["flower"], {"FLEET_MONITOR__FLOWER_PORT": "0"}, "FLEET_MONITOR__FLOWER_PORT: Input should be greater than"),
    (["validate", "IN"], {"FLEET_TURNS": "some"}, "FLEET_TURNS: Input should be 'last' or 'all'"),
]  # fmt: skip


@pytest.fixture
def place(tmp_path: Path, redis_server: LocalRedis, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A prompts file, and an environment that points every command at a real broker and a store
    folder that does not exist yet (anything written would make it)."""
    (tmp_path / "in.jsonl").write_text('{"id": "a", "prompt": "hello"}\n')
    for k in list(os.environ):
        if k.startswith("FLEET_"):
            monkeypatch.delenv(k)
    monkeypatch.chdir(tmp_path)
    return {"FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": str(tmp_path / "store"),
            "FLEET_DATA_DIR": str(tmp_path / "data"), "FLEET_CONFIG": str(tmp_path / "no.toml")}


def argv(args: list[str], tmp_path: Path) -> list[str]:
    given = {"IN": str(tmp_path / "in.jsonl"), "MISSING": str(tmp_path / "no-model")}
    return [given.get(a, a) for a in args]


def assert_nothing_written(tmp_path: Path, redis_server: LocalRedis) -> None:
    assert not (tmp_path / "store").exists() and not (tmp_path / "data").exists()
    client = redis_server.client()
    assert client.dbsize() == 0, client.keys()
    client.close()


def assert_one_line(stderr: str, says: str, tmp_path: Path) -> None:
    said = stderr.replace(str(tmp_path / "no-model"), "MISSING")
    assert len(said.strip().splitlines()) == 1 and said.startswith("error: ") and says in said, said


def refused(tmp_path: Path, redis_server: LocalRedis, args: list[str], env: dict[str, str], says: str) -> None:
    # When the command is given the bad value (in this process: the app every command is on)
    out = CliRunner(env=env).invoke(app, argv(args, tmp_path))
    # Then it exits 2 with one line naming the flag, its value and why
    assert out.exit_code == 2, (out.exit_code, out.output[-2000:], out.exception)
    assert_one_line(out.stderr, says, tmp_path)
    # And nothing was written: no store folder, no runtime folder, no key in the broker
    assert_nothing_written(tmp_path, redis_server)


@pytest.mark.parametrize(("args", "says"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_a_bad_flag_is_one_line_and_exit_2_before_anything_is_written(tmp_path, redis_server, place, args, says):
    refused(tmp_path, redis_server, args, place, says)


@pytest.mark.parametrize(("args", "env", "says"), ENV_CASES, ids=[next(iter(e)) for _, e, _ in ENV_CASES])
def test_a_bad_environment_value_is_the_same_refusal(tmp_path, redis_server, place, args, env, says):
    refused(tmp_path, redis_server, args, place | env, says)


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["-3", "0"])
def test_fleet_run_refuses_workers_below_one_as_a_process(tmp_path, redis_server, place, workers):
    """The console script itself: `fleet run IN --workers -3` once wrote the job, enqueued it,
    started no worker and waited forever, and `--workers 0` ran 2."""
    # When `fleet run` is started with no worker to run the job (a minute is far more than a refusal takes)
    out = run_fleet("run", str(tmp_path / "in.jsonl"), "--job", "j", "--workers", workers, env=place, timeout=60,
                    cwd=tmp_path)
    # Then it exits 2 with one line, and the job is in neither the store nor the broker
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert_one_line(out.stderr, f"--workers {workers}: Input should be greater than or equal to 1", tmp_path)
    assert_nothing_written(tmp_path, redis_server)


def test_the_refusals_would_have_seen_a_write(tmp_path, redis_server, place):
    """The checks above are not empty: the same command with good flags writes to both."""
    out = CliRunner(env=place).invoke(app, ["enqueue", str(tmp_path / "in.jsonl"), "--job", "j"])
    assert out.exit_code == 0, out.output[-2000:]
    assert (tmp_path / "store" / "j" / "manifest.json").exists()
    assert redis_server.client().dbsize() > 0
