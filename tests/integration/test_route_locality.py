"""Locality in routing (docs/engines.md, "Placement"), zccp.plugins.router.route run by real nginx (the
test-only /_route/order of tests/support/nginx/route_test.conf): where a model's replicas sit
on two NUMA nodes, a worker on node 1 tries node 1's replicas first, in their rendezvous order,
and spills to node 0 when they are loaded or down; on one node, with placement none or with
the workers not placed, the order is exactly the rendezvous rank."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.fp_nginx import snippet_nginx

SNIPPET = Path(__file__).resolve().parents[1] / "support" / "nginx" / "route_test.conf"
NAMES = ["n0-a", "n0-b", "n1-a", "n1-b"]
NODE = {"n0-a": 0, "n0-b": 0, "n1-a": 1, "n1-b": 1}
KEYS = [f"conversation-{i}" for i in range(200)]


@pytest.fixture(scope="module")
def ngx(tmp_path_factory):
    srv = snippet_nginx(tmp_path_factory.mktemp("locality"), SNIPPET)
    yield srv
    srv.stop()


def orders(ngx, nodes, worker_nodes=None, loads=None, down=None, spill_load=0.75):
    q = {"engines": [{"name": n, **({"node": nodes[n]} if nodes.get(n) is not None else {})} for n in NAMES],
         "keys": KEYS, "spill_load": spill_load}
    if worker_nodes is not None:
        q["worker_nodes"] = worker_nodes
    if loads:
        q["loads"] = loads
    if down:
        q["down"] = down
    return json.loads(ngx.post("/_route/order", json.dumps(q).encode()))["orders"]


def ranks(ngx):
    q = {"names": NAMES, "keys": KEYS}
    return json.loads(ngx.post("/_route/rank", json.dumps(q).encode()))["ranks"]


def test_a_worker_on_node_1_tries_node_1_first_in_rendezvous_order(ngx):
    got, plain = orders(ngx, NODE, worker_nodes=[1]), ranks(ngx)
    for order, rank in zip(got, plain, strict=True):
        assert order == [n for n in rank if NODE[n] == 1] + [n for n in rank if NODE[n] == 0]
    # both node-1 replicas still share the keys: rendezvous decides among them
    firsts = {o[0] for o in got}
    assert firsts == {"n1-a", "n1-b"}


def test_worker_on_node_0_prefers_node_0(ngx):
    for order in orders(ngx, NODE, worker_nodes=[0]):
        assert [NODE[n] for n in order] == [0, 0, 1, 1]


def test_spills_to_node_0_when_node_1_is_loaded(ngx):
    loads = {"n1-a": 1.0, "n1-b": 1.0}
    plain = ranks(ngx)
    for order, rank in zip(orders(ngx, NODE, worker_nodes=[1], loads=loads), plain, strict=True):
        # the least loaded goes first: node 0's replica ranked first by rendezvous
        assert order[0] == next(n for n in rank if NODE[n] == 0)
    # below routing.spill_load the local replica keeps the request
    for order in orders(ngx, NODE, worker_nodes=[1], loads={"n1-a": 0.5, "n1-b": 0.5}):
        assert NODE[order[0]] == 1


def test_down_local_replicas_go_last(ngx):
    plain = ranks(ngx)
    for order, rank in zip(orders(ngx, NODE, worker_nodes=[1], down=["n1-a", "n1-b"]), plain, strict=True):
        assert order == [n for n in rank if NODE[n] == 0] + [n for n in rank if NODE[n] == 1]


@pytest.mark.parametrize("nodes,worker_nodes", [
    ({n: 0 for n in NAMES}, [0]),        # every engine on one node
    ({}, [1]),                           # placement none: no engine has a node
    (NODE, None),                        # the workers are not placed (an existing nginx)
])
def test_order_unchanged_without_two_nodes(ngx, nodes, worker_nodes):
    assert orders(ngx, nodes, worker_nodes=worker_nodes) == ranks(ngx)
