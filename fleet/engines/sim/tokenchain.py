"""The sim engine's tokens: a vocabulary that decodes, and samples whose every id depends on the ids
before it.

A stand-in is only as good as what it can show. Each id here is a function of the record's seed, its
output position and every output id before it (a chained hash), so a sample continued from a wrong,
shifted or foreign prefix comes out different from its uninterrupted run, as a real model's would;
a sample continued from its own prefix comes out identical. The last id of the vocabulary ends a
sample (its end-of-sequence id) and the one before it closes the think block, so a record's text,
its reasoning split, its finish reason and its ids can be checked against each other as a real
tokenizer's are (fleet.audit). The sim, like SGLang and vLLM, goes on after a prefix that already
ended: a continuation past an end token comes back with a second one inside it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from fleet.model.endings import trim_at_stop
from fleet.model.reasoning import THINK_CLOSE, ended_in_thinking, split_reasoning
from fleet.records import mix64

#: Output ids range over this many tokens when `sim.vocab_size` is unset (Qwen3's is 151,936).
SIM_VOCAB = 151_936
_WORDS = (
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on", "be", "by",
    "this", "are", "or", "from", "at", "which", "an", "not", "have", "has", "we", "can", "all", "more",
    "one", "will", "if", "their", "but", "when", "there", "so", "what", "about", "into", "than",
    "them", "token", "batch", "chunk", "lease", "store", "worker", "engine", "broker", "prompt",
    "answer", "reason", "step", "think",
)  # fmt: skip
_MASK64 = (1 << 64) - 1


def natural_length(mean_output_tokens: float, sigma: float, seed: int) -> int:
    """A sample's natural length, its end id included: heavy-tailed (log-normal, mu = ln(m) - s^2/2)
    with the configured mean, a function of the seed alone (so the engine can predict it)."""
    rng = random.Random(seed)
    mu = math.log(mean_output_tokens) - sigma**2 / 2
    return max(1, round(rng.lognormvariate(mu, sigma)))


@dataclass(frozen=True)
class SimVocab:
    """Ids 0..size-3 are words; size-2 closes the think block; size-1 ends a sample."""

    size: int = SIM_VOCAB

    @classmethod
    def of(cls, size: int | None) -> SimVocab:
        return cls(size or SIM_VOCAB)

    @property
    def eos(self) -> int:
        return self.size - 1

    @property
    def think_end(self) -> int:
        return self.size - 2

    def piece(self, token: int) -> str:
        if token == self.think_end:
            return THINK_CLOSE
        return _WORDS[token % len(_WORDS)]

    def decode(self, ids: Sequence[int]) -> str:
        """Text as a tokenizer with skip_special_tokens gives it: the end id is special and dropped."""
        return " ".join(self.piece(i) for i in ids if i != self.eos)


def _next_state(state: int, token: int, position: int) -> int:
    return mix64((state ^ (token * 0x9E3779B97F4A7C15 + position)) & _MASK64)


def sim_tokens(vocab: SimVocab, seed: int, natural: int, max_tokens: int, prefix: Sequence[int] = (),
               stops: Sequence[str] | None = None) -> tuple[list[int], str]:
    """The whole output after `prefix` (prefix included) and its finish reason.

    The think block closes at a third of the natural length and the end id stands at natural - 1, or
    right after a prefix that already reached that point (a real engine goes on after whatever prefix
    it is given). A stop string in the decoded output ends it at the id that completed the string.
    """
    think_at = natural // 3 if natural >= 3 else -1
    end_at = max(natural - 1, len(prefix))
    ids = list(prefix)
    state = mix64((seed + 0x5EED) & _MASK64)
    for position, token in enumerate(prefix):
        state = _next_state(state, token, position)
    window = max((len(s) for s in stops), default=0) if stops else 0
    while len(ids) < max_tokens:
        position = len(ids)
        if position == end_at:
            ids.append(vocab.eos)
            return ids, "stop"
        token = vocab.think_end if position == think_at else state % (vocab.size - 2)
        ids.append(token)
        state = _next_state(state, token, position)
        if window and trim_at_stop(vocab.decode(ids[-window:]), tuple(stops or ()))[1]:
            return ids, "stop"
    return ids, "length"


def sim_text_of(
    vocab: SimVocab, ids: Sequence[int], stops: Sequence[str] | None = None
) -> tuple[str | None, str, bool]:
    """(reasoning, answer, ended inside the thinking) of a sim sample's ids: its prompt opens the think
    block, as Qwen3.6's does."""
    text, _ = trim_at_stop(vocab.decode(ids), tuple(stops) if stops else None)
    return (*split_reasoning(text, True), ended_in_thinking(text, True))


def sim_text(seed: int, tokens: int) -> str:
    """A sample's text of `tokens` ids with its think markers, for benchmarks that size results."""
    vocab = SimVocab()
    ids, _ = sim_tokens(vocab, seed, tokens + 1, tokens)
    reasoning, answer, _ = sim_text_of(vocab, ids)
    return f"<think>{reasoning}{THINK_CLOSE}{answer}"
