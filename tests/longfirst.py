"""The long tests start first: a run over several workers ends when its last test does, and a long one
started late leaves the other workers idle while it runs (the main suite's last 2.5 minutes, at 4
workers, ran a handful of tests). Long is what the fast tier already keeps out (tests/fasttier.py): the
`e2e` and `slow` marks. A module that holds a long test goes first whole, in its own order: pytest
orders a module's tests so that each value of a module-scoped fixture is set up once (a contract
module's real engines), and splitting the module would start each engine twice.

pytest-xdist's worksteal hands each worker a contiguous share of this order and lets a worker that ran
out take half of another's queue, so the long modules, all in the first share, are spread as soon as
the other workers finish their short tests; a short test is what the run ends on. The sort is stable
and every worker, sorting the same collection, agrees on it.
"""

from __future__ import annotations

import pytest

LONG_MARKS = ("e2e", "slow")


def is_long(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(mark) is not None for mark in LONG_MARKS)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    long_modules = {item.path for item in items if is_long(item)}
    items.sort(key=lambda item: item.path not in long_modules)
