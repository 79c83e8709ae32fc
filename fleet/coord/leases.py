"""The one owner of a chunk's lease in Redis: the lease and the running set, the lease clock,
the assist lease, the requeue guard and the job set; and the beat that renews a process's leases.

The producer, the worker and the reaper change that state only through this module, and no
other module names those keys (tests/test_architecture.py checks). Redis may lose it all
without losing work: the store decides done and quarantined (docs/architecture.md, "Recovery").

- lease (keys.lease), process lease (keys.process_lease) and running set (keys.running): one
  live owner per chunk. The process is leased, not each chunk: a chunk's lease names its run and
  is live while its process's key lives, which the beat renews once whatever the chunks it holds.
  A chunk in the running set without a live lease lost its worker, and the reaper sends it round
  again (and deletes the dead process's lease, a key with no TTL of its own).
- lease clock (keys.lease_started, keys.lease_beat): when the lease was taken and last
  renewed. How long a run held its lease is the one crash evidence fleet.coord.retry
  reads, for a failure the worker saw (taken -> now) and for a lost worker (taken -> beat).
- job sets (keys.job_stores): each job under the store it was enqueued into; a lease taken
  relearns its job, so a broker that lost everything finds the jobs still running. A store
  reads and drops only its own jobs (docs/architecture.md, "Stores on one broker").
- the beat (`beat`): one script per heartbeat renews the process's key, checks the leases it is
  given are still its runs', and carries its runs' figures, in one round trip and O(1) commands
  whatever the number of chunks it runs
  (docs/architecture.md, "Scaling"; the heartbeat chooses which leases a beat renews). The
  figures go under the keys their owner gives (fleet.coord.figures.figure_keys).
"""

from __future__ import annotations

import json
import logging
import math
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

import redis

from fleet.coord import keys
from fleet.coord.figures import figure_keys
from fleet.coord.slices import SLICE, hash_items, set_members

log = logging.getLogger(__name__)

