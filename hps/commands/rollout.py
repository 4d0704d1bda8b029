"""A model version rolled out over several pods, one after another (hps versions rollout):
``DESCRIPTION``. The control plane's routes: ``POST /v1/models/{model}/versions`` (the
import, a job), ``POST .../versions/{n}/activate``, ``GET .../versions`` (the check)."""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import cast

from hps.commands.versions import positive
from hps.errors import BackendUnavailable, HPSError, RequestError
from hps.types import JSON

DESCRIPTION = """\
Roll a model version out over several pods, one after another. Each pod (its control
plane's URL, --admin, in order) imports the version into its own tiers if it lacks it (a
job followed to its end), then activates it and is checked (the version live). One JSON
line per pod (the versions the activation retired, and those whose rows it could not drop:
also said on stderr). The first pod that fails stops the rollout: the pods after it keep serving
the version they served, and the command exits 1. A rollback is the same command with the
older version (kept on every pod: no import).
"""
POLL_S = 0.5


def add_rollout(actions: argparse._SubParsersAction) -> None:
    p = actions.add_parser(
        "rollout",
        help="import (where missing) and activate a version on several pods, one after another",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", required=True, help="model name")
    p.add_argument("version", type=positive, metavar="N", help="model version")
    p.add_argument(
        "--admin",
        action="append",
        required=True,
        type=admin_url,
        metavar="URL",
        help="a pod's control plane (http:// or https://), e.g. http://10.0.0.7:8081 (repeat, "
        "in order)",
    )
    p.add_argument("--token-file", help="file of the admin token (else $HPS_ADMIN_TOKEN)")
    p.add_argument("--sparse-files", nargs="+", metavar="DIR",
                   help="the version's sparse files, as paths on the pods (default: the "
                   "ps.json's)")  # fmt: skip
    p.add_argument("--dense-file", help="the version's dense weights, as a path on the pods")
    p.add_argument("--row-dtype", nargs="+", metavar="DTYPE",
                   help="the version's row formats, one for every table or one per table "
                   "(default: the ps.json's)")  # fmt: skip
    p.add_argument("--dims", nargs="+", type=int, metavar="DIM",
                   help="the version's vector sizes, one for every table or one per table "
                   "(default: the ps.json's)")  # fmt: skip
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per pod")
    p.set_defaults(func=_rollout)


def admin_url(text: str) -> str:
    """A control plane's URL (argparse type): http:// or https:// with a host (and a
    numeric port, if any)."""
    try:
        parts = urllib.parse.urlsplit(text)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        ok = ok and parts.port != 0  # .port: ValueError for one that is not a number
    except ValueError:
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a control plane's URL: give http://HOST:PORT or https://HOST:PORT"
        )
    return text


def model_path(model: str, rest: str = "") -> str:
    """The route path of ``model`` (its name quoted: one path segment whatever it holds),
    with ``rest`` after it."""
    return f"/v1/models/{urllib.parse.quote(model, safe='')}{rest}"


