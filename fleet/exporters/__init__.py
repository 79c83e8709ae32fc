"""Export formats, one module each, in one registry keyed by the `--format` name."""

from __future__ import annotations

from fleet.exporters.base import ExportRow, Skipped, Writer, target
from fleet.exporters.jsonl import VOLATILE_FIELDS, JsonlWriter
from fleet.exporters.openai import OpenAIBatchWriter
from fleet.exporters.parquet import ParquetWriter
from fleet.exporters.specforge import SpecForgeWriter
from fleet.exporters.tokens import TokensWriter

FORMATS: dict[str, type[Writer]] = {
    "jsonl": JsonlWriter,
    "parquet": ParquetWriter,
    "specforge": SpecForgeWriter,
    "tokens": TokensWriter,
    "openai": OpenAIBatchWriter,
}

__all__ = ["FORMATS", "VOLATILE_FIELDS", "ExportRow", "Skipped", "Writer", "target"]
