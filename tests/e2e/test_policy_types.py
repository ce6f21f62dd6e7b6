"""Every ValidatingAdmissionPolicy we install type-checks clean against the real schemas.

A CEL expression that names a field its type does not have (a misspelt ``resources``, a field of a
newer Kubernetes) is accepted when the policy is created; the apiserver only reports it as a
warning in the policy's ``status.typeChecking``, written by the controller-manager's policy status
controller, and the expression then fails on every request it meets. So this runs on the e2e
control plane, where that controller runs, with the install's policies (``testenv.system``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from testenv import binaries, system
from testenv.cluster import LocalCluster
from testenv.processes import wait_until
from tests import kube

pytestmark = pytest.mark.e2e


def installed_policies() -> list[str]:
    names: list[str] = []
    for path in sorted((binaries.PROJECT_ROOT / "manifests").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "ValidatingAdmissionPolicy":
                names.append(doc["metadata"]["name"])
    return names


def test_every_admission_policy_type_checks_without_a_warning(
    e2e_cluster: LocalCluster, system_e2e: system.Processes
) -> None:
    policies = installed_policies()
    assert len(policies) >= 4, policies
    warnings: dict[str, Any] = {}

    def checked() -> bool:
        for name in policies:
            out = kube.kubectl(e2e_cluster, "get", "validatingadmissionpolicy", name, "-o", "json").stdout
            got = json.loads(out)
            status = got.get("status") or {}
            if status.get("observedGeneration") != got["metadata"]["generation"]:
                return False  # not type-checked yet
            warnings[name] = (status.get("typeChecking") or {}).get("expressionWarnings") or []
        return True

    wait_until(checked, timeout=60, what="every policy type-checked by the controller-manager")
    assert warnings == {name: [] for name in policies}, json.dumps(warnings, indent=1)
