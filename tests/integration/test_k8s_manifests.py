"""The Kubernetes manifests, offline: every overlay renders with ``kubectl kustomize``; core kinds pass
``kubernetes-validate`` in strict mode; the RayService (and its cluster as a RayCluster) validates against
KubeRay v1.7.0's CRD schemas with unknown fields rejected; the embedded ``serveConfigV2`` and
``deploy/serve.yaml`` validate against Ray's ``ServeDeploySchema`` and are the same config; each
overlay's gateway configuration parses."""

from __future__ import annotations

import copy
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from fairgate.gateway.config import parse_config
from tests.conftest import REPO

CRDS = REPO / "k8s" / "schemas" / "kuberay-v1.7.0"
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


def named(doc: dict, name: str) -> bool:
    """Whether ``doc`` is ``name``, or a generated ``name`` with its content's hash appended."""
    return re.fullmatch(re.escape(name) + r"(-[a-z0-9]{10})?", doc["metadata"]["name"]) is not None


def one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [d for d in docs if d["kind"] == kind and (name is None or named(d, name))]
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
    secret_values = [(secrets_dir / f).read_text().strip() for f in ("admin-key", "cluster-secret", "key-hash-secret")]
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
    if overlay == "gpu":  # two models behind one endpoint, one of them for some tenants only
        assert [m.name for m in config.models] == ["Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct"]
        assert config.models[1].tenants == ("alice", "bob") and config.models[0].tenants is None
        assert all(m.workers.engine == "vllm" and m.workers.num_gpus == 1 for m in config.models)


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.gpu"])
def test_images_copy_every_folder_the_project_installs(dockerfile):
    import tomllib

    folders = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values())
    assert folders == {p.parent.name for p in REPO.glob("*/__init__.py")} - {"tests"}  # every package installs
    copied = {
        line.split()[-2] for line in (REPO / "deploy" / dockerfile).read_text().splitlines() if line.startswith("COPY")
    }
    assert folders <= copied, sorted(folders - copied)


# ----------------------------------------------------------------------------- closed by default


def pod_templates(docs: list[dict]) -> dict[str, dict]:
    """Every pod template of an overlay, by the pod's name label (head, workers, Redis)."""
    cluster = one(docs, "RayService")["spec"]["rayClusterConfig"]
    templates = [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]
    templates.append(one(docs, "StatefulSet", "fairgate-redis")["spec"]["template"])
    return {t["metadata"]["labels"]["app.kubernetes.io/name"]: t for t in templates}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_key_hashing_secret_is_read_from_a_file_on_the_head_and_reaches_no_worker(rendered, overlay):
    """Read by the head's processes from a mounted Secret, never passed through Ray (whose GCS keeps
    actors' arguments, in Redis under fault tolerance): a copy of Redis cannot test guessed keys."""
    docs = rendered[overlay]
    secret = one(docs, "Secret", "fairgate-secrets")
    assert "key-hash-secret" in secret["data"]
    templates = pod_templates(docs)
    head = templates["fairgate-head"]["spec"]
    env = {e["name"]: e.get("value") for c in head["containers"] for e in c.get("env", [])}
    path = env["FAIRGATE_KEY_HASH_SECRET_FILE"]
    mounts = {m["mountPath"]: m["name"] for c in head["containers"] for m in c.get("volumeMounts", [])}
    volume = mounts[str(Path(path).parent)]
    secret_of = {v["name"]: v.get("secret", {}).get("secretName") for v in head["volumes"]}
    assert secret_of[volume] == secret["metadata"]["name"]
    for name, template in templates.items():
        if name != "fairgate-head":
            assert "key-hash-secret" not in str(template) and "KEY_HASH" not in str(template), name


