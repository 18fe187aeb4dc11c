"""deploy/kubernetes, offline: the manifests against the Kubernetes schemas (where the
`kubernetes-validate` package is installed), the configs they carry against our own
config loader, every command line against our own CLI, and the ports against each other.
deploy/kubernetes-gpu, the GPU overlay, rendered here (its JSON patches applied to the
base; against `kubectl kustomize` where kubectl is installed): each replica pod asks for
its own GPUs, as many as one replica spans."""

from __future__ import annotations

import argparse
import copy
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from common.cli import add_config_args, config_from_args
from common.config import Config

K8S = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
GPU_OVERLAY = K8S.parent / "kubernetes-gpu"
MODULES = {"frontend", "tokenizer_worker", "detok_worker", "scheduler_worker"}
SAMPLE_ENV = {"REPLICA_ID": "1", "POD_IP": "10.1.2.3"}  # what the downward API fills in


def documents() -> list[dict]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    docs = []
    for name in kustomization["resources"]:
        docs += [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]
    return docs


def by_kind(kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in documents() if d["kind"] == kind}


def configs() -> dict[str, Config]:
    data = by_kind("ConfigMap")["zeroserve-config"]["data"]
    return {name: Config.from_dict(json.loads(text)) for name, text in data.items()}


def containers(docs: list[dict] | None = None) -> list[dict]:
    out = []
    for d in documents() if docs is None else docs:
        if d["kind"] in ("Deployment", "StatefulSet"):
            out += d["spec"]["template"]["spec"]["containers"]
    return out


def gpu_documents() -> list[dict]:
    """The base with the overlay's patches applied (JSON 6902 `add`, the only op it uses)."""
    overlay = yaml.safe_load((GPU_OVERLAY / "kustomization.yaml").read_text())
    assert overlay["resources"] == ["../kubernetes"]
    docs = copy.deepcopy(documents())
    for patch in overlay["patches"]:
        target = patch["target"]
        (doc,) = [
            d
            for d in docs
            if (d["kind"], d["metadata"]["name"]) == (target["kind"], target["name"])
        ]
        for op in yaml.safe_load(patch["patch"]):
            assert op["op"] == "add", op
            *parents, last = [
                p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]
            ]
            node = doc
            for part in parents:
                node = node[int(part)] if isinstance(node, list) else node[part]
            if last == "-":
                node.append(op["value"])
            else:
                node[last] = op["value"]
    return docs


