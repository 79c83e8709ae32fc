"""Who saw a process die: the one thing that tells a crash from a lost host (docs/architecture.md,
"Failures"). No other module names these keys (tests/test_architecture.py checks).

A worker process whose lease ran out may have died on its own (a poison prompt that segfaults or
OOMs its engine, a kill of it alone) or with its whole host (a spot preemption, a power cut, a
`kill -9` of the launcher with its workers). Only the first is evidence against the chunks it ran,
and only something that outlived the process can say which it was: its launcher, which reaps it
with its exit status and records it here at once. A lease that ran out with no witness counts
against the host, never a chunk.
"""

from __future__ import annotations

import redis

from fleet.coord import keys
from fleet.coord.slices import hash_items

#: how long a witness lives: longer than any death takes to be judged
WITNESS_TTL_S = 24 * 3600
#: How long the reaper waits for a witness before it calls a death a lost host is the setting
#: `failure.witness_wait_s` (3 s), counted from the latest moment the process could have died
#: (fleet.coord.recovery.awaits_witness): a live launcher reaps its dead worker within its poll (0.5 s) and
#: records it at once, while the lease runs out most of a TTL after the death.


def note_witnessed(r: redis.Redis, owner: str, how: str) -> None:
    """The process `owner` (`name:pid`) died, and its launcher saw how ("killed by SIGKILL")."""
    r.set(keys.process_witnessed(owner), how, ex=WITNESS_TTL_S)


def witnessed(r: redis.Redis, owner: str) -> str | None:
    """How the process died, as its witness saw it; None when no one saw it die."""
    raw = r.get(keys.process_witnessed(owner))
    return raw.decode() if raw is not None else None


# Once per process, whichever reaper judges one of its chunks first.
_LOSS = (
    "if redis.call('set', KEYS[1], 1, 'NX', 'EX', ARGV[2]) then return redis.call('hincrby', KEYS[2], ARGV[1], 1) end "
    "return 0"
)


def note_host_loss(r: redis.Redis, owner: str, host: str) -> int:
    """The process `owner` was lost with its host `host`, no one seeing it die: counted once against the
    host (never its worker's record of deaths, nor its chunks). Returns the host's losses so far, or 0
    when this process's loss was counted already."""
    return int(r.eval(_LOSS, 2, keys.process_lost(owner), keys.host_losses(), host, WITNESS_TTL_S))


def host_losses(r: redis.Redis) -> dict[str, int]:
    """Processes lost with no witness, by host (`fleet status`)."""
    return {k.decode(): int(v) for k, v in sorted(hash_items(r, keys.host_losses()).items())}
