"""A RayJob's pod sets follow its live RayCluster
(docs/compatibility.md#s27-rayjob-follows-its-live-raycluster): which cluster is the job's, which RayJob
a cluster belongs to, and how its replicas raise the unit's pod set counts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koord_queue.shared.api import names
from koord_queue.shared.jobs import jobext, ray, registry

RAYJOB = registry.by_extension("rayjob")


def template(cpu: str = "1") -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": cpu}}}]}}


def cluster_spec(workers: Mapping[str, int | None]) -> dict[str, Any]:
    groups = []
    for name, replicas in workers.items():
        group: dict[str, Any] = {"groupName": name, "template": template()}
        if replicas is not None:
            group["replicas"] = replicas
        groups.append(group)
    return {"headGroupSpec": {"template": template()}, "workerGroupSpecs": groups}


def rayjob(workers: Mapping[str, int | None] | None = None, *, cluster: str | None = None) -> dict[str, Any]:
    job: dict[str, Any] = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {
            "name": "auto",
            "namespace": "ns",
            "uid": "job-uid",
            "labels": {names.QUOTA_NAME_LABEL: "q"},
        },
        # Submitted over HTTP, so the pod sets are the cluster's alone; the submitter pod set of the
        # default mode is tested in test_claimed_parent_gate.py (docs/compatibility.md#rayjob).
        "spec": {"rayClusterSpec": cluster_spec(workers or {}), "submissionMode": "HTTPMode"},
    }
    if cluster is not None:
        job["status"] = {"rayClusterName": cluster}
    return job


def raycluster(
    name: str = "auto-raycluster-x7k2p",
    workers: Mapping[str, int | None] | None = None,
    *,
    owner: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "labels": labels or {}}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": meta,
        "spec": cluster_spec(workers or {}),
    }


OWNED = {"apiVersion": "ray.io/v1", "kind": "RayJob", "name": "auto", "uid": "job-uid", "controller": True}


def counts(spec: dict[str, Any]) -> list[tuple[str, int]]:
    return [(p["name"], p["count"]) for p in spec["podSet"]]


# --- which cluster, which job ---------------------------------------------------------------------


def test_the_live_cluster_is_the_one_the_rayjob_names_in_its_status() -> None:
    cluster = raycluster(owner=OWNED, workers={"worker": 2})
    store = {"ns/auto-raycluster-x7k2p": cluster}
    assert ray.live_cluster(rayjob({"worker": 0}, cluster="auto-raycluster-x7k2p"), store) is cluster
    assert ray.live_cluster(rayjob({"worker": 0}), store) is None  # KubeRay has not created one yet
    assert ray.live_cluster(rayjob({"worker": 0}, cluster="other"), store) is None  # not (yet) watched


@pytest.mark.parametrize(
    ("owner", "mine"),
    [
        (None, True),
        (OWNED, True),
        ({**OWNED, "uid": ""}, True),
        ({**OWNED, "controller": False, "name": "someone-else"}, True),
        ({**OWNED, "uid": "another-incarnation"}, False),
        ({**OWNED, "name": "someone-else"}, False),
        ({**OWNED, "kind": "RayService"}, False),
    ],
)
def test_a_cluster_controlled_by_another_object_is_not_the_jobs(
    owner: dict[str, Any] | None, mine: bool
) -> None:
    cluster = raycluster(owner=owner, workers={"worker": 2})
    found = ray.live_cluster(rayjob(cluster="auto-raycluster-x7k2p"), {"ns/auto-raycluster-x7k2p": cluster})
    assert (found is cluster) is mine


def test_a_cluster_leads_back_to_its_rayjob_by_owner_else_by_kuberays_labels() -> None:
    assert ray.parent_job(raycluster(owner=OWNED)) == "auto"
    origin = {"ray.io/originated-from-crd": "RayJob", "ray.io/originated-from-cr-name": "auto"}
    assert ray.parent_job(raycluster(labels=origin)) == "auto"
    assert ray.parent_job(raycluster(labels={**origin, "ray.io/originated-from-crd": "RayService"})) is None
    assert ray.parent_job(raycluster()) is None  # an interactive cluster of its own
    assert ray.parent_job(raycluster(owner={**OWNED, "controller": False})) is None


# --- counts ---------------------------------------------------------------------------------------


def test_s27_pod_sets_rise_to_the_live_clusters_replicas() -> None:
    """S27: RayJob worker replicas 0, RayCluster worker replicas 2 → head:1, worker:2."""
    job = rayjob({"worker": 0}, cluster="auto-raycluster-x7k2p")
    cluster = raycluster(owner=OWNED, workers={"worker": 2})
    assert counts(jobext.desired_spec(job, RAYJOB, {})) == [("head", 1), ("worker", 0)]
    spec = jobext.desired_spec(job, RAYJOB, {}, live_cluster=cluster)
    assert counts(spec) == [("head", 1), ("worker", 2)]
    assert spec["resource"] == spec["request"] == {"cpu": "3"}


def test_counts_never_fall_below_the_rayjobs_own_spec() -> None:
    job = rayjob({"small": 3, "big": 1}, cluster="c")
    cluster = raycluster("c", {"small": 1, "big": 5, "extra": 9}, owner=OWNED)
    assert counts(jobext.desired_spec(job, RAYJOB, {}, live_cluster=cluster)) == [
        ("head", 1),
        ("small", 3),
        ("big", 5),
    ]


def test_unreadable_live_replicas_raise_nothing() -> None:
    cluster = raycluster("c", {"a": None, "b": 2}, owner=OWNED)
    cluster["spec"]["workerGroupSpecs"].append({"groupName": "c", "replicas": "7"})
    cluster["spec"]["workerGroupSpecs"].append({"groupName": "d", "replicas": True})
    cluster["spec"]["workerGroupSpecs"].append("garbage")
    assert ray.cluster_replicas(cluster) == {"head": 1, "b": 2}


def test_an_adopted_rayjob_is_admitted_for_what_its_cluster_runs() -> None:
    job = rayjob({"worker": 0}, cluster="c")
    unit = jobext.build_queue_unit(job, RAYJOB, {}, live_cluster=raycluster("c", {"worker": 3}, owner=OWNED))
    assert counts(unit["spec"]) == [("head", 1), ("worker", 3)]


replicas = st.one_of(st.none(), st.integers(0, 20))


@given(
    spec=st.dictionaries(st.sampled_from(["a", "b", "c"]), replicas, min_size=1),
    live=st.dictionaries(st.sampled_from(["a", "b", "d", "A"]), replicas),
)
def test_following_a_cluster_is_max_of_spec_and_live(
    spec: dict[str, int | None], live: dict[str, int | None]
) -> None:
    job = rayjob(spec, cluster="c")
    pod_sets = RAYJOB.pod_sets(job)
    followed = ray.follow_cluster(pod_sets, raycluster("c", live))
    read = ray.cluster_replicas(raycluster("c", live))
    assert [p.name for p in followed] == [p.name for p in pod_sets]
    for before, after in zip(pod_sets, followed, strict=True):
        assert after.count == max(before.count, read.get(before.name, 0))
        assert after.per_pod == before.per_pod


@pytest.mark.parametrize(
    ("status", "cluster_alive", "seen"),
    [
        (ray.JobStatus.SUCCEEDED, True, ray.JobStatus.RUNNING),
        (ray.JobStatus.FAILED, True, ray.JobStatus.RUNNING),
        (ray.JobStatus.SUCCEEDED, False, ray.JobStatus.SUCCEEDED),
        (ray.JobStatus.RUNNING, True, ray.JobStatus.RUNNING),
        (ray.JobStatus.QUEUING, False, ray.JobStatus.QUEUING),
    ],
)
def test_a_finished_rayjob_holds_its_quota_while_its_cluster_lives(
    status: ray.JobStatus, cluster_alive: bool, seen: ray.JobStatus
) -> None:
    cluster = {"metadata": {"name": "rc"}} if cluster_alive else None
    assert ray.hold_while_cluster_lives(status, cluster) is seen
