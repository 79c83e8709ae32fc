"""Shared fixtures: a real redis-server, a real S3 endpoint (moto server over HTTP), and
helpers that run fleet's own processes. Missing binaries fail the tests, never skip them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
import requests

from fleet.bench.procs import pythonpath_first
from fleet.coord.localredis import LocalRedis, free_port
from tests.gcsserver import GcsServer
from tests.hubserver import HubServer

ROOT = Path(__file__).resolve().parents[1]
#: a failed test's process logs close the run's output (tests/failurelogs.py); the fast tier names what
#: runs it past its limit (tests/fasttier.py); pytester tests those plugins
pytest_plugins = ["tests.failurelogs", "tests.fasttier", "tests.longfirst", "pytester"]
# Every process a test starts imports this checkout's fleet: tests chdir into tmp_path (clean_env),
# where a relative PYTHONPATH such as "." would find an engine venv's own, older copy instead.
os.environ["PYTHONPATH"] = pythonpath_first(ROOT, os.environ.get("PYTHONPATH", ""))


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[LocalRedis]:
    with LocalRedis(tmp_path / "redis", persist=False) as server:
        yield server


class MotoServer:
    """moto's S3 in server mode, as its own process, reached by boto3 over HTTP."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> MotoServer:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                requests.get(self.url, timeout=0.5)
                return self
            except requests.RequestException:
                time.sleep(0.1)
        raise RuntimeError("moto server did not start")

    def stop(self) -> None:
        if self.proc:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    server = MotoServer().start()
    yield server
    server.stop()


def set_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> dict[str, str]:
    """`env` in this process's environment for the test (its children inherit it)."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


def bucket_name(request: pytest.FixtureRequest) -> str:
    """A bucket name of the test's own, new on each run."""
    return f"fleet-{abs(hash(request.node.nodeid)) % 10**10}-{int(time.time() * 1000) % 10**6}"


@pytest.fixture
def s3_env(moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    return set_env(monkeypatch, moto_server.env())


@pytest.fixture
def s3_bucket(s3_env: dict[str, str], request: pytest.FixtureRequest) -> str:
    name = bucket_name(request)
    boto3.client("s3").create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[GcsServer]:
    """fake-gcs-server behind the proxy that gives it GCS's precondition edges (tests/gcsserver.py)."""
    server = GcsServer().start()
    yield server
    server.stop()


@pytest.fixture
def gcs_env(gcs_server: GcsServer, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    return set_env(monkeypatch, gcs_server.env())


@pytest.fixture
def gs_bucket(gcs_env: dict[str, str], gcs_server: GcsServer, request: pytest.FixtureRequest) -> str:
    name = bucket_name(request)
    gcs_server.create_bucket(name)
    return name


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    """The Hub stand-in (tests/hubserver.py) as this process's and its children's Hub, with a token."""
    from huggingface_hub import constants

    server = HubServer().start()
    set_env(monkeypatch, server.env())
    # read once, when huggingface_hub is first imported: this process may have imported it already
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    yield server
    server.stop()


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No FLEET_* leaks from the developer's shell, and no fleet.toml from the cwd."""
    for k in list(os.environ):
        if k.startswith("FLEET_"):
            monkeypatch.delenv(k)
    monkeypatch.chdir(tmp_path)


def fleet_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "fleet", *args]


def run_fleet(*args: str, env: dict[str, str] | None = None, timeout: float = 300,
              cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    return subprocess.run(fleet_cmd(*args), env=full_env, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def load_folder(folder: Path, cache: Path) -> list[dict]:
    """`datasets.load_dataset(DIR)`'s train rows, cached under `cache`: the user's cache may hold
    another run's folder of that name (fleet/export/card.py says why that once mattered)."""
    import datasets

    return list(datasets.load_dataset(str(folder), split="train", cache_dir=str(cache)))


@pytest.fixture(scope="session")
def vllm_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """One real `vllm serve` of the tiny model for the whole session (tests/vllmserve.py): the served tests of
    tests/test_engines_vllm.py and the stream contract's server-real-vllm share it, for a start is a minute of
    the vLLM stage on 2 cores. Only in vLLM's venv; elsewhere the tests that ask for it skip."""
    pytest.importorskip("vllm")
    from tests.modelkit import tiny_model_at
    from tests.vllmserve import served_vllm

    with served_vllm(tiny_model_at(tmp_path_factory), tmp_path_factory.mktemp("serve") / "serve.log") as served:
        yield served