# Whether a chunk lease's value names a live process (its process key, keys.process_lease, lives):
# the holder's key is known only once the lease is read, so a script builds it from the prefix it
# is given, and from the value's process and boot as `leased_process` reads them. The full beat
# (_BEAT) builds its leases' keys from prefixes too: keys of one broker, never a cluster's slots.
_LIVE = (
    "local function live(v, pre) "
    "return v and redis.call('exists', pre .. (string.match(v, '^([^#]*#[^.]*)%.') "
    "or string.match(v, '^[^#]*'))) == 1 end "
)
# A chunk lease is a key with no TTL naming its run; it is live while its process's key lives
# (KEYS[6], created or lengthened here, never shortened). A lease whose process is gone is taken
# over; one held by a live run is not, even by the same owner, except by its own run's retake
# (ARGV[9]): a process whose key ran out and came back (another of its runs retook its lease)
# holds its runs' leases again. An assist lease is a key of its own TTL (SET NX PX).
# A watched lease also (re)registers its job in its store's job set (ARGV[7], the store id; none
# when empty): a broker that lost everything relearns the job from the chunks still running, and
# the store's stall watch finds the rest again. ARGV[4] starts the lease clock, ARGV[6] beats it
# (a retaken lease keeps its start). Its process joins the processes the reaper checks for deaths
# (KEYS[7]), stamped with this take.
_ACQUIRE = _LIVE + (
    "if ARGV[3] == '' then if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end "
    "return 0 end "
    "local cur = redis.call('get', KEYS[1]) "
    "if cur and not (ARGV[9] == '1' and cur == ARGV[1]) and live(cur, ARGV[8]) then return 0 end "
    "redis.call('set', KEYS[1], ARGV[1]) "
    "local t = redis.call('pttl', KEYS[6]) "
    "if t ~= -1 and t < tonumber(ARGV[2]) then redis.call('set', KEYS[6], '1', 'PX', ARGV[2]) end "
    "redis.call('sadd', KEYS[2], ARGV[3]); redis.call('hset', KEYS[7], string.sub(KEYS[6], #ARGV[8] + 1), ARGV[6]) "
    "if ARGV[7] ~= '' then redis.call('hsetnx', KEYS[5], ARGV[5], ARGV[7]) end "
    "redis.call('hset', KEYS[3], ARGV[3], ARGV[4]); redis.call('hset', KEYS[4], ARGV[3], ARGV[6]) "
    "return 1"
)
# Only the store that owns a job drops it from the job sets.
_DROP_JOB = (
    "if redis.call('hget', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('hdel', KEYS[1], ARGV[1]) end "
    "return 0"
)
# Renewal of one lease: its process's key (an assist lease: its own), only while the lease is the
# owner's; it also stamps the chunk's beat: after the holder dies, the reaper reads how long it
# held the lease (beat - started).
_RENEW = (
    "if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end "
    "if ARGV[3] == '' then return redis.call('pexpire', KEYS[1], ARGV[2]) end "
    "if redis.call('pexpire', KEYS[3], ARGV[2]) == 0 then return 0 end "
    "redis.call('hset', KEYS[2], ARGV[3], ARGV[4]); return 1"
)
# Only the owner of a live lease releases, and only then does the chunk leave the running set: a
# stale worker must not hide a chunk whose new owner may still die, and a lease whose process ran
# out is the reaper's (as an expired one was): its running-set member and clock stay for the reaper,
# and the lease itself goes, so that its process's key, brought back by another of its runs, cannot
# make it live again; the let-go counter (KEYS[6]) tells the reaper, whose round may no longer see the
# process dead by then (fleet.coord.scangate).
_RELEASE = (
    "if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end "
    "if ARGV[2] == '' then return redis.call('del', KEYS[1]) end "
    "if redis.call('exists', KEYS[5]) == 0 then redis.call('del', KEYS[1]); redis.call('incr', KEYS[6]) "
    "return 0 end "
    "redis.call('del', KEYS[1]); redis.call('hdel', KEYS[3], ARGV[2]); redis.call('hdel', KEYS[4], ARGV[2]) "
    "return redis.call('srem', KEYS[2], ARGV[2])"
)
# A lease its process stopped renewing (the heartbeat discarded it, and its release never reached
# the broker) runs out a TTL after its last renewal, as an unrenewed key would: only the owner's.
# A let-go lease leaves its chunk watched with no lease while its process lives: the counter (KEYS[2])
# tells the reaper to scan at its next round (fleet.coord.scangate).
_LET_GO = (
    "if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end "
    "redis.call('del', KEYS[1]); redis.call('incr', KEYS[2]); return 1"
)
# A dead process leaves the processes the reaper checks (KEYS[1]) unless its key came back (ARGV[1]: the
# process keys' prefix), as a process cut off by a broker pause retakes its leases, or it took a lease since
# the reaper saw it dead (its stamp, ARGV[i + 1], changed: it may have died again holding it).
_FORGET_DEAD = (
    "local n = 0 "
    "for i = 2, #ARGV, 2 do if redis.call('exists', ARGV[1] .. ARGV[i]) == 0 "
    "and redis.call('hget', KEYS[1], ARGV[i]) == ARGV[i + 1] then "
    "n = n + redis.call('hdel', KEYS[1], ARGV[i]) end end return n"
)
# Only the owner of a live lease restarts its clock.
_RESTART_CLOCK = (
    "if redis.call('get', KEYS[1]) ~= ARGV[1] or redis.call('exists', KEYS[4]) == 0 then return 0 end "
    "redis.call('hset', KEYS[2], ARGV[2], ARGV[3]); redis.call('hset', KEYS[3], ARGV[2], ARGV[3]); return 1"
)
# Leave the running set only while no live lease exists, in one step: a worker that took the
# lease since the scan keeps its chunk watched, and no duplicate message is sent for it. A dead
# process's lease (a key with no TTL) is deleted here: nothing else would. Also reads the lease
# clock, the evidence of how long the lost worker held the lease; the clock stays until the
# reaper has carried out its decision (drop_clock).
_FORGET_IF_UNLEASED = _LIVE + (
    "local cur = redis.call('get', KEYS[1]) "
    "if live(cur, ARGV[2]) then return false end "
    "if cur then redis.call('del', KEYS[1]) end "
    "if redis.call('srem', KEYS[2], ARGV[1]) == 0 then return false end "
    "local s = redis.call('hget', KEYS[3], ARGV[1]); local b = redis.call('hget', KEYS[4], ARGV[1]); "
    "return {s or '', b or ''}"
)
# One heartbeat of a process: its process key renewed once (a chunk lease costs no command of
# its own: it is live while that key lives), every lease it holds checked to be still its own run's
# (an assist lease renewed, a key of its own), each run's figures added, and what the runs must
# know read back, in one round trip. The leases' holders, the helpers' assist leases and each job's
# committed chunks are read with one MGET or HMGET each, not a command per lease: a running chunk
# costs a value in an MGET and a field in the stamps' HSET here, the rest is per beat or per job.
# A group is a job's leases of one TTL: its keys (figures, lease, assist and member prefixes) go once,
# and a lease names its group, so a running chunk costs the broker eight short strings and no key of
# its own (the strings, not the commands, are most of what the script costs: issue 48's K=128).
# KEYS: lease-beat, then per group: made, pace, unstarted, stats; then the p process keys.
# ARGV: now ms, n leases, G groups, then per group: lease key prefix, assist key prefix, member prefix
# (the lease-beat field), TTL ms; then per lease: index, owner, tokens made since its last figures
# ('0' none), pace JSON ('' none), unstarted samples ('' none), what to look at ('0' nothing, '1' its
# stats, '2' its stats and its assist key), its process key's slot (0: an assist lease, whose key is
# the assist key, unwatched, renewed itself), its group; then each process key's TTL ms.
# Returns per lease 1 (renewed) + 2 (its stats are cached: a run committed it) + 4 (assisted)
# + 8 (looked). The lease-beat stamps and paces go in one HSET per hash, unstarted in one ZADD,
# and the tokens made in one HMGET and one HSET per group (the script is atomic: an HINCRBY per
# lease would make a running chunk cost the broker a command more every full beat).
_BEAT = """
local now, n, G = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local L, p = 3 + 4 * G, #KEYS - 1 - 4 * G
local P = L + 8 * n
local out, beats, made, sets, ranks, asked = {}, {}, {}, {}, {}, {}
local function put(into, g, a, b)
  local t = into[g]
  if not t then t = {}; into[g] = t end
  t[#t + 1] = a; t[#t + 1] = b
end
local alive = {}
for j = 1, p do alive[j] = redis.call('pexpire', KEYS[1 + 4 * G + j], ARGV[P + j]) == 1 end
local lk, ak, at = {}, {}, {}
for i = 1, n do
  local a = L + 8 * (i - 1)
  local g = 4 * tonumber(ARGV[a + 8])
  lk[i] = ARGV[ARGV[a + 7] == '0' and g + 1 or g] .. ARGV[a + 1]
  if ARGV[a + 6] == '2' then ak[#ak + 1] = ARGV[g + 1] .. ARGV[a + 1]; at[i] = #ak end
end
local held = redis.call('mget', unpack(lk))
local helped = #ak > 0 and redis.call('mget', unpack(ak)) or {}
for i = 1, n do
  local a = L + 8 * (i - 1)
  local index, slot, gi = ARGV[a + 1], tonumber(ARGV[a + 7]), tonumber(ARGV[a + 8])
  local g, seen = 4 * gi, 0
  if held[i] == ARGV[a + 2] and (slot > 0 and alive[slot]
      or slot == 0 and redis.call('pexpire', lk[i], ARGV[g + 3]) == 1) then
    seen = 1
    if slot > 0 then beats[#beats + 1] = ARGV[g + 2] .. index; beats[#beats + 1] = now end
  end
  if ARGV[a + 3] ~= '0' then
    local t = made[gi]
    if not t then t = {}; made[gi] = t end
    t[index] = (t[index] or 0) + tonumber(ARGV[a + 3])
  end
  if ARGV[a + 4] ~= '' then put(sets, gi, index, ARGV[a + 4]) end
  if ARGV[a + 5] ~= '' then put(ranks, gi, ARGV[a + 5], index) end
  local look = ARGV[a + 6]
  if look ~= '0' then
    seen = seen + 8
    put(asked, gi, i, index)
    if look == '2' and helped[at[i]] then seen = seen + 4 end
  end
  out[i] = seen
end
for gi, pairs_ in pairs(asked) do
  local fields = {}
  for j = 2, #pairs_, 2 do fields[#fields + 1] = pairs_[j] end
  local stats = redis.call('hmget', KEYS[1 + 4 * gi], unpack(fields))
  for j = 1, #fields do if stats[j] then out[pairs_[2 * j - 1]] = out[pairs_[2 * j - 1]] + 2 end end
end
for gi, adds in pairs(made) do
  local key, fields, sums = KEYS[4 * gi - 2], {}, {}
  for index in pairs(adds) do fields[#fields + 1] = index end
  local had = redis.call('hmget', key, unpack(fields))
  for j = 1, #fields do
    sums[#sums + 1] = fields[j]
    sums[#sums + 1] = string.format('%d', (tonumber(had[j]) or 0) + adds[fields[j]])
  end
  redis.call('hset', key, unpack(sums))
end
if #beats > 0 then redis.call('hset', KEYS[1], unpack(beats)) end
for gi, fields in pairs(sets) do redis.call('hset', KEYS[4 * gi - 1], unpack(fields)) end
for gi, scored in pairs(ranks) do redis.call('zadd', KEYS[4 * gi], unpack(scored)) end
return out
"""
# The beats in between: renewals only (the process key once, each lease checked to be its own),
# and whether the chunks of a few leases (a helper's, an assisted owner's) were committed.
# KEYS: lease-beat, the n lease keys, the m stats keys, the p process keys.
# ARGV: now ms, TTL ms, n, p, then per lease: owner, member ('' unwatched), process slot (0 for an
# assist lease); then the m indexes.
# Returns n renewed flags (0/1), then m committed flags. A running chunk costs the broker a value in
# one MGET and a field in one HSET here, and three strings.
_RENEW_ALL = """
local now, ttl, n, p = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local m = #KEYS - 1 - n - p
local out, beats, leases, alive = {}, {}, {}, {}
for j = 1, p do alive[j] = redis.call('pexpire', KEYS[1 + n + m + j], ttl) == 1 end
for i = 1, n do leases[i] = KEYS[1 + i] end
local held = redis.call('mget', unpack(leases))
for i = 1, n do
  local owner, member, slot = ARGV[2 + 3 * i], ARGV[3 + 3 * i], tonumber(ARGV[4 + 3 * i])
  if held[i] == owner and (slot > 0 and alive[slot]
      or slot == 0 and redis.call('pexpire', KEYS[1 + i], ttl) == 1) then
    out[i] = 1
    if member ~= '' then beats[#beats + 1] = member; beats[#beats + 1] = now end
  else
    out[i] = 0
  end
end
for j = 1, m do
  out[n + j] = redis.call('hexists', KEYS[1 + n + j], ARGV[4 + 3 * n + j])
end
if #beats > 0 then redis.call('hset', KEYS[1], unpack(beats)) end
return out
"""
#: the running set's members whose leases one MGET reads (the reaper's scan, status)
SCAN_SHARD = 1000
# A new owner's clock (its lease is live) is not the lost worker's: it stays.
_DROP_CLOCK_IF_UNLEASED = _LIVE + (
    "if live(redis.call('get', KEYS[1]), ARGV[2]) then return 0 end "
    "redis.call('hdel', KEYS[2], ARGV[1]); redis.call('hdel', KEYS[3], ARGV[1]); return 1"
)


