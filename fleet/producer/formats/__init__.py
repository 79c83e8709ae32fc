"""Input formats (docs/architecture.md, Records): each reads its files into the same parsed
records through `InputFormat`, so a further format is one module and one line in FORMATS; a
folder is a dataset (fleet.producer.formats.folder) whose files each have one of them."""

from __future__ import annotations

from pathlib import Path

from fleet.producer.formats.arrow import ArrowInput
from fleet.producer.formats.base import InputFormat, Parsed
from fleet.producer.formats.folder import FolderInput
from fleet.producer.formats.jsonl import JsonlInput
from fleet.producer.formats.parquet import ParquetInput
from fleet.settings.datasetinput import InputSettings

#: tried in order by name, then by leading bytes; JSONL, the default, reads what none claims
FORMATS: tuple[type[InputFormat], ...] = (ParquetInput, ArrowInput, JsonlInput)

__all__ = ["FORMATS", "InputFormat", "Parsed", "input_format"]


def file_format(path: Path, source: InputSettings | None = None) -> InputFormat:
    """The format of the file at `path`: by its leading bytes (Parquet's "PAR1", an Arrow file's
    "ARROW1"), else its extension (.parquet, .pq, .arrow, .jsonl), else JSONL. The leading bytes
    win over the name, so a Parquet file named .jsonl is read as Parquet, never reported as lines
    that are not UTF-8."""
    columns = source.columns if source else None
    with path.open("rb") as f:
        head = f.read(8)
    for fmt in FORMATS:
        if fmt.magic is not None and head.startswith(fmt.magic):
            return fmt(path, columns)
    suffix = path.suffix.lower()
    return next((fmt for fmt in FORMATS if suffix in fmt.suffixes), JsonlInput)(path, columns)


def input_format(path: Path, source: InputSettings | None = None) -> InputFormat:
    """A file's format, or a folder's dataset of `source`'s config and split."""
    if path.is_dir():
        source = source or InputSettings()
        return FolderInput(path, source.columns, source.config, source.split, file_format)
    return file_format(path, source)
