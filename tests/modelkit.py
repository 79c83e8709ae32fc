"""Test helpers for the model side: the tiny model once per session, and an engine loop thread.

Import a fixture into a test module (`from tests.modelkit import tiny_model_fixture  # noqa: F401`)
and ask for it by its name, `tiny_model`; the model is built once per session whichever
module asks first.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from fleet.model.outputlen import FALLBACK_MAX_TOKENS
from fleet.model.tinymodel import SAMPLING
from fleet.records import NEUTRAL, GenRequest, Message, Sampling, derive_seed
from tests.runshared import built_once

#: a tiny model's job sampling, as its manifest resolves it (engines fill nothing: requests come final)
TINY_SAMPLING = {k: v for k, v in SAMPLING.items() if k in NEUTRAL}


def tiny_sampling(rid: str, **sampling: Any) -> Sampling:
    """A request's sampling as the worker builds it for a job of the tiny model: the model's defaults,
    the given values over them, a derived seed."""
    return Sampling(**TINY_SAMPLING | {"max_tokens": FALLBACK_MAX_TOKENS, "seed": derive_seed(0, rid, 0)} | sampling)


def tiny_model_at(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run's tiny model, built on first use by one of its xdist workers (tests/runshared.py; also for
    conftest's fixtures, which cannot ask for `tiny_model`: a module imports it)."""
    from fleet.model.tinymodel import build_tiny_model

    return built_once(tmp_path_factory, "tiny-model", lambda path: build_tiny_model(path, seed=0))


@pytest.fixture(scope="session", name="tiny_model")
def tiny_model_fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_at(tmp_path_factory)


@pytest.fixture(scope="session", name="loop_model")
def loop_model_fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model whose greedy rows fall into a 3-token loop, built by `fleet tiny-model --loop`."""
    from typer.testing import CliRunner

    from fleet.cli import app

    def build(path: Path) -> None:
        result = CliRunner().invoke(app, ["tiny-model", str(path), "--loop"])
        assert result.exit_code == 0, result.output

    return built_once(tmp_path_factory, "tiny-loop", build)


class LoopThread:
    """One long-lived asyncio loop in its own thread, as the worker runs its engine."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="engine-loop", daemon=True)
        self.thread.start()

    def submit(self, coro: Coroutine[Any, Any, Any]) -> Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 60) -> Any:
        return self.submit(coro).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(name="loop_thread")
def loop_thread_fixture() -> Iterator[LoopThread]:
    lt = LoopThread()
    yield lt
    lt.close()


def chat(
    rid: str, text: str = "Hello there, tell me a story.", *, thinking: bool = True, **sampling: Any
) -> GenRequest:
    """A chat request with a derived seed, as the worker would build it."""
    return GenRequest(
        record_id=rid,
        chunk=0,
        sample=0,
        sampling=tiny_sampling(rid, **sampling),
        messages=[Message(role="user", content=text)],
        enable_thinking=thinking,
        return_output_ids=True,
    )


def raw(rid: str, prompt: str = "def main():\n    return", **sampling: Any) -> GenRequest:
    return GenRequest(
        record_id=rid, chunk=0, sample=0, sampling=tiny_sampling(rid, **sampling), prompt=prompt,
        return_output_ids=True,
    )  # fmt: skip