def test_ray_token_authentication_is_on(rendered):
    for overlay in OVERLAYS:
        cluster = one(rendered[overlay], "RayService")["spec"]["rayClusterConfig"]
        assert cluster["authOptions"] == {"mode": "token"}, overlay


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_runs_as_non_root_without_privileges(rendered, overlay):
    templates = pod_templates(rendered[overlay])
    assert set(templates) == {"fairgate-head", "fairgate-worker", "fairgate-redis"}
    for name, template in templates.items():
        pod = template["spec"]
        security = pod["securityContext"]
        assert security["runAsNonRoot"] is True and security["runAsUser"] > 0, name
        assert security["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert pod["automountServiceAccountToken"] is False, name
        for container in pod["containers"]:
            c = container["securityContext"]
            assert c["allowPrivilegeEscalation"] is False and c["capabilities"]["drop"] == ["ALL"], name
            assert c["runAsNonRoot"] is True, name
    assert templates["fairgate-redis"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_mounted_secrets_are_readable_by_the_containers_user_and_no_one_else(rendered, overlay):
    for name, template in pod_templates(rendered[overlay]).items():
        pod = template["spec"]
        security = pod["securityContext"]
        for volume in pod.get("volumes", []):
            if "secret" not in volume:
                continue
            mode = volume["secret"]["defaultMode"]
            # files are root-owned with the pod's fsGroup as group: readable when the group may read
            assert mode & 0o040 and not mode & 0o007, (name, volume["name"], oct(mode))
            assert security["fsGroup"] == security["runAsGroup"], name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_worker_pods_hold_no_tenant_key_admin_key_or_redis_password(rendered, overlay):
    worker = pod_templates(rendered[overlay])["fairgate-worker"]["spec"]
    assert not [v for v in worker.get("volumes", []) if "secret" in v]
    text = yaml.safe_dump(worker)
    for needle in ("fairgate-tenants", "fairgate-secrets", "fairgate-redis", "ADMIN", "REDIS", "secretKeyRef"):
        assert needle not in text, needle
    head = pod_templates(rendered[overlay])["fairgate-head"]["spec"]
    env = {e["name"]: e for e in head["containers"][0]["env"]}
    assert env["FAIRGATE_DISPATCHER_RESOURCE"]["value"] == "fairgate-dispatcher"  # the dispatcher runs here
    assert env["FAIRGATE_INGRESS_RESOURCE"]["value"] == "fairgate-dispatcher"  # and the ingress (key hashes)
    cluster = one(rendered[overlay], "RayService")["spec"]["rayClusterConfig"]
    assert "fairgate-dispatcher" in cluster["headGroupSpec"]["rayStartParams"]["resources"]
    assert "fairgate-dispatcher" not in str(cluster["workerGroupSpecs"][0]["rayStartParams"])


def test_redis_asks_for_the_password_of_its_secret_and_the_head_has_it(rendered):
    docs = rendered["cpu-sim"]
    redis = one(docs, "StatefulSet", "fairgate-redis")["spec"]["template"]["spec"]["containers"][0]
    assert "--requirepass" in " ".join(redis["command"])
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in redis["env"]}
    redis_secret = one(docs, "Secret", "fairgate-redis")
    assert refs["REDIS_PASSWORD"] == {"name": redis_secret["metadata"]["name"], "key": "password"}
    assert refs["REDISCLI_AUTH"] == refs["REDIS_PASSWORD"]  # the readiness probe authenticates
    secrets_dir: Path = rendered["_secrets"]  # type: ignore[assignment]
    password = (secrets_dir / "redis-password").read_text()
    assert len(password) >= 32 and f":{password}@fairgate-redis:6379" in (secrets_dir / "redis-url").read_text()
    assert set(redis_secret["data"]) == {"password", "url"}


def _selects(selector: dict, labels: dict) -> bool:
    """Whether a Kubernetes label selector (matchLabels, matchExpressions with In) selects ``labels``."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        assert expr["operator"] == "In"
        if labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


def _allowed(policies: list[dict], pod: dict, port: int, peer: dict | None) -> bool:
    """Whether the NetworkPolicies let ``peer`` (pod labels, plus "namespace" labels; None: outside the
    cluster) connect to ``port`` of ``pod`` (labels)."""
    for policy in policies:
        spec = policy["spec"]
        if not _selects(spec["podSelector"], pod):
            continue
        for rule in spec.get("ingress", []):
            if rule.get("ports") and not any(p["port"] <= port <= p.get("endPort", p["port"]) for p in rule["ports"]):
                continue
            sources = rule.get("from")
            if not sources:
                return True
            for source in sources:
                if peer is None:
                    continue
                if "namespaceSelector" not in source and peer.get("namespace") != "fairgate":
                    continue
                if "namespaceSelector" in source and not _selects(source["namespaceSelector"], peer["ns_labels"]):
                    continue
                if _selects(source.get("podSelector", {}), peer["labels"]):
                    return True
    return False


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policies_open_only_the_intended_doors(rendered, overlay):
    docs = rendered[overlay]
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    labels = {name: t["metadata"]["labels"] for name, t in pod_templates(docs).items()}  # as rendered
    head, worker, redis = (labels[n] for n in ("fairgate-head", "fairgate-worker", "fairgate-redis"))
    deny = one(docs, "NetworkPolicy", "fairgate-default-deny")["spec"]
    assert deny["podSelector"] == {} and deny["policyTypes"] == ["Ingress"] and "ingress" not in deny

    def peer(labels: dict, namespace: str = "fairgate") -> dict:
        return {"labels": labels, "namespace": namespace, "ns_labels": {"kubernetes.io/metadata.name": namespace}}

    stranger = peer({"app": "someone-else"}, "default")
    neighbour = peer({"app": "someone-else"})  # another pod in fairgate's own namespace
    operator = peer({"app.kubernetes.io/name": "kuberay-operator"}, "kuberay")
    impostor = peer({"app.kubernetes.io/name": "fairgate-worker"}, "default")  # same labels, other namespace
    service = one(docs, "Service", "fairgate")
    assert _selects({"matchLabels": service["spec"]["selector"]}, head)
    http = service["spec"]["ports"][0]["targetPort"]
    assert _allowed(policies, head, http, None) and _allowed(policies, head, http, stranger)  # the public door
    # GCS, dashboard, client, agent, fairgate's own (admission, dispatcher, rounds: a second shard's too)
    for port in (6379, 8265, 10001, 52365, 9100, 9101, 9110, 9111, 9120, 9130, 9131):
        assert not _allowed(policies, head, port, stranger), port
        assert not _allowed(policies, head, port, neighbour), port
        assert not _allowed(policies, worker, port, stranger), port
        assert _allowed(policies, head, port, peer(worker)) and _allowed(policies, worker, port, peer(head)), port
    assert _allowed(policies, head, 8265, operator) and not _allowed(policies, head, 6379, operator)
    assert _allowed(policies, redis, 6379, peer(head))
    for who in (peer(worker), neighbour, stranger, operator, impostor):
        assert not _allowed(policies, redis, 6379, who)
    assert not _allowed(policies, head, 6379, impostor) and not _allowed(policies, worker, 9999, impostor)


def overlay_gateways(rendered, monkeypatch) -> dict[str, dict]:
    """Each overlay's gateway.yaml as the pod reads it (its tenants file and admin key from the Secrets)."""
    secrets_dir: Path = rendered["_secrets"]  # type: ignore[assignment]
    monkeypatch.setenv("FAIRGATE_ADMIN_KEY", (secrets_dir / "admin-key").read_text().strip())
    raws = {}
    for overlay in OVERLAYS:
        raw = yaml.safe_load(one(rendered[overlay], "ConfigMap", "fairgate-gateway")["data"]["gateway.yaml"])
        raws[overlay] = raw | {"tenants_file": str(secrets_dir / "tenants.yaml")}
    return raws


def test_both_overlays_ship_queue_limits(rendered, monkeypatch):
    for overlay, raw in overlay_gateways(rendered, monkeypatch).items():
        scheduler = parse_config(raw, overlay)[0].scheduler
        assert scheduler.max_queued_per_tenant and scheduler.max_queued and scheduler.max_queue_s, overlay


def _render(k8s: Path, overlay: str) -> list[dict]:
    return _render_dir(k8s / "overlays" / overlay)


def _render_dir(path: Path) -> list[dict]:
    result = subprocess.run(["kubectl", "kustomize", str(path)], check=True, capture_output=True, text=True)
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def _references(doc: dict, kind: str) -> set[str]:
    """Every name ``doc`` gives a Secret (``kind`` "Secret") or a ConfigMap by, wherever it is."""
    found: set[str] = set()

    def walk(node):
        if isinstance(node, dict):
            if kind == "Secret":
                found.update(str(node[k]) for k in ("secretName",) if k in node)
                if "secretKeyRef" in node:
                    found.add(node["secretKeyRef"]["name"])
            elif "configMap" in node:
                found.add(node["configMap"]["name"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)
    return found


def test_a_rotated_secret_gets_a_new_name_everywhere_so_its_pods_roll(rendered, tmp_path):
    """Secrets and the gateway's ConfigMap are named by their content's hash, and every reference (the
    RayService's volumes, env and GCS options included) follows: rotating a Secret changes the pod
    templates that use it, which replaces those pods."""
    work = tmp_path / "k8s"
    shutil.copytree(REPO / "k8s", work, ignore=shutil.ignore_patterns("secrets"))
    subprocess.run(["bash", str(work / "make-secrets.sh")], check=True, capture_output=True)
    before = _render(work, "cpu-sim")
    (work / "base" / "secrets" / "cluster-secret").write_text("rotated-" + "x" * 48)
    after = _render(work, "cpu-sim")
    for docs in (before, after):
        for kind in ("Secret", "ConfigMap"):
            names = {d["metadata"]["name"] for d in docs if d["kind"] == kind}
            for d in docs:
                assert _references(d, kind) <= names, (d["kind"], _references(d, kind) - names)  # none dangles
    old, new = (one(docs, "Secret", "fairgate-secrets")["metadata"]["name"] for docs in (before, after))
    assert old != new
    head = [
        one(docs, "RayService", "fairgate")["spec"]["rayClusterConfig"]["headGroupSpec"] for docs in (before, after)
    ]
    assert old in str(head[0]) and new in str(head[1]) and head[0] != head[1]
    redis = [one(docs, "StatefulSet", "fairgate-redis") for docs in (before, after)]
    assert redis[0] == redis[1]  # its Secret did not change: Redis stays


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_disruption_budgets_move_workers_one_at_a_time_and_never_evict_the_head_or_redis(rendered, overlay):
    docs = rendered[overlay]
    labels = {name: t["metadata"]["labels"] for name, t in pod_templates(docs).items()}
    budgets = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "PodDisruptionBudget"}
    assert budgets["fairgate-workers"]["maxUnavailable"] == 1
    assert _selects(budgets["fairgate-workers"]["selector"], labels["fairgate-worker"])
    for pod in ("fairgate-head", "fairgate-redis"):
        assert budgets[pod]["minAvailable"] == 1 and _selects(budgets[pod]["selector"], labels[pod])
        assert not _selects(budgets[pod]["selector"], labels["fairgate-worker"])


def test_the_head_keeps_its_cluster_state_in_the_external_redis(rendered):
    docs = rendered["cpu-sim"]
    options = one(docs, "RayService", "fairgate")["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"]
    redis_secret = one(docs, "Secret", "fairgate-redis")["metadata"]["name"]
    assert options["backend"] == "redis" and options["redisAddress"] == "fairgate-redis:6379"
    assert options["redisPassword"]["valueFrom"]["secretKeyRef"] == {"name": redis_secret, "key": "password"}
    assert options["externalStorageNamespace"] != "fairgate"  # apart from the dispatcher's own keys


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_pod_reaches_the_cloud_metadata_address(rendered, overlay):
    docs = rendered[overlay]
    egress = [d["spec"] for d in docs if d["kind"] == "NetworkPolicy" and "Egress" in d["spec"]["policyTypes"]]
    assert len(egress) == 1 and egress[0]["podSelector"] == {}  # every pod of the namespace
    blocks = [peer["ipBlock"] for rule in egress[0]["egress"] for peer in rule["to"]]
    assert {b["cidr"] for b in blocks} == {"0.0.0.0/0", "::/0"}
    assert all(b["except"] for b in blocks) and "169.254.169.254/32" in str(blocks)


def test_the_namespace_enforces_the_restricted_pod_security_profile(rendered):
    labels = one(rendered["cpu-sim"], "Namespace", "fairgate")["metadata"]["labels"]
    for mode in ("enforce", "warn", "audit"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted"


def test_redis_is_probed_for_liveness_and_capped_under_its_memory_limit(rendered):
    redis = one(rendered["cpu-sim"], "StatefulSet", "fairgate-redis")["spec"]["template"]["spec"]["containers"][0]
    assert redis["livenessProbe"]["exec"]["command"] == ["redis-cli", "ping"]
    command = " ".join(redis["command"])
    maxmemory = int(re.search(r"--maxmemory (\d+)mb", command).group(1)) << 20
    limit = redis["resources"]["limits"]["memory"]
    assert limit.endswith("Mi") and maxmemory <= 0.8 * (int(limit[:-2]) << 20)
    assert "--maxmemory-policy noeviction" in command  # state is refused, never silently dropped


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_internal_endpoints_listen_on_fixed_ports_that_policies_name(rendered, overlay, monkeypatch):
    docs = rendered[overlay]
    secrets_dir: Path = rendered["_secrets"]  # type: ignore[assignment]
    monkeypatch.setenv("FAIRGATE_ADMIN_KEY", (secrets_dir / "admin-key").read_text().strip())
    raw = yaml.safe_load(one(docs, "ConfigMap", "fairgate-gateway")["data"]["gateway.yaml"])
    raw["tenants_file"] = str(secrets_dir / "tenants.yaml")
    network = parse_config(raw, overlay)[0].network
    templates = pod_templates(docs)
    declared = {
        name: {p["containerPort"] for c in t["spec"]["containers"] for p in c.get("ports", [])}
        for name, t in templates.items()
    }
    assert {network.admission_port, network.dispatcher_port} <= declared["fairgate-head"]
    assert network.worker_port in declared["fairgate-worker"]
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    named = {
        p["port"]
        for d in policies
        if d["metadata"]["name"].startswith("fairgate-")
        for r in d["spec"].get("ingress", [])
        for p in r.get("ports", [])
    }
    assert {network.admission_port, network.dispatcher_port, network.worker_port} <= named


def _images(docs: list[dict]) -> set[str]:
    found: set[str] = set()

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "image" and isinstance(value, str):
                    found.add(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for doc in docs:
        walk(doc)
    return found


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pinning_puts_every_image_of_an_overlay_at_the_digest_its_tag_names(rendered, overlay, tmp_path):
    """No registry is reachable here: the digest lookup (crane, skopeo or docker on an operator's
    machine) is replaced by a command that names each reference's digest; the rest is the script as
    operators run it, and kustomize's own rendering."""
    work = tmp_path / "k8s"
    shutil.copytree(REPO / "k8s", work, ignore=shutil.ignore_patterns("pinned"))
    (work / "base" / "secrets").mkdir(exist_ok=True)
    for f in Path(rendered["_secrets"]).iterdir():  # type: ignore[arg-type]
        shutil.copy(f, work / "base" / "secrets" / f.name)
    lookup = tmp_path / "digest"
    lookup.write_text('#!/bin/sh\nprintf "sha256:%s\\n" "$(printf %s "$1" | sha256sum | cut -c1-64)"\n')
    lookup.chmod(0o755)
    env = {**os.environ, "FAIRGATE_RESOLVE_DIGEST": str(lookup)}
    subprocess.run(["bash", str(work / "pin-images.sh"), overlay], check=True, capture_output=True, env=env)
    tagged = _images(rendered[overlay])
    pinned = _images(_render_dir(work / "pinned" / overlay))
    assert tagged and all("@" not in ref for ref in tagged)
    expected = {ref.rsplit(":", 1)[0] + "@sha256:" + hashlib.sha256(ref.encode()).hexdigest() for ref in tagged}
    assert pinned == expected

    env["FAIRGATE_RESOLVE_DIGEST"] = "false"  # a lookup that fails: nothing is written over the last pin
    before = (work / "pinned" / overlay / "kustomization.yaml").read_text()
    failed = subprocess.run(["bash", str(work / "pin-images.sh"), overlay], capture_output=True, text=True, env=env)
    assert failed.returncode == 1 and "cannot read the digest" in failed.stderr
    assert (work / "pinned" / overlay / "kustomization.yaml").read_text() == before


def test_both_overlays_name_the_dispatcher_shards_and_their_ports(rendered, monkeypatch):
    """One dispatcher by default; two shards is one line, on ports the NetworkPolicies open."""
    for overlay, raw in overlay_gateways(rendered, monkeypatch).items():
        assert parse_config(raw, overlay)[0].shards.count == 1
        config = parse_config({**raw, "shards": {**raw["shards"], "count": 2}}, overlay)[0]
        assert (config.shards.count, config.network.rounds_port, config.network.admission_port) == (2, 9130, 9100)