def now_ms() -> int:
    return int(time.time() * 1000)


def held_s(started_ms: int | None, until_ms: int | None) -> float:
    """The lease clock: seconds a lease was held, inf when unknown (no evidence)."""
    if started_ms is None or until_ms is None:
        return math.inf
    return (until_ms - started_ms) / 1000


def _text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


#: this process's boot, in every lease it takes: a worker restarted with the same name and pid (a
#: container's PID 1 on a host's network) is another process, and must not make its predecessor's
#: leases live again by leasing its own process
BOOT = secrets.token_hex(4)


def run_owner(process: str, run: int) -> str:
    """The lease owner of one run: "gpu0@host:1234#9f3ab2c1.7" (process, boot, run). Per run, not
    per process: a stale run (its lease ran out in a broker pause and another run of the chunk took
    it) must fail its renewal even in the same process."""
    return f"{process}#{BOOT}.{run}"


def leased_process(owner: str) -> str:
    """The process boot whose key (keys.process_lease) keeps `owner`'s leases live: "gpu0@host:1234#9f3ab2c1"
    (the owner up to its run, as the scripts' `live` reads it); an owner with no boot, its process."""
    m = _LEASED_PROCESS.match(owner)
    return m.group(1) if m else process_of(owner)


#: the characters a Redis MATCH pattern reads as glob (escaped in a job's name)
_GLOB = re.compile(r"[*?\[\]\\]")
_LEASED_PROCESS = re.compile(r"([^#]*#[^.]*)\.")


