"""Pods released for a unit admitted to a pool get the pool's placement in the write that removes
their gate (docs/pools.md#placement): the write itself (``reconciler.job_pods.ungate``), what the pod
informer keeps for it (``podplan.slim_pod``), and the job extensions' pass through a fake client:
the placement comes from ``pools``, a contradicting pod stays gated with a Warning on the job, an
unknown pool releases nothing, and ``pools_changed`` looks at the jobs of a pool again.
"""

from __future__ import annotations

from typing import Any

from koord_queue.reconciler import job_pods
from koord_queue.reconciler.job_units import JobKey
from koord_queue.reconciler.jobs import JobExtensions
from koord_queue.shared import kube
from koord_queue.shared.api import names
from koord_queue.shared.api.placement import PoolPlacement, Requirement
from koord_queue.shared.jobs import jobext, jobpath, podplan, registry
from tests.unit.test_job_extensions_wiring import NOW, FakeClient, add_pod, pod, released_job

GPU = "nvidia.com/gpu.product"
AFFINITY = "requiredDuringSchedulingIgnoredDuringExecution"
TOLERATION = {"key": "pool", "operator": "Equal", "value": "h100", "effect": "NoSchedule"}
H100 = PoolPlacement(
    "h100",
    "h100-root",
    match_labels={GPU: "h100"},
    match_expressions=(Requirement("zone", "In", ("a",)),),
    tolerations=(TOLERATION,),
)
FIRST = JobKey("batch/v1", "Job", "ns", "first")
GATE_OPS = [
    {"op": "test", "path": "/spec/schedulingGates/0/name", "value": names.ADMISSION_GATE},
    {"op": "remove", "path": "/spec/schedulingGates/0"},
]
PLACED = [
    {"op": "test", "path": "/metadata/resourceVersion", "value": "4"},
    {"op": "add", "path": "/spec/nodeSelector", "value": {GPU: "h100"}},
    {
        "op": "add",
        "path": "/spec/affinity",
        "value": {
            "nodeAffinity": {
                AFFINITY: {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                    ]
                }
            }
        },
    },
    {"op": "add", "path": "/spec/tolerations", "value": [TOLERATION]},
]


class Events:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, str, str]] = []

    def record(self, obj: kube.Obj, *, type_: str, reason: str, message: str) -> None:
        self.recorded.append((type_, reason, message))


class Answering(FakeClient):
    """Answers a pod patch with the pod at the next version, or with ``fail`` when it is set."""

    def __init__(self, fail: kube.KubeError | None = None) -> None:
        super().__init__()
        self.fail = fail

    async def patch(self, res: kube.Resource, name: str, patch: Any, **kwargs: Any) -> kube.Obj:
        await super().patch(res, name, patch, **kwargs)
        if self.fail is not None:
            raise self.fail
        return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": "5"}, "spec": {}}


def gated(name: str = "first-a", **spec: Any) -> kube.Obj:
    """A gated pod of ``released_job``'s pod set, owned by it, at resourceVersion 4."""
    obj = pod(name, bound=False, gated=True)
    meta = obj["metadata"]
    meta["resourceVersion"] = "4"
    meta["annotations"][names.RELATED_PODSET_ANNOTATION] = "first"
    meta["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "first", "uid": "u-1", "controller": True}
    ]
    del obj["spec"]["nodeName"]
    obj["spec"].update(containers=[{"name": "c", "resources": {"requests": {"cpu": "1"}}}], **spec)
    return obj


def view_of(obj: kube.Obj) -> podplan.PodView:
    return podplan.pod_view(obj, "first")


# --- the write ------------------------------------------------------------------------------------------


async def test_one_write_places_the_pod_and_removes_its_gate_conditional_on_the_version_read() -> None:
    client, obj = Answering(), gated()
    store = {"ns/first-a": obj}
    assert await job_pods.ungate(client, store, view_of(obj), H100) is None  # type: ignore[arg-type]
    [(name, ops, _)] = client.patches
    assert name == "first-a" and ops == [*PLACED, *GATE_OPS]
    assert store["ns/first-a"]["metadata"]["resourceVersion"] == "5"  # the write is assumed at once


async def test_a_pod_already_placed_or_without_a_pool_only_loses_its_gate() -> None:
    placed = gated(nodeSelector={GPU: "h100"})
    for obj, placement in ((placed, PoolPlacement("h100", match_labels={GPU: "h100"})), (gated(), None)):
        client = Answering()
        await job_pods.ungate(client, {"ns/first-a": obj}, view_of(obj), placement)  # type: ignore[arg-type]
        assert [ops for _, ops, _ in client.patches] == [GATE_OPS]


