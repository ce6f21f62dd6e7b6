"""A namespace user bound to a built-in role (``edit``, ``view``) reads their queue, as in a real
cluster and under ``make run``: the kube-controller-manager's clusterrole-aggregation-controller
merges ``manifests/rbac/user-roles.yaml`` into ``view``, ``edit`` and ``admin``.

The checks are those of tests/integration/test_tenant_roles.py, where nothing aggregates and the
user is bound to our ClusterRole itself; here the RoleBinding names only the built-in role, so each
passes only if the aggregation happened.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from testenv import system
from testenv.cluster import LocalCluster
from tests import kube
from tests.integration.test_tenant_roles import (
    assert_reads_but_never_writes,
    assert_sees_only_their_namespace,
    tenancy,
)
from tests.integration.test_visibility import Visibility, available, registered, serving_visibility

pytestmark = pytest.mark.e2e

#: Built-in role → our ClusterRole aggregated into it.
AGGREGATED = {
    "view": "koord-queue-user-view",
    "edit": "koord-queue-user-edit",
    "admin": "koord-queue-user-admin",
}


def rules_of(cluster: LocalCluster, role: str) -> list[dict[str, Any]]:
    obj = json.loads(cluster.request("GET", f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{role}"))
    return list(obj.get("rules") or [])


async def aggregated(cluster: LocalCluster) -> bool:
    """Every built-in role carries every rule of our role for it (aggregation copies them as is)."""
    return all(
        all(rule in rules_of(cluster, builtin) for rule in rules_of(cluster, ours))
        for builtin, ours in AGGREGATED.items()
    )


@pytest.fixture
async def visibility(e2e_cluster: LocalCluster, system_e2e: system.Processes) -> Visibility:
    """The reconciler's visibility server; ``system_e2e`` also applied the manifests' RBAC."""
    vis = await serving_visibility(e2e_cluster, system_e2e)
    await kube.eventually(lambda: aggregated(e2e_cluster), what="our rules aggregated into view, edit, admin")
    return vis


async def test_the_builtin_edit_role_lets_a_namespace_user_read_queueunits_but_never_write_one(
    e2e_cluster: LocalCluster, visibility: Visibility, namespace_in: str
) -> None:
    async with tenancy(e2e_cluster, namespace_in, visibility, role="edit") as t:
        await assert_reads_but_never_writes(t)


async def test_the_builtin_view_role_shows_a_namespace_user_their_namespace_on_the_visibility_api(
    e2e_cluster: LocalCluster, visibility: Visibility, namespace_in: str
) -> None:
    async with tenancy(e2e_cluster, namespace_in, visibility, role="view") as t:
        with registered(e2e_cluster, port=visibility.port):
            await available(e2e_cluster)
            await assert_sees_only_their_namespace(t)
