"""deploy/kubernetes-multihost, offline: replicas that span hosts as LeaderWorkerSet groups
(issue 57). The overlay rendered here (its deletes and its HPA patch applied to the base;
against `kubectl kustomize` where kubectl is installed); each group is one replica of
--tensor-parallel-size pods, one GPU each; every pod's command line through the real CLI;
and the variables a pod gets (the controller's and the manifest's) put through the real
rendezvous, which must give each pod its rank, rank 0's address and the port the leader
declares."""

from __future__ import annotations

import argparse
import copy
import re
import shutil
import subprocess

import pytest
import yaml

from common.cli import add_config_args, config_from_args
from common.config import Config
from scheduler_worker.backends.device import device_kind
from scheduler_worker.parallel.group import Rendezvous
from scheduler_worker.parallel.ranks import rendezvous
from tests.deploy.test_kubernetes import K8S, configs, documents

OVERLAY = K8S.parent / "kubernetes-multihost"
GROUP_INDEX = "metadata.labels['leaderworkerset.sigs.k8s.io/group-index']"
LEADER = "zeroserve-replica-1.zeroserve-replica.default.svc.cluster.local"


def overlay_documents() -> list[dict]:
    """The base less what the overlay deletes, its HPA retargeted, plus its own documents."""
    kustomization = yaml.safe_load((OVERLAY / "kustomization.yaml").read_text())
    assert kustomization["resources"][0] == "../kubernetes"
    docs = copy.deepcopy(documents())
    for patch in kustomization["patches"]:
        target, body = patch["target"], yaml.safe_load(patch["patch"])
        key = (target["kind"], target["name"])
        if isinstance(body, dict):  # a strategic-merge delete, the only one it uses
            assert body["$patch"] == "delete" and (body["kind"], body["metadata"]["name"]) == key
            docs = [d for d in docs if (d["kind"], d["metadata"]["name"]) != key]
            continue
        (doc,) = [d for d in docs if (d["kind"], d["metadata"]["name"]) == key]
        for op in body:  # JSON 6902: the HPA's target replaced
            assert op["op"] == "replace" and op["path"] == "/spec/scaleTargetRef", op
            doc["spec"]["scaleTargetRef"] = op["value"]
    for name in kustomization["resources"][1:]:
        docs += [d for d in yaml.safe_load_all((OVERLAY / name).read_text()) if d]
    return docs


def the_set() -> dict:
    (lws,) = [d for d in overlay_documents() if d["kind"] == "LeaderWorkerSet"]
    return lws


def templates() -> dict[str, dict]:
    t = the_set()["spec"]["leaderWorkerTemplate"]
    return {"leader": t["leaderTemplate"], "worker": t["workerTemplate"]}


def pod_config(container: dict, replica_id: str = "1") -> Config:
    """The container's command line through the real CLI, over the ConfigMap's file."""
    assert container["command"] == ["python", "-m", "scheduler_worker"]
    env = {"REPLICA_ID": replica_id, "POD_IP": "10.1.2.3"}  # the downward API's
    argv = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container["args"]]
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_config_args(parser)
    args = parser.parse_args(argv)
    name = args.config.rsplit("/", 1)[1]
    args.config = None
    flags = config_from_args(args)
    base = configs()[name].to_dict()
    model = base["engine"]["model"]
    model |= {"tensor_parallel_size": flags.engine.model.tensor_parallel_size}
    model |= {"device": flags.engine.model.device}
    return Config.from_dict(base)


