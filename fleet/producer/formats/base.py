"""The one interface every input format reads through (docs/architecture.md, Records)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar, NamedTuple

from fleet.producer.reader import BadLine
from fleet.records import InputRecord


class Parsed(NamedTuple):
    """One record of the input, or what is wrong with it, at its 1-based line or row."""

    number: int
    result: tuple[InputRecord, str] | BadLine


class InputFormat(ABC):
    """An input file in one format. Validation, reading and `fleet validate` go through
    `parsed`, and every format checks its records with `reader.parse_object`, so a record
    is judged the same way whatever file it came in; only `unit` words the position."""

    #: what a position is called in messages: "line 3", "row 3"
    unit: ClassVar[str]
    #: file name endings that choose this format
    suffixes: ClassVar[tuple[str, ...]] = ()
    #: leading bytes that choose it whatever the name
    magic: ClassVar[bytes | None] = None

    def __init__(self, path: Path):
        self.path = path

    def where(self, number: int) -> str:
        return f"{self.unit} {number}"

    @abstractmethod
    def parsed(self, vocab: int | None = None, turns: str = "last") -> Iterator[Parsed]:
        """Every record in order, streaming: memory stays flat in the input's size; `turns`
        is the job's setting (reader.parse_object)."""
