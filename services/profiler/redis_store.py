"""Metrics in Redis, shared by every profiler replica that uses the same key prefix.

Layout: one hash per family, `<prefix>:forward`, `<prefix>:acceptance` and `<prefix>:similarity`. A field
is a metric's key as JSON (`["stdlib-29m",4,8]`); its value is the record as text, the EMAs then the
totals, written with 17 significant digits so that every double survives the trip exactly.

Atomicity: a whole report is one Lua script run with EVALSHA (redis-py's `Script` loads it again when a
restarted Redis has forgotten it). Redis runs a script alone, so reports from many routers and profiler
replicas interleave whole: no update is lost to a read-modify-write race, and a snapshot (the hashes read
in one MULTI) never sees half a report. All replicas sharing a prefix must use the same EMA constants.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from specrouter.profiler.errors import StoreUnavailable
from specrouter.profiler.metrics import Ema, FAMILIES, Records, Update
from specrouter.contract.measures import EmaConstants

# KEYS: the families' hashes. ARGV, per update: index into KEYS, field, keep, gain, k, x_1 .. x_k.
# Same arithmetic, in the same order, as `Ema.updated` (keep and gain come from `Update.weights`).
_UPDATE_LUA = """
local i = 1
while i <= #ARGV do
  local key, field = KEYS[tonumber(ARGV[i])], ARGV[i + 1]
  local keep, gain, k = tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4])
  local old = {}
  for v in string.gmatch(redis.call('HGET', key, field) or '', '%S+') do old[#old + 1] = tonumber(v) end
  local new = {}
  for j = 1, k do
    local x = tonumber(ARGV[i + 4 + j])
    new[j] = string.format('%.17g', keep * (old[j] or 0) + gain * x)
    new[k + j] = string.format('%.17g', (old[k + j] or 0) + x)
  end
  redis.call('HSET', key, field, table.concat(new, ' '))
  i = i + 5 + k
end
return 1
"""


def decode_record(text: bytes) -> Ema:
    values = [float(v) for v in text.split()]
    size = len(values) // 2
    return Ema(tuple(values[:size]), tuple(values[size:]))


@contextlib.contextmanager
def _unavailable() -> Iterator[None]:
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as error:
        raise StoreUnavailable(f"redis: {error}") from error


class RedisStore:
    def __init__(self, client: redis.Redis, ema_alpha: float, key_prefix: str,
                 acceptance_alpha: float = EmaConstants.acceptance_alpha):
        self.constants = EmaConstants(ema_alpha, acceptance_alpha)
        self._client = client
        self._keys = {family: f"{key_prefix}:{family}" for family in FAMILIES}
        self._update = client.register_script(_UPDATE_LUA)

    @classmethod
    def from_url(cls, url: str, ema_alpha: float, key_prefix: str, timeout_s: float,
                 acceptance_alpha: float = EmaConstants.acceptance_alpha) -> RedisStore:
        # One retry, at once: it replaces a pooled connection that died with a restarted Redis. Longer
        # outages fail fast and are handled by the caller (stale snapshots, dropped reports).
        client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                      retry=Retry(NoBackoff(), 1))
        return cls(client, ema_alpha, key_prefix, acceptance_alpha)

    def apply(self, updates: Sequence[Update]) -> None:
        families = sorted({u.family for u in updates})
        index = {family: i + 1 for i, family in enumerate(families)}
        args: list[str | int] = []
        for u in updates:
            keep, gain = u.weights(self.constants)
            args += [index[u.family], u.field, repr(keep), repr(gain), len(u.x), *map(repr, u.x)]
        if updates:
            with _unavailable():
                self._update(keys=[self._keys[f] for f in families], args=args)

    def records(self) -> Records:
        with _unavailable():
            pipe = self._client.pipeline(transaction=True)
            for key in self._keys.values():
                pipe.hgetall(key)
            replies = pipe.execute()
        return {family: {field.decode(): decode_record(text) for field, text in reply.items()}
                for family, reply in zip(self._keys, replies)}

    def close(self) -> None:
        self._client.close()