def process_of(owner: str) -> str:
    """"gpu0@host:1234#7" (a run's lease owner) -> "gpu0@host:1234" (its process)."""
    return owner.partition("#")[0]


class Lease:
    """A key per running chunk naming its run, live while its process's short-lived key lives,
    which a heartbeat renews (fleet.coord.heartbeat): the process is leased, not each chunk.

    Celery over Redis redelivers a killed worker's chunk only after the visibility timeout
    (hours). A lease runs out with its process's key within a minute, so the reaper can hand
    the chunk to another worker long before that, and a duplicate delivery sees the live lease
    and skips. Only the chunk lease is watched (running set, lease clock); an assist lease is
    not, and is a short-lived key of its own.
    """

    def __init__(self, r: redis.Redis, job: str, index: int, owner: str, ttl_s: float, assist: bool = False,
                 store: str = ""):
        """`owner` names the run (`run_owner`), or the process where one run per process is meant;
        `store` the id of the job's store, whose job set a watched lease relearns the job into."""
        self.r, self.job, self.index, self.owner, self.store = r, job, index, owner, store
        self.key = keys.assist(job, index) if assist else keys.lease(job, index)
        #: only the chunk lease puts the chunk in the running set the reaper watches
        self.watched = not assist
        self.ttl_ms = max(1, int(ttl_s * 1000))
        #: set by a failed renewal; the lease middleware retakes the lease or cancels the run
        self.lost = False
        #: ms epoch this owner last took the lease (the start of the lease clock)
        self.taken_ms: int | None = None
        #: ms epoch of this owner's last stamp of the lease beat (taken, restarted or renewed)
        self.beat_ms: int | None = None
        #: its release reached the broker (a discarded lease not released runs out: Heartbeat.discard)
        self.released = False
        #: the key of its process (keys.process_lease), which keeps a chunk lease live
        self.process_key = keys.process_lease(leased_process(owner))

    @property
    def _member(self) -> str:
        return keys.member(self.job, self.index) if self.watched else ""

    def acquire(self) -> bool:
        """Take the lease (and lease its process); a watched one also enters the running set and
        stamps its start, atomically."""
        return self._take(now_ms(), retake=False)

    def retake(self) -> bool:
        """Take the lease again after it ran out under this run (a broker pause, a wipe): the
        lease clock keeps its start, so the crash evidence still times the whole run. A lease
        that still names this run is its own again (its process's key came back meanwhile)."""
        return self._take(self.taken_ms or now_ms(), retake=True)

    def _take(self, started: int, retake: bool) -> bool:
        now = now_ms()
        ok = bool(self.r.eval(_ACQUIRE, 7, self.key, keys.running(), keys.lease_started(), keys.lease_beat(),
                              keys.job_stores(), self.process_key, keys.lease_processes(), self.owner, self.ttl_ms,
                              self._member, started, self.job, now, self.store, keys.process_lease(""),
                              int(retake)))
        if ok:
            self.lost, self.taken_ms, self.beat_ms = False, started, now
        return ok

    def renew(self) -> bool:
        now = now_ms()
        ok = bool(self.r.eval(_RENEW, 3, self.key, keys.lease_beat(), self.process_key, self.owner, self.ttl_ms,
                              self._member, now))
        if ok:
            self.beat_ms = now
        if not ok and not self.lost:
            self.lost = True
            log.warning("lease on %s/%d lost (expired or taken over)", self.job, self.index)
        return ok

    def release(self) -> None:
        self.r.eval(_RELEASE, 6, self.key, keys.running(), keys.lease_started(), keys.lease_beat(),
                    self.process_key, keys.lease_let_go(), self.owner, self._member)
        self.released = True

    def let_go(self) -> None:
        """Its process stopped renewing it and its release never reached the broker: it runs out
        now, a TTL after its last renewal, as an unrenewed key would (the chunk stays watched)."""
        self.r.eval(_LET_GO, 2, self.key, keys.lease_let_go(), self.owner)
        self.released = True

    def restart_clock(self) -> None:
        """The run starts only now (it waited, leased, for its worker's other chunks to end so
        as to run alone): the lease clock, the crash evidence, starts again here, for the
        reaper (in Redis) and for a failure this owner sees."""
        if not self.watched:
            return
        now = now_ms()
        if self.r.eval(_RESTART_CLOCK, 4, self.key, keys.lease_started(), keys.lease_beat(), self.process_key,
                       self.owner, self._member, now):
            self.taken_ms = self.beat_ms = now

    def held_s(self) -> float:
        """How long this owner has held the lease now: the crash evidence of a failure it saw."""
        return held_s(self.taken_ms, now_ms())

    def young(self, window_s: float) -> bool:
        """Whether its last stamp still dates a death inside the crash window (`window_s` after the
        start of the lease clock): until one stamp lies past it, a lost worker's death there is
        evidence (fleet.coord.retry), timed to the stamp, so every beat renews it. An unwatched
        (assist) lease has no clock."""
        if not self.watched:
            return False
        if self.taken_ms is None or self.beat_ms is None:
            return True
        return self.beat_ms - self.taken_ms < window_s * 1000

    def holder(self) -> str | None:
        """The process holding the lease now (whichever run of it)."""
        if self.watched:
            return holder(self.r, self.job, self.index)
        value = _text(self.r.get(self.key))
        return process_of(value) if value else None


