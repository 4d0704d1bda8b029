"""The chart renders no secret (helm/hps/README.md, "Secrets").

No Secret object and no secret value in any rendered manifest (what `helm template` and
`helm get manifest` show) nor in the values the chart ships (what `helm get values` dumps):
Triton's admin key is the one `hps serve --state-dir` writes at every start into an
in-memory volume the control plane mounts read-only; the control plane's token (and a
pinned admin key) come only from `admin.existingSecret`, a Secret the operator creates.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest
import yaml

from hps.cli import build_parser
from hps.redact import is_reference_name, is_secret_name
from hps.triton.admin_key import KEY_FILE_ENV, key_file_for
from tests.helm.chart import (
    CHART,
    EXAMPLES,
    PROFILES,
    containers,
    manifests,
    of_kind,
    pod_specs,
    profile_values,
    render,
    serving_workload,
)

TOKEN = {"admin": {"existingSecret": "hps-admin"}}
PINNED = {"admin": {"existingSecret": "hps-admin", "pinAdminKey": True}}
CASES: dict[str, dict[str, Any]] = {
    "defaults": {},
    **{p: profile_values(p) for p in PROFILES},
    "token": TOKEN,
    "pinned key": PINNED,
}

# Settings that say where a secret is kept, never the secret: in values, the name of a
# Secret the operator creates (existingSecret, imagePullSecrets), the key in it
# (passwordKey), librdkafka setting -> key in kafka.existingSecret (secretKeys); in
# manifests, a Secret volume's source and imagePullSecrets, and a service-account flag.
# In ps.json, hps.redact's reference names (hps_kafka_config_env: setting -> variable).
# What they hold must be names or paths (or numbers and flags: defaultMode); every other
# secret-named setting (hps.redact.is_secret_name) must be empty.
VALUE_REFERENCES = {"existingSecret", "passwordKey", "secretKeys", "imagePullSecrets"}
MANIFEST_REFERENCES = {"secret", "imagePullSecrets", "automountServiceAccountToken"}
NAME = re.compile(r"^[-._/a-zA-Z0-9]{1,253}$")


def _leaves(doc: Any) -> list[Any]:
    if isinstance(doc, dict):
        return [x for v in doc.values() for x in _leaves(v)]
    if isinstance(doc, list):
        return [x for v in doc for x in _leaves(v)]
    return [doc]


def _secrets(doc: Any, references: Collection[str] = (), path: str = "") -> list[str]:
    """Where ``doc`` holds something under a secret name: a secret-named setting with a
    value, or a reference holding more than names, numbers and flags."""
    found = []
    items = (
        doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else []
    )
    for key, value in items:
        where = f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}".lstrip(".")
        if key in references or (isinstance(key, str) and is_reference_name(key)):
            found += [
                f"{where}: {leaf!r} is no name"
                for leaf in _leaves(value)
                if isinstance(leaf, str) and leaf and not NAME.match(leaf)
            ]
        elif isinstance(key, str) and is_secret_name(key) and value not in (None, "", {}, []):
            found.append(f"{where}={value!r}")
        else:
            found += _secrets(value, references, where)
    return found


def _by_name(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in containers(spec)}


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: v.get("value", "") for v in container.get("env", [])}


def _mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in container.get("volumeMounts", [])}


@pytest.mark.parametrize("case", list(CASES))
def test_no_secret_in_a_rendered_manifest(case: str) -> None:
    values = CASES[case]
    docs = manifests(values)
    assert of_kind(docs, "Secret") == [], case
    for doc in docs:
        where = f"{case}: {doc['kind']}/{doc['metadata']['name']}"
        assert "stringData" not in yaml.safe_dump(doc), where
        if doc["kind"] == "ConfigMap":
            for name, text in doc["data"].items():
                if name.endswith(".json"):  # the ps.json files: secrets only by reference
                    assert _secrets(json.loads(text)) == [], f"{where} {name}"
        else:
            assert "data" not in doc, where  # only ConfigMaps carry files
        assert _secrets(doc, MANIFEST_REFERENCES) == [], where
    for name, spec in pod_specs(docs):
        for c in containers(spec):
            for var in c.get("env", []):
                if is_secret_name(var["name"]):  # HPS_ADMIN_TOKEN, HPS_REDIS_PASSWORD, ...
                    pytest.fail(f"{case}: {name}/{c['name']} sets {var['name']}")
    # Nothing random either: a generated secret would differ from one render to the next.
    assert render(values) == render(values), case


@pytest.mark.parametrize("case", list(CASES))
def test_triton_key_is_hps_serves_own(case: str) -> None:
    """hps serve writes its key into the in-memory admin-key volume (its --state-dir), which
    only the control plane also mounts (read-only), naming the file by HPS_ADMIN_KEY_FILE."""
    values = CASES[case]
    pinned = values.get("admin", {}).get("pinAdminKey", False)
    docs = manifests(values)
    spec = serving_workload(docs)["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    by_name = _by_name(spec)
    triton, admin = by_name["triton"], by_name["control-plane"]
    serve = build_parser().parse_args(triton["command"][1:])
    key_file = str(key_file_for(serve.state_dir))
    assert _mounts(triton)["admin-key"]["mountPath"] == serve.state_dir
    assert _mounts(admin)["admin-key"] == {
        "name": "admin-key",
        "mountPath": serve.state_dir,
        "readOnly": True,
    }
    assert _env(admin)[KEY_FILE_ENV] == key_file
    if pinned:
        assert volumes["admin-key"]["secret"] == {
            "secretName": "hps-admin",
            "defaultMode": 0o440,
            "items": [{"key": "admin-key", "path": Path(key_file).name}],
        }
        assert _mounts(triton)["admin-key"]["readOnly"] is True
        assert _env(triton)[KEY_FILE_ENV] == key_file
    else:
        assert volumes["admin-key"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "1Mi"}
        assert not _mounts(triton)["admin-key"].get("readOnly")  # hps serve writes it
        # hps serve generates its key only when neither variable names one
        assert not {"HPS_ADMIN_KEY", KEY_FILE_ENV} & set(_env(triton)), case
    for name, other_spec in pod_specs(docs):
        for c in containers(other_spec):
            if other_spec is spec and c["name"] in ("triton", "control-plane"):
                continue
            assert not {"admin-key", "admin-token"} & set(_mounts(c)), (name, c["name"])
            assert not {"HPS_ADMIN_KEY", KEY_FILE_ENV} & set(_env(c)), (name, c["name"])


@pytest.mark.parametrize("case", list(CASES))
def test_token_only_from_existing_secret(case: str) -> None:
    values = CASES[case]
    existing = values.get("admin", {}).get("existingSecret", "")
    spec = serving_workload(manifests(values))["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    by_name = _by_name(spec)
    admin = by_name["control-plane"]
    args = build_parser().parse_args(admin["command"][1:])
    assert "admin-token" not in _mounts(by_name["triton"])  # Triton never sees the token
    if not existing:
        assert args.token_file is None and "admin-token" not in volumes
        assert "admin-token" not in _mounts(admin)
        return
    assert volumes["admin-token"]["secret"] == {
        "secretName": existing,
        "defaultMode": 0o440,
        "items": [{"key": "token", "path": "token"}],
    }
    mount = _mounts(admin)["admin-token"]
    assert mount["readOnly"] is True
    assert args.token_file == f"{mount['mountPath']}/token"


def test_control_plane_starts_before_hps_serve_writes_the_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The pod's containers start together: the control plane, given the rendered
    environment, starts without the key file and without a token (mutations: 403), then
    follows each key hps serve writes."""
    from hps.errors import BackendUnavailable
    from hps.service.auth import check_bearer, resolve_token
    from hps.service.commands import admin_key_source
    from hps.triton.admin_key import ensure_key

    spec = serving_workload(manifests({}))["spec"]["template"]["spec"]
    by_name = _by_name(spec)
    serve = build_parser().parse_args(by_name["triton"]["command"][1:])
    admin = build_parser().parse_args(by_name["control-plane"]["command"][1:])
    state_dir = tmp_path / "admin-key"  # the emptyDir, as both containers see it
    rendered = _env(by_name["control-plane"])[KEY_FILE_ENV]
    assert rendered == str(key_file_for(serve.state_dir))
    for var in ("HPS_ADMIN_KEY", "HPS_ADMIN_TOKEN", "HPS_ADMIN_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(KEY_FILE_ENV, str(key_file_for(state_dir)))

    assert resolve_token(admin.token_file) is None
    assert check_bearer(None, "Bearer anything") == 403
    current = admin_key_source(tmp_path / "etc-hps")  # no error: the file is not there yet
    with pytest.raises(BackendUnavailable, match="does not exist yet") as err:
        current()
    assert err.value.status == 503

    monkeypatch.delenv(KEY_FILE_ENV)  # hps serve's own environment
    first, path = ensure_key(state_dir)
    monkeypatch.setenv(KEY_FILE_ENV, str(key_file_for(state_dir)))
    assert path == key_file_for(state_dir) and path.stat().st_mode & 0o777 == 0o600
    assert current() == first
    monkeypatch.delenv(KEY_FILE_ENV)
    second, _ = ensure_key(state_dir)  # the triton container restarted
    monkeypatch.setenv(KEY_FILE_ENV, str(key_file_for(state_dir)))
    assert current() == second != first


@pytest.mark.parametrize(
    "path", [CHART / "values.yaml", *sorted(EXAMPLES.glob("*.yaml"))], ids=lambda p: p.name
)
def test_no_secret_in_the_values(path: Path) -> None:
    """A Helm values dump (the defaults, each example) holds no secret: every secret-named
    value is empty, or a reference holding names of Secrets and their keys."""
    values = yaml.safe_load(path.read_text()) or {}
    assert _secrets(values, VALUE_REFERENCES) == [], path.name


def test_the_secret_search_finds_secrets() -> None:
    """The checks above would see a secret: inline, nested, or smuggled into a reference."""
    assert _secrets({"l2": {"redis": {"password": "hunter2"}}}) == ["l2.redis.password='hunter2'"]
    assert _secrets({"kafka": {"config": {"sasl.jaas.config": "x y"}}})
    assert _secrets({"admin": {"token": "t0k3n"}}, VALUE_REFERENCES)
    assert _secrets({"existingSecret": "not a name: hunter2"}, VALUE_REFERENCES)
    assert not _secrets(
        {"existingSecret": "hps-admin", "passwordKey": "password"}, VALUE_REFERENCES
    )
    assert not _secrets({"hps_password_env": "HPS_REDIS_PASSWORD"})
