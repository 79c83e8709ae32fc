"""A second pass (`--redo J`): the input of a redo job is J's records whose samples did not finish.

Rows cut at max tokens, ended inside their thinking, failed or stopped in a loop are the
longest reasoning traces; dropping them leans a training set toward short reasoning. A redo
job generates those records again: an ordinary job with its own manifest, seed and sampling,
whose input is read from J's chunk objects (no input file). A record is redone when any of
its samples did not finish; `fleet export --job J --job J2` then picks per (id, sample).
Redo records keep J's `pos` and `line`, so the redo's rows sort in J's input order and the
merge is one streaming pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from fleet.coord.chunkstate import done_indexes, failed_indexes
from fleet.errors import FleetError
from fleet.records import InputRecord, derive_seed
from fleet.settings import Settings
from fleet.store import Store
from fleet.store.layout import read_chunk
from fleet.store.manifest import Manifest
from fleet.store.results import finished, read_result


@dataclass
class RedoInput:
    """Which of J's records a redo takes, by J's chunk: their positions in J's input."""

    base: Manifest
    positions: dict[int, set[int]] = field(default_factory=dict)
    #: J's samples that did not finish, all of them (a redone record's finished samples are not counted)
    unfinished_samples: int = 0

    @property
    def records(self) -> int:
        return sum(len(p) for p in self.positions.values())

    def read(self, store: Store) -> Iterator[InputRecord]:
        """The redo's records in J's input order, read from J's chunk objects (twice: to
        digest for the claim, then to write; memory stays one chunk)."""
        for index in sorted(self.positions):
            wanted = self.positions[index]
            yield from (rec for rec in read_chunk(store, self.base.job, index) if rec.pos in wanted)


def require_complete(store: Store, base: Manifest) -> None:
    """A redo reads J's results: every chunk must have one, or the unfinished rows are not known yet."""
    done = done_indexes(store, base.job)
    missing = [i for i in range(base.chunks) if i not in done]
    if not missing:
        return
    failed = failed_indexes(store, base.job) - done
    head = ", ".join(map(str, missing[:10]))
    why = (f"{len(failed)} quarantined: `fleet enqueue --job {base.job} --retry-failed` sends them again"
           if failed else "wait for them to finish")
    raise FleetError(f"job {base.job!r} has {len(missing)} of {base.chunks} chunks without a result (first: "
                     f"{head}; {why}); a redo takes a complete job's unfinished rows: nothing was written")


def redo_input(store: Store, base: Manifest) -> RedoInput:
    """J's records with at least one sample that did not finish (`fleet.store.results.finished`)."""
    require_complete(store, base)
    found = RedoInput(base)
    for index in range(base.chunks):
        unfinished = [row for row in read_result(store, base.job, index)[1] if not finished(row)]
        found.unfinished_samples += len(unfinished)
        if unfinished:
            found.positions[index] = {row["pos"] for row in unfinished}
    if not found.positions:
        raise FleetError(f"job {base.job!r}: every sample finished; there is nothing to redo")
    return found


def redo_settings(settings: Settings, base: Manifest, job: str) -> Settings:
    """The redo job's settings: J's samples per record and turns setting (its chunks hold J's
    records as J's setting read them: whole conversations for turns = all), and a seed of its own.

    A redo with J's seed would draw J's samples again (a loop loops again); a redo job whose
    seed is J's (the default, 0 for both) takes one derived from J's seed and its own name, so
    every redo of J draws new samples and enqueueing it again finds the same configuration.
    """
    n = base.config.get("sampling", {}).get("n", 1)
    seed = settings.seed
    if seed == base.config.get("seed"):
        seed = derive_seed(seed, f"redo {job}", 0)
    turns = base.config.get("turns", "last")
    return settings.model_copy(update={"seed": seed, "turns": turns,
                                       "sampling": settings.sampling.model_copy(update={"n": n})})


def check_redo(job: str, redo_of: str) -> None:
    if job == redo_of:
        raise FleetError(f"job {job!r} cannot redo itself: name the redo job with another --job")
