"""Which pods count for a unit (``shared.jobs.podlinks``): same namespace, owned by the unit's job."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from koord_queue.shared.jobs import podlinks

JOB_UID = "job-uid"


def obj(name: str, *owners: tuple[str, str, str], namespace: str = "ns", uid: str = "") -> dict[str, Any]:
    refs = [{"apiVersion": "v1", "kind": k, "name": n, "uid": u, "controller": True} for k, n, u in owners]
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{name}",
            "ownerReferences": refs,
        }
    }


def plain(pod: dict[str, Any], *owner: str) -> dict[str, Any]:
    """``pod`` with one more owner reference that is not its controller (anyone may write one)."""
    kind, name, uid = owner
    pod["metadata"]["ownerReferences"].append({"apiVersion": "v1", "kind": kind, "name": name, "uid": uid})
    return pod


CLUSTER = obj("rc", ("RayJob", "train", JOB_UID), uid="rc-uid")
DRIVER = obj("driver", ("SparkApplication", "spark", JOB_UID), uid="driver-uid")
STRANGER = obj("other-rc", ("RayJob", "other", "other-uid"), uid="other-rc-uid")
#: A JobSet's child Job (an MPIJob's launcher Job is linked the same way), and a Job of someone else.
CHILD_JOB = obj("train-workers-0", ("JobSet", "train", JOB_UID), uid="child-uid")
OTHER_JOB = obj("plain", uid="plain-uid")
#: A RayCluster that merely lists the job among its owners (its author wrote that reference).
LOOSE_CLUSTER = plain(obj("loose-rc", uid="loose-rc-uid"), "RayJob", "train", JOB_UID)
PARENTS: dict[tuple[str, str], Mapping[str, Any]] = {
    ("RayCluster", "rc"): CLUSTER,
    ("Pod", "driver"): DRIVER,
    ("RayCluster", "other-rc"): STRANGER,
    ("Job", "train-workers-0"): CHILD_JOB,
    ("Job", "plain"): OTHER_JOB,
    ("RayCluster", "loose-rc"): LOOSE_CLUSTER,
}


def test_why_a_pod_is_not_proven_the_jobs_is_said() -> None:
    def why(pod: dict[str, Any]) -> str | None:
        return podlinks.ownership_problem(pod, JOB_UID, lookup)

    assert why(obj("p", ("Job", "train", JOB_UID))) is None
    assert why(plain(obj("p"), "Job", "train", JOB_UID)) == "it has no controller reference"
    assert why(obj("p", ("ConfigMap", "mine", "u"))) == "its controller ConfigMap mine is not its job"
    assert why(obj("p", ("RayCluster", "nope", "u"))) == "its controller RayCluster nope is not known (yet)"
    assert why(obj("p", ("RayCluster", "loose-rc", "loose-rc-uid"))) == (
        "its controller RayCluster loose-rc is not controlled by its job"
    )


def lookup(kind: str, name: str) -> Mapping[str, Any] | None:
    return PARENTS.get((kind, name))


@pytest.mark.parametrize(
    ("pod", "counts"),
    [
        (obj("p", ("Job", "train", JOB_UID)), True),  # owned directly
        (obj("p", ("RayCluster", "rc", "rc-uid")), True),  # through the job's RayCluster
        (obj("p", ("Pod", "driver", "driver-uid")), True),  # a Spark executor through its driver
        (obj("p", ("Job", "train-workers-0", "child-uid")), True),  # through the job's child Job
        (obj("p", ("Job", "train-workers-0", "forged")), False),  # the child Job's name, another UID
        (obj("p", ("Job", "plain", "plain-uid")), False),  # a Job the job does not own
        (obj("p"), False),  # a bare pod naming the unit
        (obj("p", ("Job", "train", "forged")), False),  # the job's name with another UID
        (obj("p", ("RayCluster", "rc", "forged")), False),  # a parent reference with a wrong UID
        (obj("p", ("RayCluster", "other-rc", "other-rc-uid")), False),  # another job's cluster
        (obj("p", ("Job", "train", JOB_UID), namespace="elsewhere"), False),  # another namespace
        # Only the controller reference proves anything: a plain one carrying the job's UID is
        # what a namespace user can write on a pod of their own (docs/compatibility.md#pod-gating).
        (plain(obj("p"), "Job", "train", JOB_UID), False),
        (plain(obj("p", ("ConfigMap", "mine", "cm-uid")), "Job", "train", JOB_UID), False),
        # An intermediate proves the link only when the job is *its* controller too.
        (obj("p", ("RayCluster", "loose-rc", "loose-rc-uid")), False),
    ],
)
def test_a_pod_counts_only_in_the_units_namespace_and_owned_by_its_job(
    pod: dict[str, Any], counts: bool
) -> None:
    assert podlinks.counts_for(pod, unit_namespace="ns", job_uid=JOB_UID, parent=lookup) is counts


def test_a_job_without_a_uid_owns_nothing() -> None:
    pod = obj("p", ("Job", "train", ""))
    assert not podlinks.owned_by(pod, "", lookup)


@pytest.mark.parametrize(
    ("pod", "left"),
    [
        (obj("p", ("Job", "train", JOB_UID)), False),  # its job's own pod
        (obj("p", ("RayCluster", "rc", "rc-uid")), False),  # the job's own, through its RayCluster
        (obj("p"), True),  # no owner: what a controller leaves when it lets go of a pod
        (obj("p", ("ConfigMap", "mine", "cm-uid")), True),  # given to an object that is no job's
        (obj("p", ("Job", "plain", "plain-uid")), True),  # given to another Job we know
        (obj("p", ("RayCluster", "other-rc", "other-rc-uid")), True),  # another job's cluster
        # Owners that could stand between the job and the pod but are not known yet: open.
        (obj("p", ("RayCluster", "new-rc", "new-rc-uid")), False),
        (obj("p", ("Job", "new-child", "new-child-uid")), False),
        (obj("p", ("Pod", "new-driver", "new-driver-uid")), False),
        (plain(obj("p", ("RayCluster", "new-rc", "x")), "ConfigMap", "mine", "cm-uid"), False),
        # A plain reference to the job is no proof: the pod has left (or never was in) the job.
        (plain(obj("p"), "Job", "train", JOB_UID), True),
    ],
)
def test_a_pod_has_left_its_job_only_when_that_is_certain(pod: dict[str, Any], left: bool) -> None:
    assert podlinks.left_job(pod, JOB_UID, lookup) is left


def test_nothing_leaves_a_job_without_a_uid() -> None:
    assert not podlinks.left_job(obj("p"), "", lookup)
