"""Identical requests in flight wait for the first one (nginx's proxy_cache_lock, for
the model): the seed's "cache penetration avalanche" is N identical prompts arriving
before the first answer is stored, and starting N generations.

The first request to miss on an exact key owns it until its answer is stored (or it
fails); requests that miss on the same key meanwhile wait for that, bounded, and then
look the cache up again. An owner whose claim came after some other owner released
(`releases` moved since it looked the cache up) looks again too: the answer it missed may
have been stored in between. The second lookup is an ordinary one, so every rule of the
cache (scope, tenant, masked literals, no-store) decides what they get; when it still
misses (the owner failed, or its answer carries a value only its own request had)
they run the model on their own. Everything here runs on the engine's event loop.
"""

from __future__ import annotations

import asyncio

__all__ = ["InFlight"]


class InFlight:
    """Exact store keys being generated -> the future their waiters wait on."""

    def __init__(self) -> None:
        self._owners: dict[bytes, asyncio.Future[None]] = {}
        self.releases = 0    # how many owners have released: a lookup's snapshot of it says
        #                      whether an answer may have been stored since that lookup began

    def __len__(self) -> int:
        return len(self._owners)

    def claim(self, key: bytes) -> asyncio.Future[None] | None:
        """None: the caller owns `key` now and must call release(key) when its answer is
        stored or lost. Otherwise the future to wait on (someone else owns it)."""
        fut = self._owners.get(key)
        if fut is not None:
            return fut
        self._owners[key] = asyncio.get_running_loop().create_future()
        return None

    def release(self, key: bytes) -> None:
        """The owner is done (stored, or not): its waiters look again. Idempotent."""
        fut = self._owners.pop(key, None)
        self.releases += 1
        if fut is not None and not fut.done():
            fut.set_result(None)

    @staticmethod
    async def wait(fut: asyncio.Future[None], timeout_s: float) -> bool:
        """Whether the owner finished within timeout_s (the waiter never cancels it)."""
        if timeout_s <= 0:
            return fut.done()
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False
