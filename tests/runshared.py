"""What a test run builds once for all its xdist workers: a tiny model, a clean run's export.

A session or module fixture is built once per xdist worker that asks for it, so three workers built the
tiny model three times, and both cases of a parametrized test made the same clean reference run each. The
run's workers share one base directory (the parent of each one's `getbasetemp()`); a file lock there
lets the first builder build and the others wait for it, then read what it made."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock


def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory this test run's processes share: the xdist workers' common parent, else the base temp."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> Path:
    """`name`'s directory under the run's shared one, made by `build(directory)` in exactly one process of
    the run; a build that failed is started again by the next asker (its half-made directory removed)."""
    root = run_dir(tmp_path_factory)
    path, done = root / name, root / f"{name}.built"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir()
            build(path)
            done.touch()
    return path
