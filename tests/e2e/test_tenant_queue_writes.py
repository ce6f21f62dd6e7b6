"""A namespace user writes no Queue anywhere (docs/operations.md#install-namespace,
docs/compatibility.md#stopping-a-queue).

The reconciler reads Queues in its install namespace only, so a Queue made anywhere else configures
and stops nothing (tests/e2e/test_install_namespace.py shows it with one a careless admin let a
tenant make). Before that, the user roles aggregated into the built-in ``edit`` role (as the
kube-controller-manager aggregates ``manifests/rbac/user-roles.yaml`` in a real cluster) give Queues
to read only: a user bound to ``edit`` in her namespace lists Queues there, but may neither plant a
stopped Queue named after another team's quota in her namespace or in the install's, nor stop or
delete the install's Queue. The chaos run's hostile tenant plants the same Queue against a loaded
system (``chaos/tenant_plant.py``).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from koord_queue.shared.api import names
from testenv import system
from testenv.cluster import LocalCluster
from tests import kube, tenancy
from tests.e2e.test_tenant_roles import aggregated

pytestmark = pytest.mark.e2e

USER = "queue-tenant"


def queue(name: str, namespace: str, *, stopped: bool) -> dict[str, object]:
    """A Queue; stopped and with the Block policy, one that would admit nothing."""
    annotations = {names.STOPPED_ANNOTATION: "true"} if stopped else {}
    return {
        "apiVersion": names.API_VERSION,
        "kind": "Queue",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {"queuePolicy": "Block" if stopped else "Priority", "priority": 1},
    }


def forbidden(done: subprocess.CompletedProcess[str]) -> bool:
    """RBAC refused the user (not some other failure of kubectl)."""
    return done.returncode != 0 and f'User "{USER}" cannot' in done.stderr


async def test_the_builtin_edit_role_plants_stops_and_deletes_no_queue(
    e2e_cluster: LocalCluster, system_e2e: system.Processes, namespace_in: str
) -> None:
    await kube.eventually(lambda: aggregated(e2e_cluster), what="our rules aggregated into view, edit, admin")
    tenancy.grant(e2e_cluster, namespace_in, USER)
    victim = f"{namespace_in}-victim"
    # A Queue of the install, made by hand by an admin (a quota's Queue is made the same way).
    admins = json.dumps(queue(victim, system.NAMESPACE, stopped=False))
    kube.kubectl(e2e_cluster, "apply", "-f", "-", input_text=admins)
    try:
        # Her rights are in effect (RBAC takes a moment): she lists the Queues of her namespace.
        async def reads() -> bool:
            done = tenancy.as_user(e2e_cluster, USER, "get", "queues", "-n", namespace_in)
            assert done.returncode == 0, done.stderr
            return True

        await kube.eventually(reads, what=f"{USER} reading Queues")

        for namespace in (namespace_in, system.NAMESPACE):
            body = json.dumps(queue(victim, namespace, stopped=True))
            planted = tenancy.as_user(
                e2e_cluster, USER, "create", "--dry-run=server", "-f", "-", input_text=body
            )
            assert forbidden(planted), (namespace, planted.stdout, planted.stderr)
        stop = tenancy.as_user(
            e2e_cluster,
            USER,
            "annotate",
            "--dry-run=server",
            "queue",
            victim,
            "-n",
            system.NAMESPACE,
            f"{names.STOPPED_ANNOTATION}=true",
        )
        assert forbidden(stop), stop.stderr
        delete = tenancy.as_user(
            e2e_cluster, USER, "delete", "--dry-run=server", "queue", victim, "-n", system.NAMESPACE
        )
        assert forbidden(delete), delete.stderr
    finally:
        kube.kubectl(e2e_cluster, "delete", "queue", victim, "-n", system.NAMESPACE, "--ignore-not-found")