def port_of(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def test_every_manifest_is_valid_for_kubernetes():
    kv = pytest.importorskip(
        "kubernetes_validate", reason="pip install kubernetes-validate to check the schemas"
    )
    for doc in documents():
        kv.validate(doc, "1.30", strict=True)


def test_the_manifests_are_whole():
    kinds = sorted(d["kind"] for d in documents())
    assert kinds == [
        "ConfigMap",
        "Deployment",
        "HorizontalPodAutoscaler",
        "Service",
        "Service",
        "Service",
        "StatefulSet",
    ]
    hpa = by_kind("HorizontalPodAutoscaler")["zeroserve-replica"]["spec"]["scaleTargetRef"]
    assert (hpa["kind"], hpa["name"]) == ("StatefulSet", "zeroserve-replica")
    for c in containers():  # the signing secret from the Secret, never from the ConfigMap
        refs = [e["valueFrom"].get("secretKeyRef", {}).get("name") for e in c["env"]]
        assert "zeroserve-secret" in refs, c["name"]
    for cfg in configs().values():
        assert cfg.ipc.secret is None or cfg.ipc.secret == "", "secret in the ConfigMap"


def test_every_command_line_is_accepted_by_the_real_cli():
    cfgs = configs()
    seen = set()
    for c in containers():
        argv = [*c["command"], *c.get("args", [])]
        argv = [re.sub(r"\$\((\w+)\)", lambda m: SAMPLE_ENV[m.group(1)], a) for a in argv]
        assert argv[:2] == ["python", "-m"] and argv[2] in MODULES, argv
        seen.add(argv[2])
        parser = argparse.ArgumentParser(exit_on_error=False)
        add_config_args(parser)
        args = parser.parse_args(argv[3:])  # an unknown flag raises here
        config_file = Path(args.config)
        assert config_file.parent == Path("/etc/zeroserve")
        args.config = None  # the file is the ConfigMap's: load it from there
        base = cfgs[config_file.name]
        flags = config_from_args(args)  # the flags' values pass the config's checks
        if argv[2] == "scheduler_worker":
            assert flags.replica_id == 1 and flags.ipc.replica_inbox == "tcp://0.0.0.0:5710"
            assert flags.ipc.replica_advertise == "tcp://10.1.2.3:5710"
        assert base.ipc.resolved_run_dir is None  # tcp only: no ipc path on a pod
    assert seen == MODULES


def test_ports_agree():
    cfgs = configs()
    hub, replica = cfgs["hub.json"], cfgs["replica.json"]
    services = by_kind("Service")
    http = services["zeroserve"]["spec"]["ports"]
    assert [p["targetPort"] for p in http] == [hub.server.port]
    hub_ports = {p["port"] for p in services["zeroserve-hub"]["spec"]["ports"]}
    assert all(p["port"] == p["targetPort"] for p in services["zeroserve-hub"]["spec"]["ports"])
    for name in ("tokenizer", "frontend", "detok"):
        dial = replica.ipc.endpoint(name)
        assert dial.startswith("tcp://zeroserve-hub:"), dial
        assert port_of(dial) == port_of(hub.ipc.endpoint(name)) and port_of(dial) in hub_ports
    frontend = by_kind("Deployment")["zeroserve-frontend"]["spec"]["template"]["spec"]
    declared = {p["containerPort"] for c in frontend["containers"] for p in c.get("ports", [])}
    assert hub_ports | {hub.server.port} <= declared
    probes = [
        c[k] for c in frontend["containers"] for k in ("readinessProbe", "livenessProbe") if k in c
    ]
    assert len(probes) == 2
    assert all(p["httpGet"] == {"path": "/health", "port": hub.server.port} for p in probes)
    (sched,) = by_kind("StatefulSet")["zeroserve-replica"]["spec"]["template"]["spec"]["containers"]
    inbox = sched["args"][sched["args"].index("--replica-inbox") + 1]
    (svc_port,) = services["zeroserve-replica"]["spec"]["ports"]
    assert port_of(inbox) == svc_port["port"] == sched["ports"][0]["containerPort"]
    assert by_kind("StatefulSet")["zeroserve-replica"]["spec"]["serviceName"] == (
        "zeroserve-replica"
    )


def test_gpu_replicas_ask_for_their_own_gpus():
    """Each replica pod of the overlay asks for T GPUs (requests and limits, as the device
    plugin wants them equal; T = the GPUs one replica spans, from its config) and serves
    with --device cuda, as the real CLI reads its command line; the hub asks for none."""
    docs = gpu_documents()
    replica_cfg = configs()["replica.json"]
    (replica,) = [d for d in docs if d["kind"] == "StatefulSet"]
    spec = replica["spec"]["template"]["spec"]
    (sched,) = spec["containers"]
    per_replica = str(replica_cfg.gpus_per_replica)
    assert sched["resources"]["limits"]["nvidia.com/gpu"] == per_replica
    assert sched["resources"]["requests"]["nvidia.com/gpu"] == per_replica
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_config_args(parser)
    argv = [re.sub(r"\$\((\w+)\)", lambda m: SAMPLE_ENV[m.group(1)], a) for a in sched["args"]]
    args = parser.parse_args(argv)
    args.config = None
    assert config_from_args(args).engine.model.device == "cuda"
    hub = [c for c in containers(docs) if c is not sched]
    assert hub and all("nvidia.com/gpu" not in str(c.get("resources")) for c in hub)
    assert "nvidia.com/gpu" not in str(containers())  # the base: CPU replicas


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl renders the overlay")
def test_the_gpu_overlay_renders_with_kustomize_as_here():
    run = subprocess.run(
        ["kubectl", "kustomize", str(GPU_OVERLAY)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    rendered = [d for d in yaml.safe_load_all(run.stdout) if d]
    ours = {(d["kind"], d["metadata"]["name"]): d for d in gpu_documents()}
    for doc in rendered:  # kustomize adds the base's labels and image tag: compare the rest
        mine = ours.pop((doc["kind"], doc["metadata"]["name"]))
        if doc["kind"] == "StatefulSet":
            got, want = doc["spec"]["template"]["spec"], mine["spec"]["template"]["spec"]
            for key in ("args", "resources"):
                assert got["containers"][0][key] == want["containers"][0][key]
            assert got["tolerations"] == want["tolerations"]
    assert not ours


def test_every_gpu_manifest_is_valid_for_kubernetes():
    kv = pytest.importorskip(
        "kubernetes_validate", reason="pip install kubernetes-validate to check the schemas"
    )
    for doc in gpu_documents():
        kv.validate(doc, "1.30", strict=True)
