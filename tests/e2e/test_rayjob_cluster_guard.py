"""A RayJob's RayCluster is guarded like its admitted RayJob, against a real KubeRay
(docs/compatibility.md#rayjob).

KubeRay creates the RayCluster of an admitted RayJob, controlled by the RayJob and carrying its
labels (the quota label too: checked here, as the webhook relies on it to be called on the
cluster's updates). The RayJob's unit charges the pods KubeRay makes from the cluster's templates,
so ``alice``, bound to the built-in ``edit`` role in her namespace (``tests/tenancy.py``), tries to
grow them through the cluster: larger worker requests, an added container, another runtime class,
the owner reference removed. Each is refused by the validating webhook with a message naming the
RayJob, the cluster's templates stay as KubeRay made them and the unit keeps what it was admitted
with. KubeRay's own writes to the cluster go on: the pods run and the RayCluster is ``ready``.

Only KubeRay runs here (``testenv/operators.py``), in a control plane of this module's own:
its CRDs replace the cut-down test CRDs of the Ray kinds.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from koord_queue.shared.api import names
from testenv import binaries, operators, system
from testenv.cluster import LocalCluster
from tests import kube, tenancy
from tests.e2e.test_operators import (
    PRIORITY_CLASSES,
    RAY,
    STEP_S,
    admitted,
    apply,
    items,
    new_namespace,
    quota,
    rayjob,
    unit,
    wait_running,
)

pytestmark = pytest.mark.e2e

Obj = dict[str, Any]
ALICE = tenancy.ALICE
WORKER = "/spec/workerGroupSpecs/0/template/spec"


@pytest.fixture(scope="module")
def ray_cluster_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    kuberay = binaries.operator("kuberay")
    cluster = LocalCluster(profile="e2e", workdir=tmp_path_factory.mktemp("kuberay-cp"), nodes=2)
    cluster.start()
    logdir = tmp_path_factory.mktemp("kuberay-system")
    processes = system.Processes()
    try:
        system.install_crds(cluster)
        operators.install_crds(cluster, kuberay)  # before the reconciler starts watching the kinds
        processes = system.start(cluster, logdir=logdir)
        processes.components.append(operators.start(cluster, kuberay, logdir=logdir))
        kube.kubectl(
            cluster, "apply", "-f", "-", input_text=json.dumps(PRIORITY_CLASSES)
        )  # the jobs' classes
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


def alice_patches(cluster: LocalCluster, ns: str, name: str, ops: list[Obj]) -> str:
    """alice's JSON patch of the RayCluster ``name``; the webhook's refusal (fails if accepted)."""
    done = tenancy.as_user(
        cluster, ALICE, "-n", ns, "patch", "raycluster", name, "--type=json", "-p", json.dumps(ops)
    )
    assert done.returncode != 0, f"accepted: {ops}"
    return str(done.stderr)


async def test_a_user_cannot_grow_a_rayjobs_cluster_past_its_admission(
    ray_cluster_plane: LocalCluster,
) -> None:
    cluster = ray_cluster_plane
    ns = new_namespace(cluster, "ray-guard")
    tenancy.grant(cluster, ns, ALICE)
    apply(cluster, quota("ray-guard", ns, cpu="1"))
    job = rayjob("guard", ns, "ray-guard", cpu="500m")
    created = tenancy.as_user(cluster, ALICE, "-n", ns, "create", "-f", "-", input_text=json.dumps(job))
    assert created.returncode == 0, created.stderr
    await wait_running(cluster, ns, RAY, "guard")
    [made] = items(cluster, "rayclusters", "-n", ns)
    name = made["metadata"]["name"]
    # What the guard relies on: KubeRay copies the RayJob's labels (the quota label carries the
    # cluster's updates to the webhook) and makes the RayJob its controller.
    assert made["metadata"]["labels"][names.QUOTA_NAME_LABEL] == "ray-guard", made["metadata"]
    [owner] = made["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner.get("controller")) == ("RayJob", "guard", True)

    said = "the RayCluster runs the pods of RayJob guard, which koord-queue queued and admitted"
    refused = alice_patches(
        cluster,
        ns,
        name,
        [{"op": "replace", "path": f"{WORKER}/containers/0/resources/requests/cpu", "value": "8"}],
    )
    assert said in refused and "resource requests of pod set(s) small cannot change" in refused, refused
    sidecar = {"name": "miner", "image": "busybox"}  # asks for nothing: a LimitRange would fill it in
    refused = alice_patches(
        cluster, ns, name, [{"op": "add", "path": f"{WORKER}/containers/-", "value": sidecar}]
    )
    assert said in refused and "containers (names)" in refused, refused
    refused = alice_patches(
        cluster, ns, name, [{"op": "add", "path": f"{WORKER}/runtimeClassName", "value": "kata"}]
    )
    assert said in refused and "runtimeClassName" in refused, refused
    refused = alice_patches(cluster, ns, name, [{"op": "remove", "path": "/metadata/ownerReferences"}])
    assert said in refused and "owner references" in refused, refused
    refused = alice_patches(
        cluster,
        ns,
        name,
        [{"op": "remove", "path": "/metadata/labels/" + names.QUOTA_NAME_LABEL.replace("/", "~1")}],
    )
    assert said in refused and "quota label" in refused, refused

    # Nothing got through; KubeRay's own writes went on (the cluster is ready, its pods run) and
    # the unit holds what it was admitted with.
    [now] = items(cluster, "rayclusters", "-n", ns)
    assert now["spec"]["workerGroupSpecs"][0]["template"] == made["spec"]["workerGroupSpecs"][0]["template"]

    async def ready() -> bool:
        [found] = items(cluster, "rayclusters", "-n", ns)
        return (found.get("status") or {}).get("state") == "ready"

    await kube.eventually(ready, timeout=STEP_S, what="KubeRay reporting the RayCluster ready")
    assert admitted(unit(cluster, ns, RAY, "guard")) == {"head": 1, "small": 1, "submitter": 1}
