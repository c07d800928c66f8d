"""The Kubernetes manifests, offline: every overlay renders with ``kubectl kustomize``; core kinds pass
``kubernetes-validate`` in strict mode; the RayService (and its cluster as a RayCluster) validates against
KubeRay v1.7.0's CRD schemas with unknown fields rejected; the embedded ``serveConfigV2`` and
``deploy/serve.yaml`` validate against Ray's ``ServeDeploySchema`` and are the same config; each
overlay's gateway configuration parses."""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from gateway.config import parse_config
from tests.conftest import REPO, SHARED

CRDS = SHARED / "schemas" / "kuberay-v1.7.0"
OVERLAYS = ["cpu-sim", "gpu"]
KUBERNETES_VERSION = "1.32"


def crd_schema(file: str, version: str = "v1") -> dict:
    """The CRD's OpenAPI schema as JSON Schema, with every object that lists its properties closed to
    unknown fields (as the API server's strict field validation does), and int-or-string honoured."""
    crd = yaml.safe_load((CRDS / file).read_text())
    schema = next(v for v in crd["spec"]["versions"] if v["name"] == version)["schema"]["openAPIV3Schema"]

    def close(node):
        if isinstance(node, dict):
            if node.get("x-kubernetes-int-or-string"):
                node.pop("type", None)
                node.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
            if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
                node.setdefault("additionalProperties", False)
            for value in node.values():
                close(value)
        elif isinstance(node, list):
            for value in node:
                close(value)

    schema = copy.deepcopy(schema)
    close(schema)
    return schema


RAYSERVICE = crd_schema("ray.io_rayservices.yaml")
RAYCLUSTER = crd_schema("ray.io_rayclusters.yaml")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, list[dict]]:
    """Each overlay rendered, from a copy of k8s/ with secrets made by k8s/make-secrets.sh."""
    if shutil.which("kubectl") is None:
        pytest.fail("kubectl is needed to render the kustomize overlays (`kubectl kustomize`)")
    work = tmp_path_factory.mktemp("k8s") / "k8s"
    shutil.copytree(REPO / "k8s", work, ignore=shutil.ignore_patterns("secrets"))
    subprocess.run(["bash", str(work / "make-secrets.sh"), "alice", "bob", "carol"], check=True, capture_output=True)
    out = {}
    for overlay in OVERLAYS:
        result = subprocess.run(
            ["kubectl", "kustomize", str(work / "overlays" / overlay)], check=True, capture_output=True, text=True
        )
        out[overlay] = [d for d in yaml.safe_load_all(result.stdout) if d]
    out["_secrets"] = work / "base" / "secrets"  # type: ignore[assignment]
    return out


def one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_core_kinds_pass_strict_validation(rendered, overlay):
    docs = rendered[overlay]
    kinds = {d["kind"] for d in docs}
    assert {"Namespace", "Secret", "ConfigMap", "Service", "StatefulSet", "RayService"} <= kinds
    for doc in docs:
        if doc["apiVersion"].startswith("ray.io/"):
            continue
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        assert doc["metadata"].get("namespace") == "fairgate" or doc["kind"] == "Namespace"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rayservice_and_its_cluster_match_the_kuberay_crds(rendered, overlay):
    service = one(rendered[overlay], "RayService")
    jsonschema.validate(service, RAYSERVICE)
    cluster = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "fairgate"},
        "spec": service["spec"]["rayClusterConfig"],
    }
    jsonschema.validate(cluster, RAYCLUSTER)
    spec = service["spec"]["rayClusterConfig"]
    assert spec["enableInTreeAutoscaling"] is True
    group = spec["workerGroupSpecs"][0]
    assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]


def test_unknown_fields_and_wrong_types_are_rejected(rendered):
    service = one(rendered["cpu-sim"], "RayService")
    typo = copy.deepcopy(service)
    typo["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["maxReplica"] = 3
    with pytest.raises(jsonschema.ValidationError, match="maxReplica"):
        jsonschema.validate(typo, RAYSERVICE)
    container = copy.deepcopy(service)
    container["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]["imag"] = "x"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(container, RAYSERVICE)
    bad_service = copy.deepcopy(one(rendered["cpu-sim"], "Service", "fairgate"))
    bad_service["spec"]["port"] = 80
    with pytest.raises(Exception, match="port"):
        kubernetes_validate.validate(bad_service, KUBERNETES_VERSION, strict=True)


def test_gpu_overlay_asks_for_gpus_and_the_gpu_image(rendered):
    spec = one(rendered["gpu"], "RayService")["spec"]["rayClusterConfig"]
    worker = spec["workerGroupSpecs"][0]["template"]["spec"]
    assert worker["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert {t["key"] for t in worker["tolerations"]} == {"nvidia.com/gpu"}
    images = {spec["headGroupSpec"]["template"]["spec"]["containers"][0]["image"], worker["containers"][0]["image"]}
    assert images == {"fairgate:gpu"}
    sim = one(rendered["cpu-sim"], "RayService")["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    assert "nvidia.com/gpu" not in str(sim)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_serve_configs_validate_and_agree(rendered, overlay):
    embedded = yaml.safe_load(one(rendered[overlay], "RayService")["spec"]["serveConfigV2"])
    on_disk = yaml.safe_load((REPO / "deploy" / "serve.yaml").read_text())
    for config in (embedded, on_disk):
        ServeDeploySchema.model_validate(config)
    assert embedded == on_disk


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_secret_value_is_in_a_manifest_and_the_gateway_config_parses(rendered, overlay, monkeypatch):
    docs = rendered[overlay]
    secrets_dir: Path = rendered["_secrets"]  # type: ignore[assignment]
    secret_values = [(secrets_dir / f).read_text().strip() for f in ("admin-key", "cluster-secret")]
    for doc in docs:
        if doc["kind"] != "Secret":
            assert not any(v in yaml.safe_dump(doc) for v in secret_values)
    raw = yaml.safe_load(one(docs, "ConfigMap", "fairgate-gateway")["data"]["gateway.yaml"])
    raw["tenants_file"] = str(secrets_dir / "tenants.yaml")  # where the pod mounts the Secret
    monkeypatch.setenv("FAIRGATE_ADMIN_KEY", secret_values[0])
    config, generated = parse_config(raw, overlay)
    assert [t.name for t in config.tenants] == ["alice", "bob", "carol"] and not generated
    assert config.workers.autoscaling is not None
    assert config.workers.engine == ("vllm" if overlay == "gpu" else "simulated")


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.gpu"])
def test_images_copy_every_package_the_project_installs(dockerfile):
    import tomllib

    include = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {pattern.rstrip("*") for pattern in include}
    assert packages == {p.parent.name for p in REPO.glob("*/__init__.py")} - {"tests"}  # every package installs
    copied = {
        line.split()[-2] for line in (REPO / "deploy" / dockerfile).read_text().splitlines() if line.startswith("COPY")
    }
    assert packages <= copied, sorted(packages - copied)