async def test_a_contradicting_pod_is_not_written_and_the_reason_is_answered() -> None:
    client, obj = Answering(), gated(nodeSelector={GPU: "l4"})
    why = await job_pods.ungate(client, {"ns/first-a": obj}, view_of(obj), H100)  # type: ignore[arg-type]
    assert why == f"the job's nodeSelector asks for {GPU}=l4, the pool has {GPU}=h100"
    assert client.patches == []


async def test_a_pod_changed_since_it_was_read_stays_gated_for_the_next_pass() -> None:
    obj = gated()
    store = {"ns/first-a": obj}
    client = Answering(fail=kube.Invalid(422, "Invalid", "the test operation failed"))
    assert await job_pods.ungate(client, store, view_of(obj), H100) is None  # type: ignore[arg-type]
    assert store["ns/first-a"] is obj  # nothing assumed


# --- what the pod informer keeps ------------------------------------------------------------------------


def test_a_gated_pod_keeps_its_placement_in_the_store_and_a_released_one_does_not() -> None:
    placement = {"nodeSelector": {"a": "1"}, "affinity": {"podAffinity": {}}, "tolerations": [TOLERATION]}
    kept = podplan.slim_pod(gated(**placement))["spec"]
    assert {k: kept[k] for k in placement} == placement
    released = gated(**placement)
    released["spec"]["schedulingGates"] = [{"name": "someone-elses"}]
    assert not set(placement) & set(podplan.slim_pod(released)["spec"])


# --- the job extensions' pass ---------------------------------------------------------------------------


def extensions(pool: str | None, known: dict[str, PoolPlacement]) -> tuple[JobExtensions, Answering, Events]:
    """The job extensions with ``released_job`` admitted for 2 pods to ``pool``."""
    job = released_job()
    unit = jobext.build_queue_unit(job, registry.by_extension("job"), {})
    unit["metadata"].update(resourceVersion="5", creationTimestamp=NOW)
    unit["status"] = {"phase": "Dequeued", "admissions": [{"name": "first", "replicas": 2, "running": 0}]}
    if pool is not None:
        unit["status"]["pool"] = pool
    client, events = Answering(), Events()
    jobs = JobExtensions(
        client,  # type: ignore[arg-type]
        adapters=registry.enabled_adapters(("job",)),
        units=lambda: {"ns/first": unit},
        priority_classes=dict,
        events=events,  # type: ignore[arg-type]
        pools=known.get,
    )
    jobs.job_informers[("batch/v1", "Job")].objects["ns/first"] = job
    return jobs, client, events


def pod_writes(client: Answering) -> dict[str, Any]:
    return {name: ops for name, ops, sub in client.patches if sub == "" and isinstance(ops, list)}


async def test_pods_of_a_unit_admitted_to_a_pool_are_released_with_its_placement() -> None:
    jobs, client, events = extensions("h100", {"h100": H100})
    add_pod(jobs, gated("first-a"))
    add_pod(jobs, gated("first-b", nodeSelector={GPU: "l4"}))
    await jobs.reconcile(FIRST)
    assert pod_writes(client) == {"first-a": [*PLACED, *GATE_OPS]}
    assert events.recorded == [
        (
            "Warning",
            job_pods.POOL_PLACEMENT_CONFLICT,
            f"pod first-b stays gated: it cannot run on pool h100: the job's nodeSelector asks for "
            f"{GPU}=l4, the pool has {GPU}=h100",
        )
    ]


async def test_pods_of_a_unit_without_a_pool_are_released_as_before() -> None:
    jobs, client, _ = extensions(None, {"h100": H100})
    add_pod(jobs, gated("first-a", nodeSelector={GPU: "l4"}))
    await jobs.reconcile(FIRST)
    assert pod_writes(client) == {"first-a": GATE_OPS}


async def test_an_unknown_pool_releases_nothing_until_it_is_known() -> None:
    known: dict[str, PoolPlacement] = {}
    jobs, client, events = extensions("h100", known)
    add_pod(jobs, gated("first-a"))
    await jobs.reconcile(FIRST)
    assert pod_writes(client) == {}
    [(type_, reason, message)] = events.recorded
    assert (type_, reason) == ("Warning", jobpath.POOL_UNKNOWN)
    assert message == "1 pod(s) stay gated: the unit was admitted to pool h100, which is not known"

    jobs._dirty.clear()
    jobs._urgent.clear()
    jobs.pools_changed(["a100"])
    assert not jobs._dirty and not jobs._urgent
    known["h100"] = H100
    jobs.pools_changed(["a100", "h100"])
    assert FIRST in {**jobs._dirty, **jobs._urgent}  # an admitted unit's job is urgent
    await jobs.reconcile(FIRST)
    assert pod_writes(client) == {"first-a": [*PLACED, *GATE_OPS]}