def test_the_groups_replace_the_one_pod_replicas():
    kinds = sorted(d["kind"] for d in overlay_documents())
    assert kinds == [
        "ConfigMap",
        "Deployment",
        "HorizontalPodAutoscaler",
        "LeaderWorkerSet",
        "Service",
        "Service",
    ]
    (hpa,) = [d for d in overlay_documents() if d["kind"] == "HorizontalPodAutoscaler"]
    target = hpa["spec"]["scaleTargetRef"]
    assert target == {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "name": "zeroserve-replica",
    }
    lws = the_set()
    hub = configs()["hub.json"]
    # group K's leader is pod <name>-K under the set's headless service <name>: replica 0's
    # is the address the hub's config dials
    name = lws["metadata"]["name"]
    assert hub.ipc.endpoint("scheduler").startswith(f"tcp://{name}-0.{name}:")
    assert lws["spec"]["replicas"] == hub.data_parallel_size
    # a rank that fails takes its whole group down, and the group starts again
    assert lws["spec"]["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"


@pytest.mark.parametrize("role", ["leader", "worker"])
def test_each_pod_is_one_rank_on_one_gpu_of_a_replica_of_size_ranks(role):
    lws = the_set()
    size = lws["spec"]["leaderWorkerTemplate"]["size"]
    spec = templates()[role]["spec"]
    (c,) = spec["containers"]
    cfg = pod_config(c)
    assert cfg.engine.model.tensor_parallel_size == size
    assert device_kind(cfg.engine.model.device) == "cuda"
    assert c["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    env = {e["name"]: e for e in c["env"]}
    assert env["REPLICA_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == GROUP_INDEX
    assert env["ZEROSERVE_SECRET"]["valueFrom"]["secretKeyRef"]["name"] == "zeroserve-secret"
    assert cfg.ipc.secret is None or cfg.ipc.secret == ""
    (volume,) = spec["volumes"]
    assert volume["configMap"]["name"] == "zeroserve-config"
    # only the leader (rank 0) binds the inbox and talks to the hub
    assert ("--replica-inbox" in c["args"]) == (role == "leader")


@pytest.mark.parametrize("index", [0, 1])
def test_a_pods_variables_give_it_its_place_through_the_real_rendezvous(monkeypatch, index):
    """What the controller sets (LWS_*) and what the manifest sets (MASTER_PORT), and no
    torchrun variable: the rendezvous gives rank `index` of `size`, at the leader's address
    and the port the leader's pod declares, its store on rank 0's process (tcp://)."""
    lws = the_set()
    size = lws["spec"]["leaderWorkerTemplate"]["size"]
    role = "leader" if index == 0 else "worker"
    (c,) = templates()[role]["spec"]["containers"]
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    controller = {"LWS_GROUP_SIZE": str(size), "LWS_WORKER_INDEX": str(index)}
    controller["LWS_LEADER_ADDRESS"] = LEADER
    for name, value in controller.items():
        monkeypatch.setenv(name, value)
    for e in c["env"]:
        if "value" in e:
            monkeypatch.setenv(e["name"], e["value"])
    (leader,) = templates()["leader"]["spec"]["containers"]
    port = {p["name"]: p["containerPort"] for p in leader["ports"]}["rendezvous"]
    assert rendezvous(pod_config(c)) == Rendezvous(LEADER, port, index, size, 0, False)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl renders the overlay")
def test_the_overlay_renders_with_kustomize_as_here():
    run = subprocess.run(
        ["kubectl", "kustomize", str(OVERLAY)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    rendered = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(run.stdout) if d}
    ours = {(d["kind"], d["metadata"]["name"]): d for d in overlay_documents()}
    assert rendered.keys() == ours.keys()
    got, want = rendered[("LeaderWorkerSet", "zeroserve-replica")], the_set()
    assert got["spec"] == want["spec"] | {
        "leaderWorkerTemplate": got["spec"]["leaderWorkerTemplate"]
    }
    for role in ("leaderTemplate", "workerTemplate"):
        (g,) = got["spec"]["leaderWorkerTemplate"][role]["spec"]["containers"]
        (w,) = want["spec"]["leaderWorkerTemplate"][role]["spec"]["containers"]
        assert g["image"] == "zeroserve:latest"  # the base's tag reaches the set's pods
        assert {k: v for k, v in g.items() if k != "image"} == {
            k: v for k, v in w.items() if k != "image"
        }
    hpa = ("HorizontalPodAutoscaler", "zeroserve-replica")
    assert rendered[hpa]["spec"]["scaleTargetRef"] == ours[hpa]["spec"]["scaleTargetRef"]


def test_the_core_manifests_are_valid_for_kubernetes():
    kv = pytest.importorskip(
        "kubernetes_validate", reason="pip install kubernetes-validate to check the schemas"
    )
    for doc in overlay_documents():
        if doc["kind"] != "LeaderWorkerSet":  # a custom resource: no schema there
            kv.validate(doc, "1.30", strict=True)
    for role, template in templates().items():  # but its pods' are core PodTemplateSpecs
        pod = {"apiVersion": "v1", "kind": "PodTemplate", "template": template}
        kv.validate(pod | {"metadata": {"name": f"zeroserve-{role}"}}, "1.30", strict=True)
