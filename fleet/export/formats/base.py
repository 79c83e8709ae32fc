"""What every export format shares: the row it is handed and the writer protocol (where the
file it writes ends up is fleet.export.target's concern).

Every format streams: the exporter hands a writer one chunk's rows at a time, in input
order, so memory is bounded by a chunk whatever the job's size.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from fleet.records import InputRecord
from fleet.store.manifest import Manifest


@dataclass
class ExportRow:
    """One output sample with the input record it answers (when the format reads inputs)."""

    out: dict[str, Any]
    record: InputRecord | None = None


@dataclass
class LeftOut:
    """Rows a format cannot represent, counted by reason, so the CLI can say what was left out."""

    reasons: dict[str, int] = field(default_factory=dict)

    def add(self, reason: str) -> None:
        self.reasons[reason] = self.reasons.get(reason, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.reasons.values())


class Writer:
    """A format: `write` gets each chunk's rows in input order and returns how many lines it wrote."""

    #: whether rows need their input record (messages, input ids) from the chunk objects
    needs_inputs: ClassVar[bool] = False
    #: writes a folder (a Hub-ready dataset), not one file
    folder: ClassVar[bool] = False

    def __init__(self, path: Path, manifest: Manifest, stable: bool, left_out: LeftOut):
        self.path, self.manifest, self.stable, self.left_out = path, manifest, stable, left_out

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def write(self, rows: list[ExportRow]) -> int:
        raise NotImplementedError

    def close(self) -> None:
        """Flush and close the output file."""


class JsonLinesWriter(Writer):
    """A format of one JSON object per line; `line` maps a row to its object, or None to leave it out."""

    #: json.dumps separators; token rows are compact, text rows keep the readable default
    separators: ClassVar[tuple[str, str] | None] = None
    #: training formats have nothing to train on in a failed record: left out and counted
    skip_errors: ClassVar[bool] = False

    def __init__(self, path: Path, manifest: Manifest, stable: bool, left_out: LeftOut):
        super().__init__(path, manifest, stable, left_out)
        self.file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def line(self, row: ExportRow) -> dict[str, Any] | None:
        raise NotImplementedError

    def write(self, rows: list[ExportRow]) -> int:
        written = 0
        for row in rows:
            if self.skip_errors and row.out["finish_reason"] == "error":
                self.left_out.add("error records")
                continue
            obj = self.line(row)
            if obj is not None:
                self.put(obj)
                written += 1
        return written

    def put(self, obj: dict[str, Any]) -> None:
        self.file.write(json.dumps(obj, ensure_ascii=False, separators=self.separators) + "\n")

    def close(self) -> None:
        self.file.close()


def with_sample_and_extra(out: dict[str, Any], line: dict[str, Any]) -> dict[str, Any]:
    """A training row's tail: the sample number past the first, and the input's passthrough
    fields; the format's own fields win (an input field named loss_mask must not replace it)."""
    if out.get("sample"):
        line["sample"] = out["sample"]
    return {**(out.get("extra") or {}), **line}
