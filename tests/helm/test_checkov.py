"""checkov on every rendered profile (and the default values): no failed check.

Each profile is rendered as `helm template` would (hooks included), written to a folder and
scanned with `checkov --framework kubernetes`, offline. Not scanned, for every profile:

- CKV_K8S_43 (images by digest): the examples pin tags to stay readable; the everything
  profile shows digests, and images.*.digest wins over the tag;
- CKV_K8S_15 (imagePullPolicy Always): IfNotPresent is what a pinned tag or digest wants.

single-pod alone is also exempt from CKV2_K8S_6 (pods with a NetworkPolicy): it is the
profile for a cluster without a network-policy controller (networkPolicy.enabled: false).
The only suppressions in the chart itself are the helm test pod's liveness and readiness
checks (it runs to completion, bounded by activeDeadlineSeconds); that is checked too.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helm.chart import PROFILES, profile_values, render
from tests.helm.tools import checkov

ALWAYS_SKIPPED = ["CKV_K8S_43", "CKV_K8S_15"]
EXEMPT = {"single-pod": ["CKV2_K8S_6"]}
SUPPRESSED_ON_TEST_POD = {"CKV_K8S_8", "CKV_K8S_9"}
TIMEOUT_S = 300  # a scan takes a few seconds


def scan(values: dict[str, Any], folder: Path, skip: list[str]) -> dict[str, Any]:
    for path, text in render(values).items():
        if not path.endswith("NOTES.txt") and text.strip():
            (folder / path.replace("/", "_")).write_text(text)
    env = {**os.environ, "BC_SKIP_MAPPING": "TRUE"}  # offline: no download of guidelines
    done = subprocess.run(
        [str(checkov()), "-d", str(folder), "--framework", "kubernetes", "-o", "json"]
        + ["--skip-download", "--skip-check", ",".join(skip)],
        capture_output=True,
        text=True,
        env=env,
        timeout=TIMEOUT_S,
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]  # 1: checks failed
    report = json.loads(done.stdout)
    assert isinstance(report, dict) and report["check_type"] == "kubernetes", done.stdout[:500]
    result: dict[str, Any] = report
    return result


@pytest.mark.parametrize("profile", ["default", *PROFILES])
def test_checkov_finds_nothing(profile: str, tmp_path: Path) -> None:
    values = {} if profile == "default" else profile_values(profile)
    report = scan(values, tmp_path, ALWAYS_SKIPPED + EXEMPT.get(profile, []))
    assert report["summary"]["parsing_errors"] == 0
    failed = [
        f"{f['check_id']} {f['resource']}: {f['check_name']}"
        for f in report["results"]["failed_checks"]
    ]
    assert not failed, f"checkov, profile {profile}:\n" + "\n".join(failed)
    assert report["summary"]["passed"] > 100
    suppressed = {(s["check_id"], s["resource"]) for s in report["results"]["skipped_checks"]}
    assert suppressed == {(c, "Pod.hps-test.rel-hps-test") for c in SUPPRESSED_ON_TEST_POD}


def test_the_exempt_profile_is_the_one_without_a_network_policy(tmp_path: Path) -> None:
    """Without its exemption single-pod fails CKV2_K8S_6 only: no other check hides there."""
    report = scan(profile_values("single-pod"), tmp_path, ALWAYS_SKIPPED)
    failed = {f["check_id"] for f in report["results"]["failed_checks"]}
    assert failed == {"CKV2_K8S_6"}
