"""The front tier (docs/scale-out.md, "The front tier"), on loopback: two complete ZCCP
hosts on 127.0.0.2 and 127.0.0.3, the same port on both (what a Kubernetes headless
Service's Pods look like), a DNS server (tests/support/dns_server.py) that answers their
addresses for one name, and the front nginx (nginx/front.conf, rendered by
`zccp-nginx render --front`) routing each conversation to a host by its route key.

Each host runs the null model with a reply of its own, and they share no cache, so an
answer says which host served it.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import struct
import subprocess
import threading
from collections.abc import Iterator

import httpx
import pytest

from tests.support.cache_requests import NULL, PATHS
from tests.support.dns_server import DnsServer
from tests.support.front_tier import (
    ADDRS,
    API_OF,
    CONVERSATIONS,
    Front,
    HOST_OF,
    NAME,
    REPLY,
    body,
    first_turn,
    placement,
    port_free_on_both,
    served_by,
    text_of,
    turns,
    wait_for,
)
from tests.support.harness import Stack


# ------------------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def dns() -> Iterator[DnsServer]:
    d = DnsServer(NAME, list(ADDRS.values())).start()
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Stack]]:
    port = port_free_on_both()
    run_dir = tmp_path_factory.mktemp("front-hosts")
    made: dict[str, Stack] = {}
    try:
        for name, addr in ADDRS.items():
            made[name] = Stack(run_dir / name, {"server": {"listen": f"{addr}:{port}"},
                                                "model": dict(NULL, null_reply=REPLY[name])}).start()
        yield made
    finally:
        for s in made.values():
            s.stop()


@pytest.fixture(scope="module")
def front(dns: DnsServer, hosts: dict[str, Stack]) -> Iterator[Front]:
    port = int(hosts["a"].cfg.server.listen.rsplit(":", 1)[1])
    f = Front(dns.address, port)
    try:
        yield f.start()
    finally:
        f.stop()


@pytest.fixture
def both(front: Front, dns: DnsServer) -> Front:
    """The front, once it routes over both hosts."""
    dns.set_addresses(list(ADDRS.values()))
    wait_for("both hosts in the front's list", lambda: sorted(front.hosts()) == sorted(ADDRS.values()))
    return front


# ------------------------------------------------------------------------------------- routing

def test_conversations_stick_to_one_host_and_spread_over_both(both):
    first = placement(both)
    assert set(first.values()) == set(ADDRS), first            # both hosts get conversations
    assert placement(both) == first                            # and each keeps its host
    # the same request through either API's SDK-style retry lands on the same host again
    for i in range(4):
        assert {served_by(both, API_OF[i % 2], first_turn(i)) for _ in range(3)} == {first[i]}


def test_a_conversations_later_turns_follow_its_first(both):
    for i in range(8):
        api = API_OF[i % 2]
        hosts_seen = {served_by(both, api, msgs) for msgs in turns(i, 4)}
        assert len(hosts_seen) == 1, (i, hosts_seen)


def _breakpoint_on_last_block(msgs: list) -> list:
    """Anthropic's recommended prompt caching: every message as text blocks, cache_control
    on the last block of the last message only (so it moves every turn)."""
    out = [{"role": m["role"], "content": [{"type": "text", "text": m["content"]}]} for m in msgs]
    out[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    return out


def test_a_prompt_caching_conversation_keeps_its_host(both):
    for i in range(16):
        hosts_seen = {served_by(both, "anthropic", _breakpoint_on_last_block(msgs)) for msgs in turns(i, 4)}
        assert len(hosts_seen) == 1, (i, hosts_seen)   # on main: 5-7 of 16 moved


def test_unfingerprinted_bodies_route_by_their_start(both):
    """A body the fingerprint does not decode (here: over its 64 KiB limit, by a long
    `user` field at its end) routes by its first 4 KiB: when a conversation starts with
    more than that (an agent's system prompt and tools), the same every turn."""
    seen = set()
    for i in range(8):
        msgs = [{"role": "system", "content": f"You are agent {i}. " + "Follow the house rules. " * 200},
                first_turn(i)[1]]
        big = "u" * 70_000
        seen |= {served_by(both, "openai", msgs, user=big) for _ in range(2)}
        longer = msgs + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more?"}]
        assert served_by(both, "openai", longer, user=big) == served_by(both, "openai", msgs, user=big)
    assert seen == set(ADDRS)
    log = (both.conf.parent / "logs" / "front-access.log").read_text()
    assert '"route":"body"' in log and '"route":"fingerprint"' in log


@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_streaming_through_the_front(both, api):
    msgs = first_turn(7)
    expected = served_by(both, api, msgs)
    with both.client() as c, c.stream("POST", PATHS[api], json=body(api, msgs, stream=True)) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    import json

    text = ""
    for e in events:
        if e == "[DONE]":
            continue
        j = json.loads(e)
        if api == "anthropic" and j["type"] == "content_block_delta":
            text += j["delta"]["text"]
        elif api == "openai" and j.get("choices"):
            text += j["choices"][0]["delta"].get("content") or ""
    assert text == REPLY[expected]                  # the same host as without streaming
    assert api == "anthropic" or events[-1] == "[DONE]"


SLOW_REPLY = " ".join(f"word{i}" for i in range(20))   # the null model: one token a character


def test_a_stream_reaches_the_client_while_its_host_is_still_generating(front, dns, hosts, tmp_path):
    """Unbuffered: the client reads the first text event while the host still holds the
    request's slot (its model takes 25 ms a token, about 120 tokens: 3 s). A buffering front would hand
    over nothing before the host had finished and freed the slot."""
    port = int(hosts["a"].cfg.server.listen.rsplit(":", 1)[1])
    slow = Stack(tmp_path / "slow", {"server": {"listen": f"127.0.0.4:{port}"},
                                     "model": dict(NULL, null_reply=SLOW_REPLY, null_token_delay_ms=25)}).start()
    try:
        dns.set_addresses(["127.0.0.4"])
        wait_for("only the slow host in the list", lambda: front.hosts() == ["127.0.0.4"])
        claimed_at_first_event = None
        text = ""
        import json

        with front.client() as c, c.stream("POST", PATHS["anthropic"],
                                           json=body("anthropic", first_turn(1), stream=True, max_tokens=400)) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                j = json.loads(line[6:])
                if j["type"] == "content_block_delta":
                    if claimed_at_first_event is None:
                        claimed_at_first_event = slow.health()["slots_claimed"]
                    text += j["delta"]["text"]
        assert claimed_at_first_event == 1
        assert text == SLOW_REPLY
        slow.assert_no_leaks()
    finally:
        dns.set_addresses(list(ADDRS.values()))
        wait_for("both hosts back in the list", lambda: sorted(front.hosts()) == sorted(ADDRS.values()))
        slow.stop()


def test_a_body_over_the_limit_is_the_apis_own_413(both):
    """front.max_body_kb (256 here, the hosts' limit): refused at the front, in the API's shape."""
    with both.client() as c:
        for api in ("anthropic", "openai"):
            r = c.post(PATHS[api], json=body(api, first_turn(1) + [{"role": "user", "content": "y" * 270_000}]))
            assert r.status_code == 413 and r.headers["content-type"] == "application/json"
            j = r.json()
            assert (j["error"]["type"] == "request_too_large" if api == "anthropic"
                    else j["error"]["code"] == "request_too_large"), j
        # just under it: a host answers
        r = c.post(PATHS["openai"], json=body("openai", first_turn(2), user="u" * 200_000))
        assert r.status_code == 200 and HOST_OF[text_of("openai", r.json())]


def _connections_to(addr: str, port: int) -> list[str]:
    """Every TCP socket on this machine whose peer is addr:port, by state (ss)."""
    out = subprocess.run(["ss", "-tanH", "dst", f"{addr}:{port}"], capture_output=True, text=True, check=True)
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def test_the_front_keeps_its_connections_to_the_hosts_alive(both, hosts):
    """HTTP/1.1 keep-alive (upstream keepalive after balancer_by_lua): 40 requests to the
    hosts open at most a connection per front worker and host, and close none."""
    port = int(hosts["a"].cfg.server.listen.rsplit(":", 1)[1])
    placement(both)                              # every worker has been to both hosts
    before = {a: _connections_to(a, port) for a in ADDRS.values()}
    for i in range(40):
        served_by(both, API_OF[i % 2], first_turn(i % CONVERSATIONS))
    for a in ADDRS.values():
        now = _connections_to(a, port)
        assert now.count("ESTAB") <= 2, (a, before[a], now)
        # (the harness's health checks of the hosts left some of their own before)
        assert now.count("TIME-WAIT") == before[a].count("TIME-WAIT"), (a, before[a], now)


def test_a_host_added_to_dns_gets_traffic_after_re_resolve(front, dns):
    dns.set_addresses([ADDRS["a"]])
    wait_for("only host a in the list", lambda: front.hosts() == [ADDRS["a"]])
    assert set(placement(front).values()) == {"a"}
    dns.set_addresses(list(ADDRS.values()))
    wait_for("host b in the list", lambda: sorted(front.hosts()) == sorted(ADDRS.values()))
    after = placement(front)
    assert "b" in after.values() and "a" in after.values()


def test_a_failed_resolution_keeps_the_last_good_list(both, dns):
    for broken in (lambda: dns.set_addresses([]), dns.set_silent):   # NXDOMAIN, then no answer
        seen = broken()
        wait_for("two more queries", lambda seen=seen: dns.queries >= seen + 2)
        assert sorted(both.hosts()) == sorted(ADDRS.values())
        assert set(placement(both).values()) == set(ADDRS)
    assert "keeping the last good host list" in both.log()
    dns.set_addresses(list(ADDRS.values()))


def _answer(query: bytes, flags: int = 0x8180, records: bytes = b"", count: int = 1, qid_delta: int = 0) -> bytes:
    """An answer to `query`: its question, then `records` counted as `count` answers."""
    qid = struct.unpack(">H", query[:2])[0]
    end = query.index(b"\0", 12) + 5
    return struct.pack(">HHHHHH", (qid + qid_delta) & 0xFFFF, flags, 1, count, 0, 0) + query[12:end] + records


def _a(ip: str, rdlen: int = 4) -> bytes:
    return struct.pack(">HHHIH", 0xC00C, 1, 1, 5, rdlen) + socket.inet_aton(ip)


HOSTILE = {
    "another query's id": lambda q: _answer(q, records=_a("10.9.9.9"), qid_delta=1),
    "truncated (TC)": lambda q: _answer(q, flags=0x8380, records=_a("10.9.9.9")),
    "rdlength past the end": lambda q: _answer(q, records=_a("10.9.9.9", rdlen=400)),
    "more answers than sent": lambda q: _answer(q, records=_a("10.9.9.9"), count=9),
    "a reserved label type": lambda q: _answer(q, records=b"\x40abc" + _a("10.9.9.9")[2:]),
    "no records (NODATA)": lambda q: _answer(q, count=0),
    "a few bytes": lambda q: q[:2] + b"\x81",
    "a query, not an answer": lambda q: q,
    # past lua-resty-dns's own checks: an A record cut short at the packet's end (two of its
    # four address bytes), and a record that ends right after its name
    "an A record cut short": lambda q: _answer(q, records=_a("10.9.9.9")[:-2]),
    "a record cut short after its name": lambda q: _answer(q, records=b"\x09abcdefghi\x00\x00"),
}


def test_hostile_or_empty_dns_answers_keep_the_last_good_list(both, dns):
    """The answer is untrusted input: none of these changes the list or breaks the resolver."""
    try:
        for what, reply in HOSTILE.items():
            seen = dns.set_reply(reply)
            wait_for(f"two queries answered with {what}", lambda seen=seen: dns.queries >= seen + 2)
            assert sorted(both.hosts()) == sorted(ADDRS.values()), what
    finally:
        dns.set_addresses(list(ADDRS.values()))
    assert "runtime error" not in both.log()
    # and a good answer after them all is taken again
    dns.set_addresses([ADDRS["b"]])
    wait_for("the list after the hostile answers", lambda: both.hosts() == [ADDRS["b"]])
    assert set(placement(both).values()) == {"b"}


def test_a_few_hundred_hosts_come_over_tcp_when_the_udp_answer_is_truncated(both, dns):
    """300 A records do not fit a UDP answer: the server sets TC, lua-resty-dns asks again
    over TCP and the front takes the whole list (loopback addresses: nothing is sent to them)."""
    many = [f"127.1.{i // 250}.{i % 250 + 1}" for i in range(300)]
    try:
        tcp_before = dns.tcp_queries
        dns.set_addresses(many)
        wait_for("300 hosts in the front's list", lambda: len(both.hosts()) == 300)
        assert sorted(both.hosts()) == sorted(many) and dns.tcp_queries > tcp_before
    finally:
        dns.set_addresses(list(ADDRS.values()))
    wait_for("both hosts again", lambda: sorted(both.hosts()) == sorted(ADDRS.values()))
    assert "runtime error" not in both.log()


def test_a_host_whose_engine_is_down_is_passed_over_until_it_is_back(both, hosts):
    """Host a's nginx is up but its engine is not: a answers 503 (its /health fails, so
    Kubernetes would soon drop it from DNS), and the front sends those requests on to b.
    Once a's engine is back, a's conversations go to a again at once (a 503 marks no host down)."""
    before = placement(both)
    a = hosts["a"]
    a.stop_engine(crash=True)
    try:
        wait_for("host a's 503", lambda: httpx.get(a.url("/health"), timeout=5).status_code == 503)
        assert set(placement(both).values()) == {"b"}
    finally:
        a.start_engine()
        a.wait_healthy(timeout=60)
    assert placement(both) == before


def test_a_killed_host_moves_its_conversations_with_no_errors(both, hosts):
    """Last in this module: host b stays dead. Under load, b is killed (SIGKILL: its nginx
    and engine, as a node that dies); DNS still lists it (Kubernetes drops it only after its
    readiness probe fails). Every request still gets a 200, b's conversations go to a, a's
    stay where they were."""
    before = placement(both)
    statuses: list[int] = []
    stop = threading.Event()

    def load() -> None:
        with both.client() as c:
            i = 0
            while not stop.is_set():
                api = API_OF[i % 2]
                r = c.post(PATHS[api], json=body(api, first_turn(i % CONVERSATIONS)))
                statuses.append(r.status_code)
                i += 1

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        wait_for("load running", lambda: len(statuses) >= 20)
        b = hosts["b"]
        assert b.nginx is not None and b.nginx.pid is not None
        os.killpg(b.nginx.pid, signal.SIGKILL)   # master and workers: nothing listens on b any more
        b.stop_engine(crash=True)
        n = len(statuses)
        wait_for("load after the kill", lambda: len(statuses) >= n + 40)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert statuses and all(s == 200 for s in statuses), sorted(set(statuses))
    after = placement(both)
    assert set(after.values()) == {"a"}
    assert all(after[i] == "a" for i, h in before.items() if h == "a")
    assert re.search(r"host 127\.0\.0\.3 failed; skipped for 5 s", both.log())
