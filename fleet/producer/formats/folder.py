"""A dataset folder as one input (docs/architecture.md, Records): a Hub dataset downloaded at one
commit, a folder laid out as the Hub lays one out, or a `save_to_disk` folder. The files of the
chosen config and split (fleet.producer.datafiles) are read one after the other, each by its own
format, a batch at a time; rows are numbered through all of them, and a position names the file."""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from fleet.producer.datafiles import select
from fleet.producer.formats.base import InputFormat
from fleet.producer.reader import BadLine
from fleet.store.schemes import Listing


class FolderListing(Listing):
    """A local folder's files, by path relative to it; hidden folders (a download cache) left out."""

    def __init__(self, root: Path):
        self.root = root
        self.files = sorted(
            p.relative_to(root).as_posix() for p in root.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
        )

    def text(self, name: str) -> str:
        return (self.root / name).read_text(encoding="utf-8", errors="replace")


class FolderInput(InputFormat):
    unit = "row"

    def __init__(self, path: Path, columns: Mapping[str, str] | None = None, config: str | None = None,
                 split: str = "train", file_format: Any = None):
        super().__init__(path, columns)
        self.files = select(FolderListing(path), config, split)
        self.file_format = file_format
        #: first number of each file read so far, and its name and unit
        self.starts: list[int] = []
        self.names: list[tuple[str, str]] = []

    def where(self, number: int) -> str:
        i = bisect.bisect_right(self.starts, number - 1) - 1
        if i < 0:
            return f"row {number}"
        name, unit = self.names[i]
        return f"{name} {unit} {number - self.starts[i]}"

    def objects(self) -> Iterator[tuple[int, dict[str, Any] | BadLine]]:
        offset = 0
        for name in self.files:
            fmt = self.file_format(self.path / name)
            self.starts.append(offset)
            self.names.append((name, fmt.unit))
            last = 0
            for number, obj in fmt.objects():
                last = number
                yield offset + number, obj
            offset += last