class Look(IntEnum):
    """What a beat reads back for a lease besides its renewal."""

    #: nothing
    NONE = 0
    #: whether the chunk's stats are cached (a run committed it)
    COMMITTED = 1
    #: that, and whether a helper holds its assist lease
    ASSISTED = 2


@dataclass(frozen=True)
class Figures:
    """What a run reports with its lease's renewal: output tokens made since its last figures, and
    an owner's pace ({made, started_ms, samples, sample_tokens}) and samples not started yet
    (None: nothing to say, as for a helper's copy); and what the beat reads back for it."""

    made: int = 0
    pace: dict[str, int] | None = None
    unstarted: int | None = None
    look: Look = Look.NONE


@dataclass(frozen=True)
class Seen:
    """What one beat read back for a lease."""

    renewed: bool
    #: what it looked at (Figures.look); the two below say nothing without it
    looked: bool = False
    #: the chunk's stats are cached: a run committed it (a sign the store confirms)
    committed: bool = False
    #: a helper holds the chunk's assist lease
    assisted: bool = False


def beat(r: redis.Redis, leases: list[Lease], figures: list[Figures]) -> list[Seen]:
    """Renew the given leases of a process and add its runs' figures, in one round trip (one
    script, one command): a worker's round trips do not grow with the chunks it runs. A beat
    without figures (and leases of one TTL, as a worker's are) runs the lighter renewal script.
    A lease whose renewal failed is marked lost, as by `Lease.renew`; one not given is untouched."""
    if not leases:
        return []
    now = now_ms()
    full = any(f.made or f.pace is not None or f.unstarted is not None or f.look is Look.ASSISTED for f in figures)
    if full or len({x.ttl_ms for x in leases}) > 1:
        seen = _full_beat(r, leases, figures, now)
    else:
        seen = _renew_all(r, leases, figures, now)
    for lease, s in zip(leases, seen, strict=True):
        if s.renewed:
            lease.beat_ms = now
        elif not lease.lost:
            lease.lost = True
            log.warning("lease on %s/%d lost (expired or taken over)", lease.job, lease.index)
    return seen


