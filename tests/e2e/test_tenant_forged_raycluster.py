"""A RayCluster that claims a RayJob it does not have never runs a pod unadmitted, against a real
KubeRay (docs/compatibility.md#raycluster, docs/architecture.md#trust-boundaries).

The ``raycluster`` extension is on here (it is off by default), so a labelled RayCluster is queued
unless its controller is a RayJob (or RayService): the RayJob's unit accounts for the cluster
KubeRay makes for it. alice, bound in her namespace to the built-in ``edit`` role
(``tests/tenancy.py``), writes that claim herself on CREATE:

* a controller owner reference to a RayJob that does not exist (the garbage collector deletes such a
  cluster soon: its pods must be gated until then);
* the same claim in a version of ``ray.io`` this cluster does not serve, which the garbage
  collector cannot look up, so the cluster stays: the reconciler resolves the claim, finds it
  false and queues the cluster as its own;
* only KubeRay's origin labels (``ray.io/originated-from-crd: RayJob``), which claim nothing: the
  webhook holds that cluster like any labelled one.

Her quota (1 CPU) is smaller than any of these clusters (2 CPU), so a queued one is never admitted.
The record of every version of her RayClusters and pods (``tests.kube.Recorder``) shows each cluster
stored with every template gated in its first version, each pod KubeRay made from them gated and
unbound in its first version, and no pod of theirs ever bound. And a real RayJob's cluster, whose
claim is genuine, is left to its RayJob (no unit of its own) and runs under the RayJob's admission.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from koord_queue.shared import kube as kq
from koord_queue.shared.api import names
from koord_queue.shared.jobs import registry
from testenv import binaries, operators, system
from testenv.cluster import LocalCluster
from tests import kube, tenancy
from tests.e2e.test_operators import (
    PRIORITY_CLASSES,
    RAY,
    RAY_IMAGE,
    RAYCLUSTERS,
    STEP_S,
    apply,
    get,
    new_namespace,
    pod_template,
    quota,
    rayjob,
    wait_running,
)

pytestmark = pytest.mark.e2e

Obj = dict[str, Any]
ALICE = tenancy.ALICE
GATE = {"name": names.ADMISSION_GATE}
MISSING_UID = "00000000-0000-4000-8000-000000000000"
EXTENSIONS = f"--enabled-extensions={','.join((*registry.DEFAULT_EXTENSIONS, 'raycluster'))}"


@pytest.fixture(scope="module")
def raycluster_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """KubeRay, and our webhook and reconciler with the ``raycluster`` extension on."""
    kuberay = binaries.operator("kuberay")
    cluster = LocalCluster(profile="e2e", workdir=tmp_path_factory.mktemp("raycluster-cp"), nodes=2)
    cluster.start()
    logdir = tmp_path_factory.mktemp("raycluster-system")
    processes = system.Processes()
    try:
        system.install_crds(cluster)
        operators.install_crds(cluster, kuberay)  # before the reconciler starts watching the kinds
        webhook, port = system.start_webhook(cluster, logdir=logdir, extra_args=[EXTENSIONS])
        processes.components.append(webhook)
        processes.webhook_port = port
        system.install_policies(cluster)
        processes.components.append(
            system.start_reconciler(cluster, logdir=logdir, extra_args=[*system.VISIBILITY_ARGS, EXTENSIONS])
        )
        processes.components.append(operators.start(cluster, kuberay, logdir=logdir))
        kube.kubectl(cluster, "apply", "-f", "-", input_text=json.dumps(PRIORITY_CLASSES))
        yield cluster
    except BaseException:
        print(cluster.logs())
        raise
    finally:
        processes.stop()
        for name in ("webhook", "reconciler", kuberay.name):
            log = logdir / f"{name}.log"
            if log.exists():
                print(
                    f"--- {name} (tail) ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-60:])
                )
        cluster.stop()


def raycluster(name: str, quota_name: str, *, owner: Obj | None = None, origin: bool = False) -> Obj:
    """alice's RayCluster: a head and one worker of 1 CPU each, labelled with ``quota_name``."""
    labels = {names.QUOTA_NAME_LABEL: quota_name}
    if origin:
        labels |= {"ray.io/originated-from-crd": "RayJob", "ray.io/originated-from-cr-name": "ghost"}
    meta: Obj = {"name": name, "labels": labels}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    head = pod_template("ray-head", RAY_IMAGE, cpu="1", priority="low", node_selector=None)
    worker = pod_template("ray-worker", RAY_IMAGE, cpu="1", priority="low", node_selector=None)
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": meta,
        "spec": {
            "headGroupSpec": {"rayStartParams": {}, "template": head},
            "workerGroupSpecs": [
                {
                    "groupName": "small",
                    "replicas": 1,
                    "minReplicas": 1,
                    "maxReplicas": 1,
                    "rayStartParams": {},
                    "template": worker,
                }
            ],
        },
    }


