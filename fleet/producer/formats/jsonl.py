"""JSONL input: the line decoder of fleet/producer/reader.py behind the format interface."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fleet.producer.formats.base import InputFormat
from fleet.producer.reader import BadLine, _objects


class JsonlInput(InputFormat):
    """One JSON object a line; blank lines are skipped but keep their numbers."""

    unit = "line"
    suffixes = (".jsonl", ".json")

    def objects(self) -> Iterator[tuple[int, dict[str, Any] | BadLine]]:
        return _objects(self.path)