def _processes(leases: list[Lease]) -> tuple[list[int], dict[str, int]]:
    """Each lease's process key slot (1-based; 0 for an assist lease, a key of its own) and each
    process key's TTL: the longest of its leases' (one TTL a worker)."""
    slots: dict[str, int] = {}
    ttls: dict[str, int] = {}
    of = []
    for lease in leases:
        if not lease.watched:
            of.append(0)
            continue
        of.append(slots.setdefault(lease.process_key, len(slots) + 1))
        ttls[lease.process_key] = max(ttls.get(lease.process_key, 0), lease.ttl_ms)
    return of, ttls


def _full_beat(r: redis.Redis, leases: list[Lease], figures: list[Figures], now: int) -> list[Seen]:
    slots, ttls = _processes(leases)
    groups: dict[tuple[str, int], int] = {}
    args: list[str | int] = []
    for lease, fig, slot in zip(leases, figures, slots, strict=True):
        group = groups.setdefault((lease.job, lease.ttl_ms), len(groups) + 1)
        pace = json.dumps(fig.pace | {"at_ms": now}) if fig.pace is not None else ""
        args += [lease.index, lease.owner, fig.made, pace, "" if fig.unstarted is None else fig.unstarted,
                 int(fig.look), slot, group]
    keys_: list[str] = [keys.lease_beat()]
    head: list[str | int] = [now, len(leases), len(groups)]
    for job, ttl_ms in groups:
        made, pace_key, unstarted, stats = figure_keys(job)
        keys_ += [made, pace_key, unstarted, stats]
        head += [_prefix(keys.lease, job), _prefix(keys.assist, job), _prefix(keys.member, job), ttl_ms]
    keys_ += list(ttls)
    flags = r.register_script(_BEAT)(keys=keys_, args=head + args + list(ttls.values()))
    return [Seen(renewed=bool(f & 1), looked=bool(f & 8), committed=bool(f & 2), assisted=bool(f & 4))
            for f in flags]


def _prefix(key_of: Callable[[str, int], str], job: str) -> str:
    """What a job's per-chunk key or field is before its index (the beat's script adds the index)."""
    key = key_of(job, 0)
    assert key.endswith("0"), key
    return key[:-1]