def forged_owner(name: str, api_version: str = "ray.io/v1") -> Obj:
    return {"apiVersion": api_version, "kind": "RayJob", "name": name, "uid": MISSING_UID, "controller": True}


def templates(cluster: Obj) -> list[Obj]:
    spec = cluster["spec"]
    return [spec["headGroupSpec"]["template"], *(g["template"] for g in spec["workerGroupSpecs"])]


def gated(obj: Obj) -> bool:
    return GATE in (obj["spec"].get("schedulingGates") or [])


async def test_a_raycluster_claiming_a_rayjob_it_does_not_have_runs_no_pod_and_is_queued(
    raycluster_plane: LocalCluster,
) -> None:
    cluster = raycluster_plane
    ns = new_namespace(cluster, "forged-rc")
    tenancy.grant(cluster, ns, ALICE)
    apply(cluster, quota("forged-rc", ns, cpu="1"))
    collected, unresolvable, labelled = "ghost-owner", "unserved-owner", "origin-label"
    bodies = {
        collected: raycluster(collected, "forged-rc", owner=forged_owner("ghost")),
        # The garbage collector cannot map this version, so it leaves the cluster to the reconciler.
        unresolvable: raycluster(unresolvable, "forged-rc", owner=forged_owner("ghost", "ray.io/v0")),
        labelled: raycluster(labelled, "forged-rc", origin=True),
    }
    try:
        async with (
            kube.Recorder(cluster, RAYCLUSTERS, namespace=ns) as clusters_seen,
            kube.Recorder(cluster, kq.PODS, namespace=ns) as pods_seen,
        ):
            for body in bodies.values():
                await tenancy.create_as(cluster, ns, body)
            for name in (unresolvable, labelled):

                def queued(obj: Obj, name: str = name) -> bool:
                    return (obj.get("spec") or {}).get("suspend") is True

                await clusters_seen.until(name, queued)

                async def own_unit(name: str = name) -> bool:
                    found = get(cluster, "queueunit", f"{name}-raycluster-qu", "-n", ns)
                    return found is not None

                await kube.eventually(own_unit, timeout=STEP_S, what=f"{name} queued under a unit of its own")
            unit = get(cluster, "queueunit", f"{unresolvable}-raycluster-qu", "-n", ns) or {}
            [owner] = unit["metadata"]["ownerReferences"]
            [stored] = [o for o in clusters_seen.objects if o["metadata"]["name"] == unresolvable][-1:]
            assert owner["uid"] == stored["metadata"]["uid"], (owner, stored["metadata"])
        # Leaving the block synced both records: they hold every version up to now.
        for name in bodies:
            versions = clusters_seen.versions(name)
            assert versions, f"{name} was never stored"
            first = versions[0]
            assert all(gated(t) for t in templates(first)), (name, first["spec"])
            if name != labelled:  # a claim is not held at the door (a real child would deadlock)
                assert first["spec"].get("suspend") is not True, (name, first["spec"])
        by_pod: dict[str, list[Obj]] = {}
        for pod in pods_seen.objects:
            if (pod["metadata"].get("labels") or {}).get("ray.io/cluster") in bodies:
                by_pod.setdefault(pod["metadata"]["uid"], []).append(pod)
        for versions in by_pod.values():
            first = versions[0]
            assert gated(first) and not first["spec"].get("nodeName"), (
                first["metadata"]["name"],
                first["spec"],
            )
            bound = [v["metadata"]["name"] for v in versions if v["spec"].get("nodeName")]
            assert not bound, f"bound without an admission: {bound}"
    finally:
        kube.kubectl(cluster, "delete", "rayclusters", "--all", "-n", ns, "--wait=false")


async def test_a_rayjobs_own_cluster_is_left_to_its_rayjob_and_runs_under_its_admission(
    raycluster_plane: LocalCluster,
) -> None:
    """The genuine claim: KubeRay's cluster for alice's RayJob copies its gated templates, is never
    held and gets no unit; its pods run under the RayJob's admission."""
    cluster = raycluster_plane
    ns = new_namespace(cluster, "real-rc")
    tenancy.grant(cluster, ns, ALICE)
    apply(cluster, quota("real-rc", ns, cpu="2"))
    try:
        await tenancy.create_as(cluster, ns, rayjob("genuine", ns, "real-rc", cpu="500m"))
        await wait_running(cluster, ns, RAY, "genuine")
        [made] = [c for c in (get(cluster, "rayclusters", "-n", ns) or {}).get("items") or []]
        assert made["spec"].get("suspend") is not True, made["spec"]
        assert get(cluster, "queueunit", f"{made['metadata']['name']}-raycluster-qu", "-n", ns) is None
    finally:
        kube.kubectl(cluster, "delete", "rayjobs,rayclusters", "--all", "-n", ns, "--wait=false")
