"""Sampled requests and the cache (`cache.sampled`, docs/cache.md "Sampled requests").

A request sampled at temperature > 0 without a `seed` asks for a new draw each time:
a client that calls twice (self-consistency, retries for variety) expects two samples,
and both APIs default to temperature 1, so most SDK calls are sampled. Such a request
is cached only as the operator (`cache.sampled`) or the request itself
(`X-ZCCP-Cache-Sampled: on | off`, ZCCP_FLAG_SAMPLED_*) says:

    off    (default) no lookup, no store: every call is a fresh sample
    store  no lookup, but the answer is stored: a request that says `on` may reuse it
    on     looked up and stored like a deterministic request

The request's header wins over the setting. A deterministic request (temperature 0, a
`seed`, or top_k 1) is never affected. nginx's L1 keeps a sampled answer only under "on"
(it serves anyone sending the same request), and skips its lookup for a request that
says `off`.
"""

from __future__ import annotations

from dataclasses import dataclass

from zccp.transport.abi import Flag
from zccp.shared_types import SamplingParams


def is_sampled(s: SamplingParams) -> bool:
    """Each call may draw another answer: temperature > 0, no seed, more than one candidate token."""
    return s.temperature > 0 and s.seed is None and s.top_k != 1


@dataclass(frozen=True)
class SampledUse:
    """What the cache may do with one request."""

    sampled: bool
    lookup: bool
    store: bool
    l1: bool          # nginx may keep its answer: everyone would be served it (not sampled, or "on")


# A greedy request's use (frozen, so one object serves every request that is not sampled)
UNSAMPLED = SampledUse(False, True, True, True)


def sampled_use(s: SamplingParams, setting: str, flags: int) -> SampledUse:
    """The cache's use of a request with these sampling parameters, under `cache.sampled`
    and the request's own X-ZCCP-Cache-Sampled (its flags)."""
    if not is_sampled(s):
        return UNSAMPLED
    mode = "on" if flags & Flag.SAMPLED_ON else "off" if flags & Flag.SAMPLED_OFF else setting
    # L1 serves whoever sends the same request (nginx skips it only for SAMPLED_OFF): it may
    # keep a sample only when the setting serves samples to everyone
    return SampledUse(True, mode == "on", mode in ("on", "store"), setting == "on")
