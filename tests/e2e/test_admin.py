"""The admin API end to end: only the admin key gets in; tenants are created, reweighted and deleted
live, and every ingress sees the change; no key or key hash ever comes back out."""

from __future__ import annotations

import httpx
import openai
import pytest

from .gateway_helpers import Gateway, deploy


@pytest.fixture(scope="module")
def gw(serve_port) -> Gateway:
    gateway = deploy("admin", serve_port, workers=1, ingress_replicas=2)  # each with its own key cache
    yield gateway
    gateway.delete()


def admin(gw: Gateway, method: str, path: str, key: str | None = None, **kw) -> httpx.Response:
    root = gw.base_url.removesuffix("/v1")
    headers = {"Authorization": f"Bearer {key if key is not None else gw.admin_key}"}
    return httpx.request(method, f"{root}/admin{path}", headers=headers, timeout=30, **kw)


def complete(gw: Gateway, key: str) -> int:
    client = openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0, timeout=30)
    r = client.completions.create(model="fairgate-sim", prompt="hi", max_tokens=3, extra_body={"ignore_eos": True})
    return r.usage.completion_tokens


def test_only_the_admin_key_gets_in(gw):
    assert admin(gw, "GET", "/tenants").status_code == 200
    tenant = admin(gw, "GET", "/tenants", key=gw.keys["alice"])
    assert tenant.status_code == 403 and tenant.json()["error"]["type"] == "permission_error"
    assert admin(gw, "GET", "/tenants", key="fg-not-a-key-at-all").status_code == 401
    root = gw.base_url.removesuffix("/v1")
    assert httpx.get(f"{root}/admin/tenants", timeout=30).status_code == 401
    # and the admin key is no tenant key
    with pytest.raises(openai.AuthenticationError):
        complete(gw, gw.admin_key)


def test_tenants_list_with_counters_and_no_secrets(gw):
    complete(gw, gw.keys["alice"])
    body = admin(gw, "GET", "/tenants")
    rows = {row["name"]: row for row in body.json()["data"]}
    assert set(rows) == {"alice", "bob", "carol"}
    assert rows["alice"]["service"] > 0 and rows["alice"]["output_tokens"] == 3 and rows["bob"]["weight"] == 1
    for secret in [*gw.keys.values(), gw.admin_key, "key_hash"]:
        assert secret not in body.text
    stats = admin(gw, "GET", "/stats").json()
    assert stats["tenants"]["alice"]["finished"] >= 1 and "workers" in stats


def test_create_reweight_and_delete_a_tenant_live(gw):
    created = admin(gw, "POST", "/tenants", json={"name": "dave", "weight": 2})
    assert created.status_code == 201, created.text
    key = created.json()["api_key"]
    assert created.json()["weight"] == 2
    assert complete(gw, key) == 3  # usable at once
    updated = admin(gw, "PATCH", "/tenants/dave", json={"weight": 3.5})
    assert updated.status_code == 200 and updated.json()["weight"] == 3.5
    assert gw.stats()["tenants"]["dave"]["weight"] == 3.5  # the dispatcher charges by it from now on
    rotated = "fg-rotated-" + "x" * 24
    for _ in range(8):  # both ingress replicas have the key in their caches now
        assert complete(gw, key) == 3
    assert admin(gw, "PATCH", "/tenants/dave", json={"api_key": rotated}).status_code == 200
    for _ in range(8):  # refused at once, through the replica that made the change and the other one
        with pytest.raises(openai.AuthenticationError):
            complete(gw, key)
        assert complete(gw, rotated) == 3
    assert admin(gw, "DELETE", "/tenants/dave").json() == {"name": "dave", "deleted": True}
    for _ in range(8):
        with pytest.raises(openai.AuthenticationError):
            complete(gw, rotated)
    assert admin(gw, "DELETE", "/tenants/dave").status_code == 404


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "param"),
    [
        ("POST", "/tenants", {"name": "alice"}, 409, None),
        ("POST", "/tenants", {"name": "has space"}, 400, None),
        ("POST", "/tenants", {"weight": 1}, 400, "name"),
        ("POST", "/tenants", {"name": "erin", "weight": "heavy"}, 400, "weight"),
        ("POST", "/tenants", {"name": "erin", "weight": -1}, 400, None),
        ("POST", "/tenants", {"name": "erin", "api_key": "short"}, 400, "api_key"),
        ("POST", "/tenants", {"name": "erin", "tenant": "alice"}, 400, "tenant"),
        ("PATCH", "/tenants/nobody", {"weight": 2}, 404, None),
        ("PATCH", "/tenants/bob", {"name": "robert"}, 400, "name"),
    ],
)
def test_bad_admin_changes_are_refused_clearly(gw, method, path, body, status, param):
    r = admin(gw, method, path, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["message"] and error.get("param") == param


def test_no_key_ever_reaches_a_log(gw):
    """Keys are compared as hashes and never logged: after good, bad and admin requests, no file of the
    Ray session's logs (every actor, replica, proxy and the controller) holds any key."""
    import pathlib

    import ray

    complete(gw, gw.keys["alice"])
    wrong = "fg-wrong-key-" + "z" * 20
    with pytest.raises(openai.AuthenticationError):
        complete(gw, wrong)
    admin(gw, "GET", "/tenants")
    admin(gw, "GET", "/tenants", key=gw.keys["bob"])
    logs = pathlib.Path(ray._private.worker._global_node.get_session_dir_path()) / "logs"
    secrets = [*gw.keys.values(), gw.admin_key, wrong, gw.secret]
    files = [p for p in logs.rglob("*") if p.is_file()]
    assert files
    for path in files:
        text = path.read_bytes()
        assert not any(s.encode() in text for s in secrets), f"a key appears in {path}"
