"""JSONL input: the line parser of fleet/producer/reader.py behind the format interface."""

from __future__ import annotations

from collections.abc import Iterator

from fleet.producer.formats.base import InputFormat, Parsed
from fleet.producer.reader import _parsed


class JsonlInput(InputFormat):
    """One JSON object a line; blank lines are skipped but keep their numbers."""

    unit = "line"
    suffixes = (".jsonl", ".json")

    def parsed(self, vocab: int | None = None, turns: str = "last") -> Iterator[Parsed]:
        for line, result in _parsed(self.path, vocab, turns):
            yield Parsed(line, result)
