"""The long tests start first: a run over several workers ends when its last test does, and a long one
started late leaves the other workers idle while it runs (the main suite's last 2.5 minutes, at 4
workers, ran a handful of tests). Started first, the long tests overlap one another and the short ones
fill in the end. Long is what the fast tier already keeps out (tests/fasttier.py): the `e2e` and `slow`
marks. The sort is stable, so each group keeps its collection order, and every xdist worker, sorting
the same collection, agrees on it.
"""

from __future__ import annotations

import pytest

LONG_MARKS = ("e2e", "slow")


def is_long(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(mark) is not None for mark in LONG_MARKS)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: not is_long(item))
