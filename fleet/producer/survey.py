"""What an input holds, checked with nothing running (`fleet validate`).

The checks are `fleet enqueue`'s own (fleet.producer.inputs.validate over the one parser),
with every bad line listed rather than the first hundred; no broker and no store are
touched, so 902,087 prompts can be checked before the fleet is up. The figures are what
`fleet plan` asks for: records, samples, the forms seen, and, with the model's tokenizer,
the prompt tokens each record renders to through the chat template (what the engine sees).
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from fleet.errors import InputError, RecordError
from fleet.producer.formats import input_format
from fleet.producer.inputs import validate
from fleet.producer.source import local_input
from fleet.records import InputRecord
from fleet.settings import Settings


@dataclass
class InputSurvey:
    input: str
    records: int = 0
    samples: int = 0
    #: good records by the form they came in (messages, prompt, input_ids, conversations, openai batch)
    forms: dict[str, int] = field(default_factory=dict)
    bad_lines: int = 0
    #: what the input's positions are called: "line" (JSONL), "row" (Parquet)
    unit: str = "line"
    #: every bad line, "line N: what is wrong" ("row N" in Parquet)
    problems: list[str] = field(default_factory=list)
    #: the model whose tokenizer counted the prompt tokens, when one was given
    model: str | None = None
    #: prompt tokens per record: mean, p50, p99, max, total (None: no tokenizer and not all pre-tokenized)
    prompt_tokens: dict[str, float] | None = None
    context: int | None = None
    #: records whose prompt alone fills the model's context (they would fail alone)
    over_context: int = 0
    #: records the chat template rejects (they would fail alone), "line N: ..."
    rejected: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.bad_lines == 0 and self.records > 0


class PromptLengths:
    """Prompt token counts of good records, in a compact array (4 bytes a record)."""

    def __init__(self, settings: Settings, tokenizer: Any | None):
        self.settings, self.tokenizer = settings, tokenizer
        self.lengths = array("I")
        self.rejected: list[str] = []
        self.unknown = 0
        self.unit = "line"

    def add(self, record: InputRecord) -> None:
        if record.input_ids is not None:
            self.lengths.append(len(record.input_ids))
            return
        if self.tokenizer is None:
            self.unknown += 1
            return
        from fleet.model.rendering import record_prompt_ids

        try:
            self.lengths.append(len(record_prompt_ids(self.tokenizer, record, self.settings.enable_thinking)))
        except RecordError as e:
            self.rejected.append(f"{self.unit} {record.line}: {e}")

    def figures(self) -> dict[str, float] | None:
        if self.unknown or not self.lengths:
            return None
        ordered = sorted(self.lengths)
        n = len(ordered)

        def rank(q: float) -> int:  # nearest rank
            return ordered[max(0, math.ceil(q * n) - 1)]

        total = sum(ordered)
        return {"mean": round(total / n, 1), "p50": rank(0.5), "p99": rank(0.99), "max": ordered[-1], "total": total}


def survey(settings: Settings, input_url: str) -> InputSurvey:
    """Check `input_url` (a local file or dataset folder, s3://, gs:// or hf://datasets/...) as
    `fleet enqueue` would, and count what it holds."""
    from fleet.engines.specs import input_vocab, spec_for

    report = InputSurvey(input=input_url, model=settings.model)
    tokenizer = None
    if settings.model:
        from fleet.model.modeldir import context_length_of
        from fleet.model.rendering import load_tokenizer

        tokenizer = load_tokenizer(settings.model)
        report.context = context_length_of(settings.model)
    vocab = input_vocab(settings) if settings.model or not spec_for(settings).needs_model else None
    lengths = PromptLengths(settings, tokenizer)
    forms: Counter[str] = Counter()

    def seen(record: InputRecord) -> None:
        report.samples += record.sample_count(settings.sampling.n)
        lengths.add(record)

    with local_input(input_url, settings.input, max_attempts=settings.store_client.max_attempts) as fetched:
        path = fetched.path
        report.input = fetched.pinned
        report.unit = lengths.unit = input_format(path, settings.input).unit
        try:
            report.records = validate(path, max_report=None, on_record=seen, vocab=vocab, forms=forms,
                                      turns=settings.turns, source=settings.input)
        except InputError as e:
            report.problems, report.bad_lines, report.unit = e.problems, e.total_bad, e.unit
            report.records = sum(forms.values())
    report.forms = dict(forms.most_common())
    report.prompt_tokens = lengths.figures()
    report.rejected = lengths.rejected
    if report.context is not None:
        report.over_context = sum(1 for n in lengths.lengths if n >= report.context)
    return report
