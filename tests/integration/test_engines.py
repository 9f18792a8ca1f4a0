"""Several engines under one nginx (config.yaml engines:, docs/engines.md): two models through
both official SDKs, the model list, an unknown model's 404; replicas of one model: a
conversation's turns on one replica, spill past the load bound, a dead replica skipped, and
a replica SIGKILLed under load with `zccp-stack up` supervising (0 non-2xx). Real nginx, real
engines (the null backend, each with its own reply), Redis where the cache is on."""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from tests.support.harness import Stack, StackProcess, sdk_clients

REPLY = {"a": "Reply from engine a.", "b": "Reply from engine b."}


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("two_models"), {
        "model": {"backend": "null"},
        "engines": [{"name": "a", "model": {"name": "model-a", "null_reply": REPLY["a"]}},
                    {"name": "b", "model": {"name": "model-b", "null_reply": REPLY["b"]}}],
    }, with_redis=True)
    try:
        yield s.start()
    finally:
        s.stop()


UPSTREAM_REPLY = "Reply from the upstream server."


@pytest.fixture(scope="module")
def with_upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Two local models and one upstream (another ZCCP stack, spoken to in Anthropic's API)
    behind one nginx: engines a and b, and engine up with model.backend upstream."""
    up = Stack(tmp_path_factory.mktemp("upstream_server"),
               {"model": {"backend": "null", "name": "served-upstream", "null_reply": UPSTREAM_REPLY}}).start()
    s = Stack(tmp_path_factory.mktemp("with_upstream"), {
        "model": {"backend": "null"},
        "engines": [{"name": "a", "model": {"name": "model-a", "null_reply": REPLY["a"]}},
                    {"name": "b", "model": {"name": "model-b", "null_reply": REPLY["b"]}},
                    {"name": "up", "model": {"name": "model-up", "backend": "upstream"},
                     "upstream": {"urls": [up.base_url + "/v1"], "api": "anthropic", "model": "served-upstream"}}],
    }, with_redis=True)
    try:
        yield s.start()
    finally:
        s.stop()
        up.stop()


def test_two_local_models_and_an_upstream_through_one_nginx(with_upstream: Stack) -> None:
    ant, oai = sdk_clients(with_upstream)
    expected = {"model-a": REPLY["a"], "model-b": REPLY["b"], "model-up": UPSTREAM_REPLY}
    for model, reply in expected.items():
        msg = ant.messages.create(model=model, max_tokens=32, messages=[{"role": "user", "content": "Hi " + model}])
        assert msg.model == model and msg.content[0].text == reply
        chat = oai.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi " + model}])
        assert chat.model == model and chat.choices[0].message.content == reply
        with ant.messages.stream(model=model, max_tokens=32,
                                 messages=[{"role": "user", "content": "Stream " + model}]) as stream:
            assert "".join(stream.text_stream) == reply
        chunks = oai.chat.completions.create(model=model, stream=True,
                                             messages=[{"role": "user", "content": "Stream " + model}])
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == reply
    assert {m.id for m in oai.models.list()} >= set(expected)


def replicas_config(**routing: object) -> dict:
    return {
        "model": {"backend": "null", "name": "zccp-null", "null_token_delay_ms": 2},
        "shared_memory": {"segment_count": 8},
        "engines": [{"name": "r1", "model": {"null_reply": "one"}}, {"name": "r2", "model": {"null_reply": "two"}}],
        **({"routing": routing} if routing else {}),
    }


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("replicas"), replicas_config())
    try:
        yield s.start()
    finally:
        s.stop()


def metric(stack: Stack, name: str, engine: str) -> float:
    with stack.admin_client() as c:
        text = c.get("/metrics").text
    m = re.search(rf'^{name}{{engine="{engine}"}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


# -- two models ---------------------------------------------------------------------------


def test_each_model_answers_through_both_sdks(two_models: Stack) -> None:
    ant, oai = sdk_clients(two_models)
    for model, engine in (("model-a", "a"), ("model-b", "b")):
        msg = ant.messages.create(model=model, max_tokens=32, messages=[{"role": "user", "content": "Hi there"}])
        assert msg.model == model and msg.content[0].text == REPLY[engine]
        chat = oai.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi there"}])
        assert chat.model == model and chat.choices[0].message.content == REPLY[engine]


def test_each_model_streams_through_both_sdks(two_models: Stack) -> None:
    ant, oai = sdk_clients(two_models)
    for model, engine in (("model-a", "a"), ("model-b", "b")):
        with ant.messages.stream(model=model, max_tokens=32,
                                 messages=[{"role": "user", "content": "Stream it"}]) as stream:
            assert "".join(stream.text_stream) == REPLY[engine]
        chunks = oai.chat.completions.create(model=model, stream=True,
                                             messages=[{"role": "user", "content": "Stream it"}])
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == REPLY[engine]


def test_the_cache_never_answers_one_model_with_another(two_models: Stack) -> None:
    body = {"max_tokens": 32, "messages": [{"role": "user", "content": "the very same prompt"}]}
    with two_models.client() as c:
        for _ in range(2):   # the second round: hits, each of its own model
            for model, engine in (("model-a", "a"), ("model-b", "b")):
                r = c.post("/v1/messages", json={**body, "model": model})
                assert r.status_code == 200 and r.json()["content"][0]["text"] == REPLY[engine]
        r = c.post("/v1/messages", json={**body, "model": "model-b"})
        assert r.headers.get("x-zccp-cache") == "HIT"


def test_model_list_names_every_model(two_models: Stack) -> None:
    ant, oai = sdk_clients(two_models)
    assert {m.id for m in ant.models.list()} == {"model-a", "model-b"}
    assert {m.id for m in oai.models.list()} == {"model-a", "model-b"}
    assert oai.models.retrieve("model-b").id == "model-b"
    assert ant.models.retrieve("model-a").id == "model-a"


def test_an_unknown_model_is_the_apis_own_404(two_models: Stack) -> None:
    ant, oai = sdk_clients(two_models)
    with pytest.raises(anthropic.NotFoundError) as ea:
        ant.messages.create(model="model-z", max_tokens=8, messages=[{"role": "user", "content": "Hi"}])
    assert ea.value.status_code == 404 and ea.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(openai.NotFoundError) as eo:
        oai.chat.completions.create(model="model-z", messages=[{"role": "user", "content": "Hi"}])
    assert eo.value.code == "model_not_found"


def test_health_and_metrics_per_engine(two_models: Stack) -> None:
    h = two_models.health()
    assert h["status"] == "ok" and set(h["engines"]) == {"a", "b"}
    assert h["engines"]["b"]["model"] == "model-b" and h["engines"]["b"]["status"] == "ok"
    before = metric(two_models, "zccp_nginx_engine_routed_total", "b")
    with two_models.client() as c:
        r = c.post("/v1/chat/completions", json={"model": "model-b", "messages": [{"role": "user", "content": "x"}],
                                                   "max_tokens": 8}, headers={"cache-control": "no-store, no-cache"})
    assert r.status_code == 200 and r.headers["x-zccp-engine"] == "b"
    assert metric(two_models, "zccp_nginx_engine_routed_total", "b") == before + 1
    assert metric(two_models, "zccp_engine_up", "a") == 1
    with two_models.admin_client() as c:
        text = c.get("/metrics").text
    # one valid exposition: each family's # TYPE once, its lines in one group
    types = re.findall(r"^# TYPE (\S+)", text, re.M)
    assert len(types) == len(set(types))
    family_of_line = []
    current = None
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            current = line.split()[2]
        elif line and not line.startswith("#"):
            family_of_line.append(current)
    groups = [f for i, f in enumerate(family_of_line) if i == 0 or family_of_line[i - 1] != f]
    assert len(groups) == len(set(groups))
    assert re.search(r'^zccp_engine_\w+\{engine="a"[,}]', text.replace("zccp_engine_up{", ""), re.M)
    assert re.search(r'^zccp_engine_\w+\{engine="b"[,}]', text.replace("zccp_engine_up{", ""), re.M)
    two_models.assert_no_leaks()


# -- replicas of one model ------------------------------------------------------------------


def turn(c: httpx.Client, conversation: int, n: int) -> httpx.Response:
    msgs = [{"role": "user", "content": f"conversation {conversation}: where do tides come from?"}]
    for t in range(1, n):
        msgs += [{"role": "assistant", "content": f"answer {t}"}, {"role": "user", "content": f"and then {t}?"}]
    return c.post("/v1/messages", json={"model": "zccp-null", "max_tokens": 16, "messages": msgs})


def test_a_conversations_turns_stay_on_one_replica(replicas: Stack) -> None:
    used: Counter[str] = Counter()
    with replicas.client() as c:
        for conv in range(12):
            engines = set()
            for n in (1, 2, 3):
                r = turn(c, conv, n)
                assert r.status_code == 200
                engines.add(r.headers["x-zccp-engine"])
                assert r.json()["content"][0]["text"] == {"r1": "one", "r2": "two"}[r.headers["x-zccp-engine"]]
            assert len(engines) == 1, (conv, engines)
            used.update(engines)
    assert set(used) == {"r1", "r2"}          # conversations spread over both
    replicas.assert_no_leaks()


def test_a_dead_replica_is_skipped_at_once(replicas: Stack) -> None:
    with replicas.client() as c:
        home = {conv: turn(c, conv, 1).headers["x-zccp-engine"] for conv in range(12)}
        moved = [conv for conv, e in home.items() if e == "r1"]
        failed_over = metric(replicas, "zccp_nginx_engine_failed_over_total", "r2")
        replicas.engines["r1"].kill()
        try:
            for conv in home:
                r = turn(c, conv, 2)
                assert r.status_code == 200, r.text
                assert r.headers["x-zccp-engine"] == "r2"
            assert metric(replicas, "zccp_nginx_engine_failed_over_total", "r2") >= failed_over + len(moved)
            assert replicas.health()["status"] == "degraded"
        finally:
            replicas.start_named("r1")
        replicas.wait_healthy()
        deadline = time.monotonic() + 10   # within the down mark (1 s) r1 gets its conversations back
        while turn(c, moved[0], 3).headers["x-zccp-engine"] != "r1":
            assert time.monotonic() < deadline
            time.sleep(0.2)
    replicas.assert_no_leaks()


def test_a_busy_replica_spills_to_the_least_loaded(tmp_path_factory: pytest.TempPathFactory) -> None:
    cfg = replicas_config(spill_load=0.25)
    cfg["model"]["null_token_delay_ms"] = 150      # each answer holds its slot for a while
    cfg["shared_memory"]["segment_count"] = 4       # one claimed slot: past the bound
    s = Stack(tmp_path_factory.mktemp("spill"), cfg).start()
    try:
        got: list[str] = []

        def one() -> None:
            with s.client() as c:
                r = turn(c, 7, 1)   # one conversation: one preferred replica
                assert r.status_code == 200
                got.append(r.headers["x-zccp-engine"])

        threads = [threading.Thread(target=one) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(got) == 4 and set(got) == {"r1", "r2"}
        assert metric(s, "zccp_nginx_engine_spilled_total", "r1") + metric(s, "zccp_nginx_engine_spilled_total",
                                                                            "r2") >= 1
        s.assert_no_leaks()
    finally:
        s.stop()


def test_round_robin_alternates_replicas(tmp_path_factory: pytest.TempPathFactory) -> None:
    """routing.policy round_robin (bench/routing.py's baseline): one conversation's turns on
    one connection (one worker) go to both replicas in turn."""
    s = Stack(tmp_path_factory.mktemp("rr"), replicas_config(policy="round_robin")).start()
    try:
        with s.client() as c:
            got = [turn(c, 3, n).headers["x-zccp-engine"] for n in (1, 2, 3, 4)]
        assert got[0] != got[1] and got[0] == got[2] and got[1] == got[3], got
    finally:
        s.stop()


def test_replica_sigkill_under_load_no_non_2xx(tmp_path_factory: pytest.TempPathFactory) -> None:
    """`zccp-stack up` with two replicas; one SIGKILLed while 4 clients send without pause:
    every answer a 2xx (nginx moves its requests, in flight or new, to the other), and the
    supervisor brings it back."""
    cfg = replicas_config()
    cfg["model"]["null_token_delay_ms"] = 5
    stack = Stack(tmp_path_factory.mktemp("kill"), cfg)
    proc = StackProcess(stack).start()
    try:
        victim = stack.health()["engines"]["r1"]["engine_pid"]
        statuses: Counter[int] = Counter()
        engines_seen: Counter[str] = Counter()
        stop = threading.Event()

        def client(k: int) -> None:
            with stack.client() as c:
                conv = k * 1000
                while not stop.is_set():
                    conv += 1
                    r = turn(c, conv, 1 + conv % 3)
                    statuses[r.status_code] += 1
                    engines_seen[r.headers.get("x-zccp-engine", "-")] += 1

        threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        time.sleep(1.5)
        import os
        import signal

        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while True:   # until the supervisor has it serving again, the load going on
            eng = stack.health().get("engines", {}).get("r1", {})
            if eng.get("status") == "ok" and eng.get("engine_pid") != victim:
                break
            assert time.monotonic() < deadline, proc.text()
            time.sleep(0.2)
        time.sleep(1.5)
        stop.set()
        for t in threads:
            t.join()
        assert sum(statuses.values()) > 50
        assert set(statuses) == {200}, statuses
        assert engines_seen["r1"] > 0 and engines_seen["r2"] > 0
        assert metric(stack, "zccp_nginx_engine_failed_over_total", "r2") > 0   # r1's requests moved to r2
        assert "engine r1 exited (killed by SIGKILL)" in proc.text()
    finally:
        proc.stop()
