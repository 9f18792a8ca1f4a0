"""deploy/k8s/: every manifest against the Kubernetes JSON schemas (offline, strict), plus
the facts the Pod relies on: a valid config.yaml, the repository's mask patterns, and one
memory-backed /dev/shm in both containers large enough for two arenas."""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate as kv   # the test extra: an offline schema validator from PyPI
import pytest
import yaml

from zccp.config import parse_config

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OLDEST = "1.28.0"  # the oldest Kubernetes these manifests are meant for


def manifests() -> list[tuple[str, int, dict]]:
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":  # kustomize's file, not a Kubernetes object
            continue
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc is not None:
                out.append((path.name, i, doc))
    return out


def by_kind(kind: str, name: str) -> dict:
    return next(d for _, _, d in manifests() if d["kind"] == kind and d["metadata"]["name"] == name)


@pytest.mark.parametrize("version", [OLDEST, kv.latest_version()])
@pytest.mark.parametrize("name,index,doc", [pytest.param(*m, id=f"{m[0]}:{m[2]['kind']}/{m[2]['metadata']['name']}")
                                            for m in manifests()])
def test_manifest_is_valid(name: str, index: int, doc: dict, version: str) -> None:
    error = None
    try:
        kv.validate(doc, version, strict=True)  # strict: unknown fields (typos) are errors
    except kv.ValidationError as exc:
        error = f"{'.'.join(map(str, exc.path))}: {exc.message}"
    if error:  # outside the except: the report is this line, not the schema dump
        pytest.fail(f"{name} document {index} ({doc['kind']}) invalid for Kubernetes {version}: {error}")


def test_kustomization_lists_every_manifest() -> None:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(kust["resources"]) == files


def test_configmaps_hold_a_valid_config_and_the_repository_masks() -> None:
    cfg = parse_config(yaml.safe_load(by_kind("ConfigMap", "zccp-config")["data"]["config.yaml"]), "zccp-config")
    assert cfg.shared_memory.group == "zccp"
    masks = by_kind("ConfigMap", "zccp-masks")["data"]["mask_patterns.lua"]
    assert masks == (ROOT / "lua/zccp/mask_patterns.lua").read_text(), \
        "deploy/k8s/configmap.yaml: zccp-masks differs from lua/zccp/mask_patterns.lua; copy it over"


def _mebibytes(quantity: str) -> float:
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi)", quantity)
    assert m, f"unexpected quantity {quantity!r}"
    return int(m.group(1)) * {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}[m.group(2)]


def test_pod_shares_shm_and_socket_between_engine_and_nginx() -> None:
    pod = by_kind("Deployment", "zccp")["spec"]["template"]["spec"]
    cfg = parse_config(yaml.safe_load(by_kind("ConfigMap", "zccp-config")["data"]["config.yaml"]), "zccp-config")
    volumes = {v["name"]: v for v in pod["volumes"]}
    socket_dir = str(Path(cfg.server.socket_path).parent)
    for c in pod["containers"]:
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert mounts.get("/dev/shm") == "shm", c["name"]
        assert mounts.get(socket_dir) == "run", c["name"]
        assert c["securityContext"]["runAsUser"] != 0 and c["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["fsGroup"] == 10000
    shm = volumes["shm"]["emptyDir"]
    assert shm["medium"] == "Memory"
    arena_mib = (4 + cfg.shared_memory.segment_count * cfg.shared_memory.segment_size_kb) / 1024
    # A restarted engine creates its arena while nginx still maps the old one.
    assert _mebibytes(shm["sizeLimit"]) >= 2 * arena_mib


def test_front_routes_to_the_headless_service_of_the_zccp_pods() -> None:
    """deploy/k8s/front.yaml: its front.yaml is valid, names hosts-service.yaml's headless
    Service (fully qualified) on the Pods' port, and is mounted where the entrypoint reads it."""
    from zccp.ops.front_conf import parse_front

    front = parse_front(yaml.safe_load(by_kind("ConfigMap", "zccp-front-config")["data"]["front.yaml"]),
                        "zccp-front-config")
    hosts = by_kind("Service", "zccp-hosts")["spec"]
    pod = by_kind("Deployment", "zccp")["spec"]["template"]
    cfg = parse_config(yaml.safe_load(by_kind("ConfigMap", "zccp-config")["data"]["config.yaml"]), "zccp-config")
    assert hosts["clusterIP"] == "None"                       # headless: one A record per ready Pod
    assert hosts["selector"].items() <= pod["metadata"]["labels"].items()
    assert not hosts.get("publishNotReadyAddresses")          # an unready Pod leaves the answer
    assert front.hosts.startswith("zccp-hosts.") and front.hosts.endswith(".svc.cluster.local")
    assert front.port == hosts["ports"][0]["port"] == int(cfg.server.listen.rsplit(":", 1)[1])
    assert front.max_body_kb == cfg.limits.max_body_kb
    dep = by_kind("Deployment", "zccp-front")["spec"]["template"]["spec"]
    (c,) = dep["containers"]
    assert c["args"] == ["front"]
    env = {e["name"]: e["value"] for e in c["env"]}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in dep["volumes"]}
    (cm_volume,) = [n for n, v in volumes.items() if v.get("configMap", {}).get("name") == "zccp-front-config"]
    assert env["ZCCP_FRONT_CONFIG"] == f"{mounts[cm_volume]}/front.yaml"
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    # the hosts' mask patterns, where the image's lua/zccp/mask_patterns.lua points (the same keys)
    (host_nginx,) = [c for c in pod["spec"]["containers"] if c["name"] == "nginx"]
    host_mounts = {m["name"]: m["mountPath"] for m in host_nginx["volumeMounts"]}
    (masks,) = [n for n, v in volumes.items() if v.get("configMap", {}).get("name") == "zccp-masks"]
    assert mounts[masks] == host_mounts["masks"] == "/etc/zccp/masks"
    labels = by_kind("Deployment", "zccp-front")["spec"]["template"]["metadata"]["labels"]
    assert by_kind("Service", "zccp-front")["spec"]["selector"].items() <= labels.items()
