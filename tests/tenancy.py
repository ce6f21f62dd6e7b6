"""A namespace user for the hostile-tenant tests: the rights a team member really has, nothing more.

``grant`` binds user ``alice`` (or any name) in one namespace to the built-in ``edit`` ClusterRole
(as a cluster admin would) and, because a cluster without the controller-manager's aggregation
controller leaves that role's rules empty, to a Role with the same job and pod rights ``edit``
aggregates in a real cluster (:func:`rules`). ``as_user`` runs kubectl impersonating that user, so
every request goes through the real authorization and admission chain.
"""

from __future__ import annotations

import subprocess
from typing import Any

import yaml

from testenv import kinds
from testenv.cluster import LocalCluster
from tests import kube

#: The namespace user of the hostile-tenant tests.
ALICE = "alice"
#: What ``edit`` lets a namespace user do with workloads (read and write, not RBAC).
WRITE = ["get", "list", "watch", "create", "update", "patch", "delete"]


def rules() -> list[dict[str, Any]]:
    """The Role's rules: pods and their config, CronJobs (a parent kind, not a queued one), reading
    events, and every job kind of the registry (``testenv/kinds.py``), so a new kind needs no line."""
    return [
        {"apiGroups": [""], "resources": ["pods", "configmaps", "services"], "verbs": WRITE},
        {"apiGroups": ["batch"], "resources": ["cronjobs"], "verbs": WRITE},
        *kinds.rbac_rules(WRITE),
        {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list", "watch"]},
    ]


def grant(cluster: LocalCluster, namespace: str, user: str = "alice") -> None:
    """Give ``user`` a namespace user's rights in ``namespace`` (``edit`` plus explicit rules)."""
    docs = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": f"{user}-workloads", "namespace": namespace},
            "rules": rules(),
        },
        *(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": f"{user}-{kind.lower()}-{role}", "namespace": namespace},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
            }
            for kind, role in (("ClusterRole", "edit"), ("Role", f"{user}-workloads"))
        ),
    ]
    kube.kubectl(cluster, "apply", "-f", "-", input_text=yaml.safe_dump_all(docs))


def as_user(
    cluster: LocalCluster, user: str, *args: str, input_text: str | None = None
) -> subprocess.CompletedProcess[str]:
    """kubectl as ``user``; never raises on a refusal (the tests read ``returncode`` and stderr)."""
    return kube.kubectl(cluster, f"--as={user}", *args, input_text=input_text, check=False)


async def create_as(cluster: LocalCluster, namespace: str, body: dict[str, Any], user: str = ALICE) -> None:
    """Create ``body`` in ``namespace`` as ``user``: her rights take a moment to load after
    :func:`grant`, so the create is retried until RBAC lets it in (or it exists)."""

    async def attempt() -> bool:
        done = as_user(cluster, user, "-n", namespace, "create", "-f", "-", input_text=yaml.safe_dump(body))
        return done.returncode == 0 or "AlreadyExists" in done.stderr

    await kube.eventually(attempt, timeout=30, what=f"{user} creating {body['metadata']['name']}")
