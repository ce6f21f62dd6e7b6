"""A namespace user reads their queue, and nothing more: the roles of ``manifests/rbac/user-roles.yaml``
with the real kube-apiserver's RBAC, through ``kubectl --as=alice`` (impersonation, as a user's own
credentials would be authorized).

alice is bound in one namespace only. She lists its QueueUnits and ElasticQuotas and, through the
aggregation layer, its waiting units with their positions on the namespaced visibility paths; she is
Forbidden on another namespace, on the cluster-wide visibility paths and on every QueueUnit write,
including its status. The cluster admin keeps the cluster-wide view.

This profile has no kube-controller-manager, so nothing aggregates our ClusterRoles into the built-in
``edit``: alice's RoleBinding names ``koord-queue-user-edit`` itself, which carries exactly the rules
aggregation adds to ``edit``. tests/e2e/test_tenant_roles.py binds the built-in ``edit`` where the
controller-manager aggregates, as in a real cluster.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from koord_queue.shared.api import names
from testenv import system
from testenv.cluster import LocalCluster
from tests import kube
from tests.integration.test_visibility import (
    GROUP_VERSION,
    Visibility,
    available,
    make_waiting_units,
    registered,
    serving_visibility,
    unit,
)

pytestmark = pytest.mark.integration

USER = "alice"
#: Our own ClusterRole for edit: what aggregation would add to the built-in ``edit``.
INTEGRATION_ROLE = "koord-queue-user-edit"


@dataclass(frozen=True)
class Tenancy:
    """alice's namespace ``mine`` and another one, ``theirs``, whose units wait in one ``queue``.

    In the queue: ``theirs/theirs`` (priority 10) at position 1, ``mine/mine`` (priority 1) at 2;
    ``mine/holder`` is admitted and fills the quota.
    """

    cluster: LocalCluster
    mine: str
    theirs: str
    queue: str

    def as_user(self, *args: str, input_text: str | None = None) -> subprocess.CompletedProcess[str]:
        """kubectl as alice (the admin kubeconfig impersonating her)."""
        return kube.kubectl(self.cluster, f"--as={USER}", *args, input_text=input_text, check=False)

    def raw(self, path: str, *, admin: bool = False) -> subprocess.CompletedProcess[str]:
        """``kubectl get --raw`` of a visibility path, as alice unless ``admin``."""
        args = ("get", "--raw", f"/apis/{GROUP_VERSION}{path}")
        return kube.kubectl(self.cluster, *args, check=False) if admin else self.as_user(*args)

    async def request_as_user(
        self, method: str, path: str, body: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        """One API request as alice: for calls kubectl cannot make alone (it reads a status before
        patching it, which alice may not, so its refusal would not be the write's)."""
        headers = {"Impersonate-User": USER, "Content-Type": "application/merge-patch+json"}
        if method == "PUT":
            headers["Content-Type"] = "application/json"
        async with (
            aiohttp.ClientSession() as session,
            session.request(
                method,
                self.cluster.server + path,
                data=json.dumps(body),
                headers=headers,
                ssl=self.cluster.ssl_context(),
                timeout=aiohttp.ClientTimeout(10),
            ) as resp,
        ):
            return resp.status, json.loads(await resp.read())

    async def until_allowed(self, *args: str) -> str:
        """alice's kubectl output once it succeeds: RBAC takes effect when the apiserver's
        authorizer cache has seen the binding."""

        async def attempt() -> str | None:
            result = self.as_user(*args)
            return result.stdout if result.returncode == 0 else None

        return await kube.eventually(attempt, what=f"kubectl --as={USER} {' '.join(args)}")


def rolebinding(namespace: str, role: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": f"{USER}-{role}", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
    }


@contextlib.asynccontextmanager
async def tenancy(
    cluster: LocalCluster, namespace: str, visibility: Visibility, *, role: str
) -> AsyncIterator[Tenancy]:
    """Set up :class:`Tenancy` in ``namespace`` (alice's, bound to ``role`` there) and a second one."""
    other, queue = f"{namespace}-theirs", f"tenant-{namespace}"
    await make_waiting_units(cluster, namespace, queue, {"mine": 1})
    async with kube.client(cluster) as api:
        await kube.create_namespace(api, other)
        try:
            await kube.custom(api).create_namespaced_custom_object(
                names.GROUP, names.VERSION, other, "queueunits", unit("theirs", queue, 10)
            )

            async def both_waiting() -> bool:
                status, body = await visibility.get(f"/queues/{queue}/queueunits", user="admin")
                items = body.get("items", [])
                # Listed once queued; the reason (asserted on below) only once a cycle tried it.
                reasons = all(i.get("message") for i in items)
                return status == 200 and len(items) == 2 and reasons

            await kube.eventually(both_waiting, what=f"two units waiting in {queue} with a reason")
            kube.kubectl(cluster, "apply", "-f", "-", input_text=json.dumps(rolebinding(namespace, role)))
            yield Tenancy(cluster=cluster, mine=namespace, theirs=other, queue=queue)
        finally:
            await kube.delete_namespace(api, other)


def refused(result: subprocess.CompletedProcess[str], verb: str, resource: str) -> bool:
    """Forbidden by RBAC for exactly this verb and resource (not refused for another reason)."""
    return (
        result.returncode != 0
        and "(Forbidden)" in result.stderr
        and f'cannot {verb} resource "{resource}"' in result.stderr
    )


async def assert_reads_but_never_writes(t: Tenancy) -> None:
    """alice lists units and quotas in her namespace only, and no write of a unit gets through."""
    listed = await t.until_allowed("get", "queueunit", "-n", t.mine, "-o", "name")
    assert sorted(listed.split()) == [
        "queueunit.scheduling.x-k8s.io/holder",
        "queueunit.scheduling.x-k8s.io/mine",
    ]
    quotas = t.as_user("get", "elasticquota", "-n", t.mine, "-o", "name")
    assert quotas.returncode == 0, quotas.stderr
    assert quotas.stdout.split() == [f"elasticquota.scheduling.sigs.k8s.io/{t.queue}"]
    assert refused(t.as_user("get", "queueunit", "-n", t.theirs), "list", "queueunits")
    assert refused(t.as_user("get", "queueunit", "-A"), "list", "queueunits")

    create = t.as_user(
        "create", "-n", t.mine, "-f", "-", input_text=json.dumps(unit("sneaky", t.queue, 1000))
    )
    assert refused(create, "create", "queueunits")
    spec = json.dumps({"spec": {"priority": 1000}})
    patch = ("patch", "queueunit", "mine", "-n", t.mine, "--type=merge")
    assert refused(t.as_user(*patch, "-p", spec), "patch", "queueunits")
    status = {"status": {"phase": "Running", "admissions": [{"name": "main", "replicas": 1}]}}
    path = f"/apis/{names.API_VERSION}/namespaces/{t.mine}/queueunits/mine/status"
    for method, verb in (("PATCH", "patch"), ("PUT", "update")):
        code, answer = await t.request_as_user(method, path, status)
        assert (code, answer.get("reason")) == (403, "Forbidden"), (method, answer)
        assert f'cannot {verb} resource "queueunits/status"' in answer["message"], (method, answer)
    assert refused(t.as_user("delete", "queueunit", "mine", "-n", t.mine), "delete", "queueunits")
    # Quotas are the cluster admin's: she can neither raise her own quota's max nor make a
    # same-named (or any) quota in her namespace.
    raise_max = json.dumps({"spec": {"max": {"cpu": "1000"}}})
    quota_patch = ("patch", "elasticquota", t.queue, "-n", t.mine, "--type=merge", "-p", raise_max)
    assert refused(t.as_user(*quota_patch), "patch", "elasticquotas")
    twin = {
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
        "kind": "ElasticQuota",
        "metadata": {"name": t.queue, "namespace": t.mine},
        "spec": {"max": {"cpu": "1000"}, "min": {"cpu": "1000"}},
    }
    twin_create = t.as_user("create", "-n", t.mine, "-f", "-", input_text=json.dumps(twin))
    assert refused(twin_create, "create", "elasticquotas")


async def assert_sees_only_their_namespace(t: Tenancy) -> None:
    """Through the aggregation layer: alice's namespace on the namespaced paths, nothing else."""
    out = await t.until_allowed("get", "--raw", f"/apis/{GROUP_VERSION}/namespaces/{t.mine}/queueunits")
    body = json.loads(out)
    assert body["kind"] == "QueueUnitsSummary"
    seen = [
        (i["metadata"]["namespace"], i["metadata"]["name"], i["queueName"], i["position"])
        for i in body["items"]
    ]
    assert seen == [(t.mine, "mine", t.queue, 2)]
    assert body["items"][0]["message"].startswith(f"limited quotaName:{t.queue}"), body
    result = t.raw(f"/namespaces/{t.mine}/queues/{t.queue}/queueunits")
    assert result.returncode == 0, result.stderr
    in_queue = json.loads(result.stdout)
    assert [(i["metadata"]["name"], i["position"]) for i in in_queue["items"]] == [("mine", 2)]
    assert in_queue["metadata"]["total"] == 1

    assert refused(t.raw(f"/namespaces/{t.theirs}/queueunits"), "list", "queueunits")
    assert refused(t.raw(f"/namespaces/{t.theirs}/queues/{t.queue}/queueunits"), "get", "queues/queueunits")
    assert refused(t.raw(f"/queues/{t.queue}/queueunits"), "get", "queues/queueunits")
    assert refused(t.raw(f"/elasticquotas/{t.queue}/queueunits"), "get", "elasticquotas/queueunits")

    # The admin's cluster-wide view still shows every namespace.
    admin = t.raw(f"/queues/{t.queue}/queueunits", admin=True)
    assert admin.returncode == 0, admin.stderr
    assert [(i["metadata"]["namespace"], i["position"]) for i in json.loads(admin.stdout)["items"]] == [
        (t.theirs, 1),
        (t.mine, 2),
    ]
    # The visibility group's namespaced ``queueunits`` does not shadow ours for kubectl: the CRD's
    # group has the higher priority.
    plural = t.as_user("get", "queueunits", "-n", t.mine, "-o", "name")
    assert plural.returncode == 0 and "queueunit.scheduling.x-k8s.io/mine" in plural.stdout.split(), plural


@pytest.fixture
async def visibility(integration_cluster: LocalCluster, system_integration: system.Processes) -> Visibility:
    return await serving_visibility(integration_cluster, system_integration)


async def test_a_namespace_user_reads_queueunits_and_quotas_of_their_namespace_but_never_writes_a_unit(
    integration_cluster: LocalCluster, visibility: Visibility, namespace_in: str
) -> None:
    async with tenancy(integration_cluster, namespace_in, visibility, role=INTEGRATION_ROLE) as t:
        await assert_reads_but_never_writes(t)


async def test_a_namespace_user_sees_only_their_namespace_through_the_visibility_api(
    integration_cluster: LocalCluster, visibility: Visibility, namespace_in: str
) -> None:
    async with tenancy(integration_cluster, namespace_in, visibility, role=INTEGRATION_ROLE) as t:
        with registered(integration_cluster, port=visibility.port):
            await available(integration_cluster)
            await assert_sees_only_their_namespace(t)