def _renew_all(r: redis.Redis, leases: list[Lease], figures: list[Figures], now: int) -> list[Seen]:
    looks = [n for n, f in enumerate(figures) if f.look is not Look.NONE]
    slots, ttls = _processes(leases)
    keys_ = [keys.lease_beat(), *(x.key for x in leases), *(figure_keys(leases[n].job).stats for n in looks),
             *ttls]
    args: list[str | int] = [now, leases[0].ttl_ms, len(leases), len(ttls)]
    for lease, slot in zip(leases, slots, strict=True):
        args += [lease.owner, lease._member, slot]
    args += [leases[n].index for n in looks]
    flags = r.register_script(_RENEW_ALL)(keys=keys_, args=args)
    committed = dict(zip(looks, flags[len(leases):], strict=True))
    return [Seen(renewed=bool(flags[n]), looked=n in committed, committed=bool(committed.get(n)))
            for n in range(len(leases))]


def _alive(r: redis.Redis, procs: list[str]) -> dict[str, bool]:
    """Whether each process's key (keys.process_lease) lives: an MGET per SCAN_SHARD processes."""
    alive: dict[str, bool] = {}
    for start in range(0, len(procs), SCAN_SHARD):
        part = procs[start:start + SCAN_SHARD]
        alive.update(zip(part, (v is not None for v in r.mget([keys.process_lease(p) for p in part])), strict=True))
    return alive


def _live(r: redis.Redis, values: list[bytes | str | None]) -> list[bool]:
    """Which chunk leases' values name a live process: one MGET of their processes' keys (a shard's leases
    name at most SCAN_SHARD processes)."""
    named = [leased_process(_text(v) or "") if v else None for v in values]
    alive = _alive(r, sorted({p for p in named if p is not None}))
    return [p is not None and alive[p] for p in named]


def holder(r: redis.Redis, job: str, index: int) -> str | None:
    """The process holding the chunk's lease now (whichever run of it); None when its process is gone."""
    value = r.get(keys.lease(job, index))
    return process_of(_text(value) or "") if value and _live(r, [value])[0] else None


def leased(r: redis.Redis, job: str, index: int) -> bool:
    return holder(r, job, index) is not None


def assisted(r: redis.Redis, job: str, index: int) -> bool:
    """Whether a helper holds the chunk's assist lease now."""
    return bool(r.exists(keys.assist(job, index)))


def running_indexes(r: redis.Redis, job: str) -> set[int]:
    """Chunks whose lease is live right now."""
    members = [keys.parse_member(m.decode()) for m in set_members(r, keys.running())]
    mine = [(j, i) for j, i in members if j == job]
    return {i for (_, i), ok in zip(mine, leased_of(r, mine), strict=True) if ok}


def leased_of(r: redis.Redis, chunks_: list[tuple[str, int]]) -> list[bool]:
    """Whether each chunk's lease is live: two MGETs per SCAN_SHARD chunks (the leases, then their
    processes' keys), so a fleet of a thousand workers running 16 chunks each is 32 round trips and
    32 commands, never one per chunk."""
    out: list[bool] = []
    for start in range(0, len(chunks_), SCAN_SHARD):
        out += _live(r, r.mget([keys.lease(job, index) for job, index in chunks_[start:start + SCAN_SHARD]]))
    return out


def watches_any(r: redis.Redis, job: str) -> bool:
    """Whether any chunk of the job is in the running set, leased or not: SSCAN slices that match the
    job's members, up to the first, so a running job costs the broker one slice where reading the whole
    set cost every member (128,000 at 1,000 workers of K=128) a round."""
    pattern = _GLOB.sub(r"\\\g<0>", job) + "/*"
    return any(keys.parse_member(m.decode())[0] == job
               for m in r.sscan_iter(keys.running(), match=pattern, count=SLICE))


def scan_leases(r: redis.Redis) -> tuple[list[tuple[str, int]], int]:
    """The running set's chunks whose lease is gone, every job, and how many have a live one."""
    members = [keys.parse_member(raw.decode()) for raw in set_members(r, keys.running())]
    alive = leased_of(r, members)
    return [m for m, ok in zip(members, alive, strict=True) if not ok], sum(alive)


