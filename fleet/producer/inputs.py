"""Read an input of any format: check every record (`validate`, the one verdict of `fleet validate`
and `fleet enqueue`) or yield them in order (`read_records`). The format is chosen by
fleet.producer.formats; each format parses its records with fleet.producer.reader."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

from fleet.errors import InputError, InputUnusable
from fleet.producer.formats import input_format
from fleet.producer.reader import BadLine
from fleet.producer.seen import SeenIds
from fleet.records import InputRecord
from fleet.settings.datasetinput import InputSettings


def validate(
    path: Path, max_report: int | None = 100, on_record: Callable[[InputRecord], None] | None = None,
    vocab: int | None = None, forms: Counter[str] | None = None, turns: str = "last",
    source: InputSettings | None = None,
) -> int:
    """Check every line; return the record count or raise InputError naming the bad lines.

    Shows the first `max_report` problems (None: all of them) and counts them all.
    `on_record` sees each good record in order (the producer digests the input in this same
    pass); `vocab`, where the model's vocabulary size is known, bounds pre-tokenized input
    ids; `forms` counts the good records by the form they came in; `turns` is the job's setting;
    `source` picks a dataset folder's config and split and renames columns.
    """
    fmt = input_format(path, source)
    problems: list[str] = []
    bad = records = 0
    seen = SeenIds()
    for line, parsed_form in fmt.parsed(vocab, turns):
        problem = None
        if isinstance(parsed_form, BadLine):
            problem = str(parsed_form)
        else:
            parsed, form = parsed_form
            records += 1
            if forms is not None:
                forms[form] += 1
            if on_record is not None:
                on_record(parsed)
            first = seen.add(parsed.id, line)
            if first is not None:
                problem = f"duplicate id {parsed.id!r} (first on {fmt.where(first)})"
        if problem is not None:
            bad += 1
            if max_report is None or len(problems) < max_report:
                problems.append(f"{fmt.where(line)}: {problem}")
    if bad:
        raise InputError(problems, bad, fmt.unit)
    if records == 0:
        raise InputUnusable(f"{path}: no records (the input is empty or only blank lines)")
    return records


def read_records(path: Path, turns: str = "last", source: InputSettings | None = None) -> Iterator[InputRecord]:
    """The input's records in order, normalised; `validate` first, this raises on a bad line."""
    fmt = input_format(path, source)
    for line, parsed in fmt.parsed(turns=turns):
        if isinstance(parsed, BadLine):
            raise InputError([f"{fmt.where(line)}: {parsed}"], unit=fmt.unit)
        yield parsed[0]
