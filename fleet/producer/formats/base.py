"""The one interface every input format reads through (docs/architecture.md, Records)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

from fleet.producer.reader import BadLine, parse_object
from fleet.records import InputRecord


class Parsed(NamedTuple):
    """One record of the input, or what is wrong with it, at its 1-based line or row."""

    number: int
    result: tuple[InputRecord, str] | BadLine


def renamed(obj: dict[str, Any], columns: Mapping[str, str]) -> dict[str, Any]:
    """A record's fields under fleet's names: `columns` maps fleet's field to the input's column
    (`--columns id=uuid`); a mapped column the record lacks leaves the field unset."""
    if not columns:
        return obj
    taken = set(columns.values())
    out = {k: v for k, v in obj.items() if k not in taken or k in columns}
    for field, column in columns.items():
        if column in obj:
            out[field] = obj[column]
        elif field != column:
            out.pop(field, None)
    return out


class InputFormat(ABC):
    """An input in one format. Validation, reading and `fleet validate` go through `parsed`,
    which checks every record with `reader.parse_object`, so a record is judged the same way
    whatever file it came in; a format only decodes its records (`objects`) and words their
    positions (`unit`, `where`)."""

    #: what a position is called in messages: "line 3", "row 3"
    unit: ClassVar[str]
    #: file name endings that choose this format
    suffixes: ClassVar[tuple[str, ...]] = ()
    #: leading bytes that choose it whatever the name
    magic: ClassVar[bytes | None] = None

    def __init__(self, path: Path, columns: Mapping[str, str] | None = None):
        self.path = path
        self.columns = dict(columns or {})

    def where(self, number: int) -> str:
        return f"{self.unit} {number}"

    @abstractmethod
    def objects(self) -> Iterator[tuple[int, dict[str, Any] | BadLine]]:
        """Every record's fields in order with its 1-based number, or what keeps it from being
        read; streaming: memory stays flat in the input's size."""

    def parsed(self, vocab: int | None = None, turns: str = "last") -> Iterator[Parsed]:
        """Every record in order, checked; `turns` is the job's setting (reader.parse_object)."""
        for pos, (number, obj) in enumerate(self.objects()):
            if isinstance(obj, BadLine):
                yield Parsed(number, obj)
            else:
                try:
                    yield Parsed(number, parse_object(renamed(obj, self.columns), number, pos, vocab, turns))
                except BadLine as bad:
                    yield Parsed(number, bad)