def dead_processes(r: redis.Redis) -> dict[str, str]:
    """The processes that took a chunk lease (keys.lease_processes) and whose key ran out, each with the
    stamp of its last take: one HSCAN slice per thousand and an MGET per SCAN_SHARD processes, whatever
    the chunks they hold."""
    taken = {p.decode(): t.decode() for p, t in hash_items(r, keys.lease_processes()).items()}
    alive = _alive(r, list(taken))
    return {p: t for p, t in taken.items() if not alive[p]}


def forget_dead(r: redis.Redis, processes: dict[str, str]) -> int:
    """Take dead processes (each with the stamp `dead_processes` read) out of those the reaper checks,
    each unless its key came back or it took a lease since; how many left."""
    if not processes:
        return 0
    return int(r.eval(_FORGET_DEAD, 1, keys.lease_processes(), keys.process_lease(""),
                      *(x for item in processes.items() for x in item)))


def lets_go(r: redis.Redis) -> int:
    """How many leases were let go on this broker (keys.lease_let_go): a change means a scan is due."""
    return int(r.get(keys.lease_let_go()) or 0)


def forget_unleased(r: redis.Redis, job: str, index: int) -> float | None:
    """Remove a lease-less chunk from the running set; None if it has a lease (or is gone),
    else how long its lost worker held the lease (the lease clock; inf when unknown). The
    clock stays until `drop_clock`."""
    got = r.eval(_FORGET_IF_UNLEASED, 4, keys.lease(job, index), keys.running(), keys.lease_started(),
                 keys.lease_beat(), keys.member(job, index), keys.process_lease(""))
    if not got:
        return None
    started, beat = (_text(v) for v in got)
    return held_s(int(started) if started else None, int(beat) if beat else None)


def lease_clock(r: redis.Redis, job: str, index: int) -> tuple[int | None, int | None]:
    """When the chunk's lease was taken and last renewed (ms epoch; None when unknown): its last
    beat plus the TTL is when a lost lease ran out."""
    with r.pipeline(transaction=False) as p:
        p.hget(keys.lease_started(), keys.member(job, index))
        p.hget(keys.lease_beat(), keys.member(job, index))
        started, beat = p.execute()
    return (int(started) if started else None), (int(beat) if beat else None)


def drop_clock(r: redis.Redis, job: str, index: int) -> None:
    """The lost worker's lease clock, once the reaper has judged its chunk: until then a failed
    round leaves the evidence to the next (a clock read as unknown would clear the suspicion)."""
    r.eval(_DROP_CLOCK_IF_UNLEASED, 3, keys.lease(job, index), keys.lease_started(), keys.lease_beat(),
           keys.member(job, index), keys.process_lease(""))


def rewatch(r: redis.Redis, job: str, index: int) -> None:
    """Put a forgotten chunk back in the running set, for the next reaper round to retry."""
    r.sadd(keys.running(), keys.member(job, index))


def claim_recovery(r: redis.Redis, job: str, index: int, ttl_s: int) -> bool:
    """Whether this reaper is the one (for `ttl_s`) that recovers the lost chunk."""
    return bool(r.set(keys.requeue_guard(job, index), "1", nx=True, ex=ttl_s))


# --- the job sets -----------------------------------------------------------------------


def add_job(r: redis.Redis, job: str, store: str) -> str:
    """A job's chunks are about to be sent (fleet.coord.chunkqueue): the broker knows it as the
    store's from now, unless another store's job has the name. The store that owns it."""
    r.hsetnx(keys.job_stores(), job, store)
    return job_store(r, job) or store


def job_store(r: redis.Redis, job: str) -> str | None:
    """The id of the store whose job `job` is on this broker, if any."""
    return _text(r.hget(keys.job_stores(), job))


def known_jobs(r: redis.Redis, store: str) -> list[str]:
    """The store's jobs this broker knows (enqueued, or relearned from a running chunk's lease)."""
    return sorted(_text(job) or "" for job, owner in hash_items(r, keys.job_stores()).items() if _text(owner) == store)


def drop_job(r: redis.Redis, job: str, store: str) -> bool:
    """The job leaves the store's job set; never another store's job. Whether it did."""
    return bool(r.eval(_DROP_JOB, 1, keys.job_stores(), job, store))


def legacy_jobs(r: redis.Redis) -> list[str]:
    """Jobs of the one job set every store shared before issue 44, not yet adopted."""
    return sorted(_text(m) or "" for m in r.smembers(keys.legacy_jobs()))


def adopt_job(r: redis.Redis, job: str, store: str) -> None:
    """A job of the old shared set whose manifest the store holds joins the store's job set."""
    r.hsetnx(keys.job_stores(), job, store)
    r.srem(keys.legacy_jobs(), job)
