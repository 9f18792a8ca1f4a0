"""The purge epoch: one Redis key every host sharing the cache reads, replaced by every
purge. Each engine copies it into its arena's control page (`purge_epoch`) every POLL_S;
nginx's L1 keys carry the value read when the request began, so a purge on any host empties
every host's L1 within POLL_S (docs/cache.md "Purge"), not after `cache.l1.ttl_s`.

The value is random, never a counter: an epoch that Redis evicted or lost is replaced by a
fresh one (SET NX), which can never bring back an L1 entry stored under an earlier value.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zccp.cache.redis_target import RedisClient

log = logging.getLogger("zccp.cache.purge_epoch")

# Outside "zccp:*" (what `purge --all` deletes and counts): a purge replaces it, never deletes it.
EPOCH_KEY = "zccp_purge_epoch"
POLL_S = 0.25
UNKNOWN = 0          # what nginx reads as "no L1 answers now"
_MAX = (1 << 63) - 1


def new_epoch() -> int:
    return secrets.randbits(62) + 1


def _parse(value: object) -> int:
    """The stored epoch, or UNKNOWN for anything that is not one (Redis is input too)."""
    try:
        e = int(value)   # type: ignore[call-overload]
    except (TypeError, ValueError):
        return UNKNOWN
    return e if 0 < e <= _MAX else UNKNOWN


async def bump(redis: RedisClient) -> int:
    """A purge's last step, after its deletes: every host's L1 forgets what it kept."""
    e = new_epoch()
    await redis.set(EPOCH_KEY, str(e))
    return e


async def read(redis: RedisClient) -> int:
    """The current epoch; a missing one is created (the first engine, or one evicted)."""
    value = await redis.get(EPOCH_KEY)
    if value is None:
        await redis.set(EPOCH_KEY, str(new_epoch()), nx=True)
        value = await redis.get(EPOCH_KEY)
    return _parse(value)


class EpochWatcher:
    """Reads the epoch every poll_s and hands it to publish (the arena's control page).
    A failed read publishes UNKNOWN once the last good value is older than two polls: a
    host that cannot see purges answers nothing from its L1 (when in doubt, miss)."""

    def __init__(self, redis: RedisClient, publish: Callable[[int], None], timeout_s: float,
                 poll_s: float = POLL_S) -> None:
        self._redis = redis
        self._publish = publish
        self._timeout_s = timeout_s
        self._poll_s = poll_s
        self._failures = 0

    async def once(self) -> int:
        try:
            e = await asyncio.wait_for(read(self._redis), self._timeout_s)
            self._failures = 0
        except Exception as exc:   # Redis down or slow: the last value stands for one poll
            self._failures += 1
            if self._failures == 2:
                log.warning("purge epoch unreadable (%s): nginx's L1 answers nothing until it is back",
                            str(exc) or type(exc).__name__)
            if self._failures < 2:
                return UNKNOWN
            e = UNKNOWN
        self._publish(e)
        return e

    async def run(self) -> None:
        while True:
            await self.once()
            await asyncio.sleep(self._poll_s)