class ControlPlane:
    """The version routes of one pod's control plane."""

    def __init__(self, url: str, token: str | None, timeout: float) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def call(self, method: str, path: str, body: JSON | None = None) -> JSON:
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                answer = json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise RequestError(f"{method} {path}: {exc.code} {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise BackendUnavailable(f"cannot reach {self.url}: {exc}") from None
        except ValueError as exc:  # a URL urllib refuses (http.client.InvalidURL), not JSON
            raise RequestError(f"{method} {self.url}{path}: {exc}") from None
        return answer if isinstance(answer, dict) else {}

    def versions(self, model: str) -> JSON:
        return self.call("GET", model_path(model, "/versions"))

    def import_version(self, model: str, body: JSON, deadline: float) -> None:
        job = self.call("POST", model_path(model, "/versions"), body)
        status = str(job.get("status_url") or f"/v1/jobs/{job.get('job')}")
        while True:
            view = self.call("GET", status)
            if view.get("state") == "done":
                return
            if view.get("state") in ("failed", "interrupted"):
                raise RequestError(f"import {view.get('state')}: {view.get('error')}")
            if time.monotonic() > deadline:
                raise BackendUnavailable(f"import still {view.get('state')} at the timeout")
            time.sleep(POLL_S)


def roll_out(pod: ControlPlane, model: str, version: int, body: JSON, timeout: float) -> JSON:
    """Import (if missing) and activate ``version`` on one pod; what happened."""
    start = time.monotonic()
    deadline = start + timeout
    listed = pod.versions(model).get("versions")
    known = {int(v["version"]): v for v in listed} if isinstance(listed, list) else {}
    imported = version not in known
    if imported:
        pod.import_version(model, {"version": version, **body}, deadline)
    else:
        check_held_as_asked(pod, known[version], body)
    mid = time.monotonic()
    done = pod.call("POST", model_path(model, f"/versions/{version}/activate"))
    live = pod.versions(model).get("live")
    if live != version:
        raise RequestError(f"activated, but the pod reports version {live} live")
    return {
        "pod": pod.url,
        "model": model,
        "version": version,
        "imported": imported,
        "import_s": round(mid - start, 3),
        "activate_s": round(time.monotonic() - mid, 3),
        "previous": done.get("previous"),
        "served": done.get("served"),
        "retired": done.get("retired"),
        "rows_left": done.get("rows_left"),  # retired, their rows not dropped yet
        "problem": done.get("problem"),  # why the first of them was not
        "ok": True,
    }


def check_held_as_asked(pod: ControlPlane, held: JSON, body: JSON) -> None:
    """A RequestError when the pod holds the version in other dims or row formats than
    ``body`` asks for (one value: every table): it is activated as held, never imported
    again, so a rollout given other ones would otherwise serve what it did not ask for."""
    for field, key in (("dims", "dims"), ("row_dtype", "row_dtypes")):
        asked, has = body.get(field), held.get(key)
        if not isinstance(asked, list) or not asked or not isinstance(has, list):
            continue
        want = list(asked) * len(has) if len(asked) == 1 else list(asked)
        if want != has:
            raise RequestError(
                f"{pod.url} holds version {held.get('version')} with {key} {has}, not the "
                f"{want} asked for: roll it out as held, or import under a new number"
            )


def import_body(args: argparse.Namespace) -> JSON:
    """The body of each pod's ``POST /v1/models/{model}/versions`` (less the version): the
    options given."""
    given = {
        "sparse_files": args.sparse_files,
        "dense_file": args.dense_file,
        "row_dtype": args.row_dtype,
        "dims": args.dims,
    }
    return {key: value for key, value in given.items() if value}


def _rollout(args: argparse.Namespace) -> int:
    from hps.service.auth import resolve_token

    token = resolve_token(args.token_file)
    body = import_body(args)
    for i, url in enumerate(args.admin):
        pod = ControlPlane(url, token, timeout=args.timeout)
        try:
            row = roll_out(pod, args.model, args.version, body, args.timeout)
        except HPSError as exc:
            left = args.admin[i + 1 :]
            print(json.dumps({"pod": url, "model": args.model, "version": args.version,
                              "ok": False, "error": str(exc), "not_started": left}))  # fmt: skip
            return 1
        print(json.dumps(row), flush=True)
        if row["rows_left"]:
            again = ", ".join(
                f"DELETE {model_path(args.model, f'/versions/{n}')}"
                for n in cast(list[int], row["rows_left"])
            )
            print(
                f"hps versions rollout: {url}: versions {row['rows_left']} of {args.model} "
                f"are retired but their rows are left ({row['problem']}); retire them again "
                f"there ({again}) once that is resolved",
                file=sys.stderr,
                flush=True,
            )
    sys.stdout.flush()
    return 0
