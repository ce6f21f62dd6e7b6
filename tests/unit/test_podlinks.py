"""Which pods count for a unit (``shared.jobs.podlinks``): same namespace, owned by the unit's job."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from shared.jobs import podlinks

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


CLUSTER = obj("rc", ("RayJob", "train", JOB_UID), uid="rc-uid")
DRIVER = obj("driver", ("SparkApplication", "spark", JOB_UID), uid="driver-uid")
STRANGER = obj("other-rc", ("RayJob", "other", "other-uid"), uid="other-rc-uid")
#: A JobSet's child Job (an MPIJob's launcher Job is linked the same way), and a Job of someone else.
CHILD_JOB = obj("train-workers-0", ("JobSet", "train", JOB_UID), uid="child-uid")
OTHER_JOB = obj("plain", uid="plain-uid")
PARENTS: dict[tuple[str, str], Mapping[str, Any]] = {
    ("RayCluster", "rc"): CLUSTER,
    ("Pod", "driver"): DRIVER,
    ("RayCluster", "other-rc"): STRANGER,
    ("Job", "train-workers-0"): CHILD_JOB,
    ("Job", "plain"): OTHER_JOB,
}


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
        (obj("p", ("ConfigMap", "mine", "cm-uid"), ("RayCluster", "new-rc", "x")), False),
    ],
)
def test_a_pod_has_left_its_job_only_when_that_is_certain(pod: dict[str, Any], left: bool) -> None:
    assert podlinks.left_job(pod, JOB_UID, lookup) is left


def test_nothing_leaves_a_job_without_a_uid() -> None:
    assert not podlinks.left_job(obj("p"), "", lookup)
