"""The judge of the hostile tenant's forged RayJob submitter (``chaos/tenant_submitter.py``): a pod
of her Job seen ungated or bound in any version is a bypass, one gated throughout is not, and a
window that proves nothing says so (docs/compatibility.md#rayjob)."""

from __future__ import annotations

from typing import Any

from chaos import tenant_submitter as submitter
from koord_queue.shared.api import names

JOB_UID = "job-1"
GATE = {"name": names.ADMISSION_GATE}


def pod(
    *, rv: str = "5", gated: bool = True, node: str | None = None, owner: str = JOB_UID, name: str = "p-abcde"
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c"}]}
    if gated:
        spec["schedulingGates"] = [GATE]
    if node:
        spec["nodeName"] = node
    refs = [{"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": owner, "controller": True}]
    return {"metadata": {"name": name, "resourceVersion": rv, "ownerReferences": refs}, "spec": spec}


def judge(versions: list[dict[str, Any]], *, held: bool = True, event: bool = False) -> tuple[str, str]:
    return submitter.judge(versions, JOB_UID, unit_held=held, kept_gated_seen=event, seconds=18.0)


def test_a_pod_gated_in_every_version_is_neutralised_and_says_whether_the_event_was_seen() -> None:
    outcome, detail = judge([pod(rv="5"), pod(rv="6")], event=True)
    assert outcome == "neutralised"
    assert "1 pod(s)" in detail and "2 version(s)" in detail and "PodKeptGated named it" in detail
    outcome, detail = judge([pod()])
    assert outcome == "neutralised" and "no PodKeptGated event was seen" in detail


def test_one_version_ungated_or_bound_is_a_bypass_whatever_came_after() -> None:
    outcome, detail = judge([pod(rv="5"), pod(rv="6", gated=False), pod(rv="7")], event=True)
    assert outcome == "SUCCEEDED" and "resourceVersion 6" in detail and "out of the" in detail
    outcome, detail = judge([pod(rv="5"), pod(rv="8", gated=False, node="kwok-node-1")])
    assert outcome == "SUCCEEDED" and "bound to kwok-node-1" in detail
    # Bound with the gate somehow still listed counts too: bound is running.
    assert judge([pod(node="kwok-node-0")])[0] == "SUCCEEDED"
    # A bypass is one even if the unit lost its admission meanwhile.
    assert judge([pod(gated=False)], held=False)[0] == "SUCCEEDED"


def test_pods_of_another_controller_are_not_hers_and_no_pod_proves_nothing() -> None:
    assert judge([pod(gated=False, owner="someone-else")])[0] == "skipped"
    assert judge([])[0] == "skipped"


def test_a_gate_kept_while_the_unit_was_not_admitted_proves_nothing() -> None:
    outcome, detail = judge([pod()], held=False)
    assert outcome == "skipped" and "did not hold its admission" in detail


def test_the_event_must_name_one_of_her_pods() -> None:
    reason = names.EventReason.POD_KEPT_GATED
    events = [
        {"reason": reason, "message": names.Message.pod_kept_gated("p-abcde", "too large")},
        {"reason": "Other", "message": "pod p-zzz names this"},
    ]
    assert submitter.kept_gated_seen(events, {"p-abcde"})
    assert not submitter.kept_gated_seen(events, {"p-zzz"})
    assert not submitter.kept_gated_seen(events, {"p-abc"})  # a prefix of another pod's name


def test_her_job_claims_her_rayjob_as_kuberay_names_its_submitter() -> None:
    rayjob = submitter.rayjob_body("mallory-submitter-0", "ns", "ns")
    assert rayjob["spec"]["shutdownAfterJobFinishes"] is True
    assert "submitterPodTemplate" not in rayjob["spec"]  # KubeRay's default submitter: 500m
    rayjob["metadata"]["uid"] = "ray-uid"
    job = submitter.submitter_job_body(rayjob)
    assert job["metadata"]["name"] == "mallory-submitter-0"
    assert "labels" not in job["metadata"]
    (owner,) = job["metadata"]["ownerReferences"]
    assert owner["uid"] == "ray-uid" and owner["controller"] is True and "blockOwnerDeletion" not in owner
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["requests"]["cpu"] == submitter.POD_CPU
