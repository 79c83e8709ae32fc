"""Input formats (docs/architecture.md, Records): each reads its files into the same parsed
records through `InputFormat`, so a further format is one module and one line in FORMATS."""

from __future__ import annotations

from pathlib import Path

from fleet.producer.formats.base import InputFormat, Parsed
from fleet.producer.formats.jsonl import JsonlInput
from fleet.producer.formats.parquet import ParquetInput

#: tried in order by name, then by leading bytes; JSONL, the default, reads what none claims
FORMATS: tuple[type[InputFormat], ...] = (ParquetInput, JsonlInput)

__all__ = ["FORMATS", "InputFormat", "Parsed", "input_format"]


def input_format(path: Path) -> InputFormat:
    """The format of the file at `path`: by its extension (.parquet, .pq, .jsonl), else by its
    leading bytes (Parquet's "PAR1"), else JSONL. The leading bytes win over the name, so a
    Parquet file named .jsonl is read as Parquet, never reported as lines that are not UTF-8."""
    with path.open("rb") as f:
        head = f.read(8)
    for fmt in FORMATS:
        if fmt.magic is not None and head.startswith(fmt.magic):
            return fmt(path)
    suffix = path.suffix.lower()
    return next((fmt for fmt in FORMATS if suffix in fmt.suffixes), JsonlInput)(path)
