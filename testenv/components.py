"""Render ``manifests/`` with opt-in kustomize components, as a user's overlay would.

A component (``manifests/components/<name>``) cannot be built alone: it joins an overlay's
resources. :func:`rendered` writes the smallest such overlay (the install plus the components) in a
temporary directory under the project, since kustomize accepts only relative paths to a base, and
returns its objects. The chart's equality test and the dry runs of the NetworkPolicies
(docs/operations.md#network-policies) read the install this way.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import yaml

from testenv import binaries

ROOT: Final = binaries.PROJECT_ROOT
COMPONENTS: Final = ROOT / "manifests" / "components"
NETWORK_POLICIES: Final = "network-policies"
#: The web dashboard installed in the cluster (docs/dashboard.md#installed-in-the-cluster).
WEB_DASHBOARD: Final = "web-dashboard"


def rendered(components: Sequence[str]) -> list[dict[str, Any]]:
    """``kubectl kustomize`` of an overlay of ``manifests/`` with ``components``."""
    scratch = ROOT / ".local"
    scratch.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="overlay-", dir=scratch) as tmp:
        overlay = Path(tmp)
        base = Path("..") / ".." / "manifests"
        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [str(base)],
            "components": [str(base / "components" / name) for name in components],
        }
        (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        out = subprocess.run(
            [str(binaries.kubectl()), "kustomize", str(overlay)], check=True, capture_output=True, text=True
        ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def network_policies() -> list[dict[str, Any]]:
    """The NetworkPolicies the opt-in component adds, as an overlay renders them."""
    return [d for d in rendered([NETWORK_POLICIES]) if d["kind"] == "NetworkPolicy"]
