"""Admission decisions (``shared.admission.decisions``): envelope checks, mutation, validation rules.

Grouped by topic: malformed reviews, what is mutated and what passes untouched, the queue's hold on
a job (unsuspend, dequeue stamp, quota label), our own objects, and a property test that decisions
are total (any object yields a well-formed response).
"""

from __future__ import annotations

import base64
import contextlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koord_queue.shared.admission import decisions as admission
from koord_queue.shared.admission.decisions import AdmissionConfig, MalformedReview, Operation
from koord_queue.shared.api import names
from koord_queue.shared.jobs import patches, registry
from tests.unit.test_job_adapters import SAMPLES, apply_patch, batch_job

NOW = "2025-01-02T03:04:05Z"
CONFIG = AdmissionConfig()
RECONCILER = admission.DEFAULT_RECONCILER_USERNAME
GATE = {"name": names.ADMISSION_GATE}


def review_body(
    obj: dict[str, Any] | None,
    *,
    operation: str = "CREATE",
    old: dict[str, Any] | None = None,
    user: str = "alice",
    sub_resource: str | None = None,
    namespace: str = "ns",
) -> dict[str, Any]:
    source = obj or old or {}
    group, _, version = source.get("apiVersion", "v1").rpartition("/")
    request: dict[str, Any] = {
        "uid": "uid-1",
        "kind": {"group": group, "version": version, "kind": source.get("kind", "Pod")},
        "resource": {"group": group, "version": version, "resource": "things"},
        "operation": operation,
        "namespace": namespace,
        "userInfo": {"username": user},
        "object": obj,
        "oldObject": old,
    }
    if sub_resource:
        request["subResource"] = sub_resource
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def mutate(obj: dict[str, Any], config: AdmissionConfig = CONFIG, **kw: Any) -> dict[str, Any]:
    answer = admission.review(review_body(obj, **kw), operation=Operation.MUTATE, config=config, now_text=NOW)
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    response: dict[str, Any] = answer["response"]
    assert response["uid"] == "uid-1"
    return response


def validate(obj: dict[str, Any] | None, config: AdmissionConfig = CONFIG, **kw: Any) -> dict[str, Any]:
    body = review_body(obj, **kw)
    response: dict[str, Any] = admission.review(
        body, operation=Operation.VALIDATE, config=config, now_text=NOW
    )["response"]
    return response


def decoded_patch(response: dict[str, Any]) -> list[Any]:
    assert response["patchType"] == "JSONPatch"
    ops: list[Any] = json.loads(base64.b64decode(response["patch"]))
    return ops


def queued(obj: dict[str, Any]) -> dict[str, Any]:
    """The object as stored after our mutation."""
    return apply_patch(obj, decoded_patch(mutate(obj)))


# --- malformed reviews ----------------------------------------------------------------------------


def _without(path: tuple[str, ...]) -> dict[str, Any]:
    body = review_body(batch_job())
    node = body
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return body


def _with(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    body = review_body(batch_job())
    node = body
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return body


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ([], "JSON object"),
        ("AdmissionReview", "JSON object"),
        (_with(("apiVersion",), "admission.k8s.io/v1beta1"), "admission.k8s.io/v1"),
        (_with(("kind",), "ConversionReview"), "AdmissionReview"),
        (_without(("request",)), "request"),
        (_without(("request", "uid")), "request.uid"),
        (_with(("request", "uid"), ""), "request.uid"),
        (_with(("request", "uid"), 7), "request.uid"),
        (_with(("request", "kind"), "Job"), "request.kind"),
        (_with(("request", "kind"), {"group": "batch", "kind": "Job"}), "request.kind"),
        (_with(("request", "operation"), "PATCH"), "request.operation"),
        (_with(("request", "object"), None), "request.object"),
        (_with(("request", "object"), [1]), "request.object"),
        (_with(("request", "userInfo"), "alice"), "request.userInfo"),
        (_with(("request", "userInfo"), {"username": 5}), "username"),
        (_with(("request", "namespace"), 5), "request.namespace"),
    ],
)
def test_malformed_reviews_raise_with_a_reason(body: Any, reason: str) -> None:
    with pytest.raises(MalformedReview, match=reason):
        admission.review(body, operation=Operation.VALIDATE, config=CONFIG, now_text=NOW)


def test_update_without_old_object_is_malformed() -> None:
    with pytest.raises(MalformedReview, match="oldObject"):
        admission.parse_review(review_body(batch_job(), operation="UPDATE"))


def test_unknown_extensions_fail_config_construction() -> None:
    with pytest.raises(registry.UnknownExtensionError):
        AdmissionConfig(enabled_extensions=frozenset({"job", "clusterresourcebinding"}))


# --- mutation -------------------------------------------------------------------------------------


@pytest.mark.parametrize("extension", registry.DEFAULT_EXTENSIONS)
def test_a_labelled_job_of_every_enabled_kind_is_patched(extension: str) -> None:
    obj = SAMPLES[extension]()
    del obj["metadata"]["namespace"]  # on CREATE the namespace may only be in the request
    response = mutate(obj, namespace="team")
    assert response["allowed"] is True
    stored = apply_patch(obj, decoded_patch(response))
    adapter = registry.by_extension(extension)
    assert adapter.is_suspended(stored)
    assert stored["metadata"]["annotations"][names.JOB_ENQUEUE_TIMESTAMP_ANNOTATION] == NOW
    for pod_set in adapter.pod_sets(stored):
        if stored.get("kind") == "RayJob" and pod_set.name == "submitter":
            continue  # KubeRay's default submitter: no template in the job (docs/compatibility.md#rayjob)
        related = pod_set.template["metadata"]["annotations"].get(names.RELATED_QUEUEUNIT_ANNOTATION)
        assert related in (None, f"team/{adapter.queue_unit_name(obj)}")


@pytest.mark.parametrize(
    ("change", "kw"),
    [
        (lambda j: j["metadata"].pop("labels"), {}),
        (lambda j: None, {"operation": "DELETE"}),
        (lambda j: None, {"sub_resource": "status"}),
        (lambda j: j.update(kind="CronJob"), {}),
        (lambda j: j.update(apiVersion="batch/v2"), {}),
    ],
)
def test_objects_we_do_not_manage_pass_untouched(change: Any, kw: dict[str, Any]) -> None:
    obj = batch_job()
    change(obj)
    if kw.get("operation") == "DELETE":
        kw["old"] = obj
    response = mutate(obj, **kw)
    assert response == {"uid": "uid-1", "allowed": True}


@pytest.mark.parametrize(
    "forge",
    [
        lambda j: j.update(status={"startTime": "2025-01-01T00:00:00Z", "active": 1}),
        lambda j: j["metadata"].update(deletionTimestamp="2025-01-01T00:00:00Z"),
    ],
)
def test_a_job_claiming_to_have_started_or_to_be_deleted_is_still_held_on_create(forge: Any) -> None:
    # The apiserver drops status and deletionTimestamp only after mutating admission.
    obj = batch_job()
    forge(obj)
    stored = apply_patch(obj, decoded_patch(mutate(obj)))
    assert stored["spec"]["suspend"] is True
    assert GATE in stored["spec"]["template"]["spec"]["schedulingGates"]


def test_a_forged_status_is_removed_only_where_the_crd_has_no_status_subresource() -> None:
    flow = SAMPLES["workflow"]()
    flow["status"] = {"phase": "Succeeded", "startedAt": NOW}
    ops = decoded_patch(mutate(flow))
    assert {"op": "remove", "path": "/status"} in ops
    stored = apply_patch(flow, ops)
    assert "status" not in stored and stored["spec"]["suspend"] is True
    job = batch_job()
    job["status"] = {"startTime": NOW}
    assert {"op": "remove", "path": "/status"} not in decoded_patch(mutate(job))


def test_disabled_kinds_are_not_mutated_until_enabled() -> None:
    cluster = SAMPLES["raycluster"]()
    assert "patch" not in mutate(cluster)
    enabled = AdmissionConfig(enabled_extensions=frozenset({"raycluster"}))
    assert "patch" in mutate(cluster, enabled)
    assert "patch" not in mutate(batch_job(), enabled)


def test_an_unreadable_managed_job_is_denied_with_the_field_path() -> None:
    obj = batch_job()
    obj["spec"]["template"]["spec"]["schedulingGates"] = "gate"
    response = mutate(obj)
    assert response["allowed"] is False
    assert response["status"]["code"] == 422
    assert response["status"]["message"].startswith("spec.template.spec.schedulingGates: Invalid value")


# --- the queue's hold on a job --------------------------------------------------------------------


def test_a_user_cannot_unsuspend_a_queued_job() -> None:
    old = queued(batch_job())
    new = json.loads(json.dumps(old))
    new["spec"]["suspend"] = False
    response = validate(new, operation="UPDATE", old=old)
    assert response["allowed"] is False
    status = response["status"]
    assert (status["code"], status["reason"]) == (403, "Forbidden")
    assert status["message"].startswith("spec.suspend: Forbidden: the job is queued by koord-queue")
    assert "resumed automatically when its QueueUnit ns/train is admitted" in status["message"]
    assert RECONCILER in status["message"]


def test_the_reconciler_may_resume_a_queued_job() -> None:
    old = queued(batch_job())
    new = json.loads(json.dumps(old))
    new["spec"]["suspend"] = False
    new["metadata"]["annotations"][names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION] = NOW
    assert validate(new, operation="UPDATE", old=old, user=RECONCILER)["allowed"] is True
    custom = AdmissionConfig(reconciler_username="system:serviceaccount:x:y")
    assert validate(new, custom, operation="UPDATE", old=old, user=RECONCILER)["allowed"] is False


@pytest.mark.parametrize(
    ("release", "path"),
    [
        (lambda j: j["spec"]["runPolicy"].update(suspend=False), "spec.runPolicy.suspend"),
        (
            lambda j: j["metadata"]["annotations"].update({names.SUSPEND_ANNOTATION: "false"}),
            f"metadata.annotations[{names.SUSPEND_ANNOTATION}]",
        ),
    ],
)
def test_releasing_either_kubeflow_marker_is_denied(release: Any, path: str) -> None:
    old = queued(SAMPLES["tfjob"]())
    new = json.loads(json.dumps(old))
    release(new)
    response = validate(new, operation="UPDATE", old=old)
    assert response["status"]["message"].startswith(f"{path}: Forbidden")


def test_a_forged_dequeue_stamp_is_denied() -> None:
    old = queued(batch_job())
    new = json.loads(json.dumps(old))
    new["metadata"]["annotations"][names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION] = NOW
    response = validate(new, operation="UPDATE", old=old)
    assert response["allowed"] is False
    assert (
        f"metadata.annotations[{names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION}]: Forbidden"
        in response["status"]["message"]
    )


def admitted(obj: dict[str, Any]) -> dict[str, Any]:
    stored = queued(obj)
    stored["metadata"]["annotations"][names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION] = NOW
    stored["spec"]["suspend"] = False
    return stored


def relabelled(obj: dict[str, Any], quota: str) -> dict[str, Any]:
    new: dict[str, Any] = json.loads(json.dumps(obj))
    new["metadata"]["labels"][names.QUOTA_NAME_LABEL] = quota
    return new


def test_the_quota_label_is_frozen_while_admitted() -> None:
    old = admitted(batch_job())
    response = validate(relabelled(old, "team-b"), operation="UPDATE", old=old)
    assert response["allowed"] is False
    assert response["status"]["message"].startswith(f"metadata.labels[{names.QUOTA_NAME_LABEL}]: Forbidden")
    assert "'team-a'" in response["status"]["message"]


def test_the_quota_label_is_frozen_while_queued_and_free_after_finishing() -> None:
    old = queued(batch_job())
    response = validate(relabelled(old, "team-b"), operation="UPDATE", old=old)
    assert response["status"]["message"].startswith(f"metadata.labels[{names.QUOTA_NAME_LABEL}]: Forbidden")
    unlabelled = json.loads(json.dumps(old))
    del unlabelled["metadata"]["labels"][names.QUOTA_NAME_LABEL]
    assert validate(unlabelled, operation="UPDATE", old=old)["allowed"] is False
    fallback = json.loads(json.dumps(old))
    fallback["metadata"]["labels"][names.QUOTA_NAME_LABEL_FALLBACK] = "team-c"
    assert validate(fallback, operation="UPDATE", old=old)["allowed"] is False
    done = admitted(batch_job())
    done["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    assert validate(relabelled(done, "team-b"), operation="UPDATE", old=done)["allowed"] is True


def test_an_admitted_job_may_be_suspended_by_its_user_but_only_the_reconciler_resumes_it() -> None:
    old = admitted(batch_job())
    new = json.loads(json.dumps(old))
    new["spec"]["suspend"] = True
    assert validate(new, operation="UPDATE", old=old)["allowed"] is True
    assert validate(old, operation="UPDATE", old=new)["allowed"] is False
    assert validate(old, operation="UPDATE", old=new, user=RECONCILER)["allowed"] is True


@pytest.mark.parametrize("key", [names.JOB_HAS_ENQUEUED_ANNOTATION, names.JOB_ENQUEUE_TIMESTAMP_ANNOTATION])
def test_stripping_the_enqueue_annotations_neither_is_allowed_nor_unlocks_the_hold(key: str) -> None:
    old = queued(batch_job())
    stripped = json.loads(json.dumps(old))
    del stripped["metadata"]["annotations"][key]
    response = validate(stripped, operation="UPDATE", old=old)
    assert response["status"]["message"].startswith(f"metadata.annotations[{key}]: Forbidden")
    # Even if both were gone already (a job stored before the webhook existed), the hold stays.
    for gone in (names.JOB_HAS_ENQUEUED_ANNOTATION, names.JOB_ENQUEUE_TIMESTAMP_ANNOTATION):
        stripped["metadata"]["annotations"].pop(gone, None)
    released = json.loads(json.dumps(stripped))
    released["spec"]["suspend"] = False
    response = validate(released, operation="UPDATE", old=stripped)
    assert response["status"]["message"].startswith("spec.suspend: Forbidden")


@pytest.mark.parametrize("extension", sorted(SAMPLES))
def test_removing_a_template_gate_is_denied_for_every_kind(extension: str) -> None:
    config = AdmissionConfig(enabled_extensions=frozenset({extension}))
    sample = SAMPLES[extension]()
    old = apply_patch(sample, decoded_patch(mutate(sample, config)))
    new = json.loads(json.dumps(old))
    removed = _drop_gates(new)
    response = validate(new, config, operation="UPDATE", old=old)
    if not removed:  # kinds without pod templates (Workflow, Spark) have no gate to remove
        assert response["allowed"] is True
        return
    assert response["allowed"] is False
    assert (
        "schedulingGates: Forbidden: the scheduling gate koord-queue/admission"
        in response["status"]["message"]
    )


def _drop_gates(node: Any) -> int:
    removed = 0
    if isinstance(node, dict):
        gates = node.get("schedulingGates")
        if isinstance(gates, list) and GATE in gates:
            node["schedulingGates"] = [g for g in gates if g != GATE]
            removed += 1
        for value in node.values():
            removed += _drop_gates(value)
    elif isinstance(node, list):
        for value in node:
            removed += _drop_gates(value)
    return removed


def test_an_admitted_job_keeps_the_pod_size_it_was_admitted_with() -> None:
    old = admitted(SAMPLES["tfjob"]())
    grown = json.loads(json.dumps(old))
    worker = grown["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    worker["resources"]["requests"]["cpu"] = "64"
    response = validate(grown, operation="UPDATE", old=old)
    assert response["status"]["message"].startswith("spec: Forbidden: the job is admitted with pods")
    assert "worker" in response["status"]["message"]
    # While it is only queued the unit follows the new size, so the edit is allowed.
    queued_old = queued(SAMPLES["tfjob"]())
    queued_new = json.loads(json.dumps(queued_old))
    queued_new["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["resources"][
        "requests"
    ]["cpu"] = "64"
    assert validate(queued_new, operation="UPDATE", old=queued_old)["allowed"] is True


def _tf_worker(job: dict[str, Any]) -> dict[str, Any]:
    template: dict[str, Any] = job["spec"]["tfReplicaSpecs"]["Worker"]["template"]
    return template


def _add_sidecar(template: dict[str, Any]) -> None:
    template["spec"]["containers"].append({"name": "sidecar", "image": "busybox"})


def _add_init(template: dict[str, Any]) -> None:
    template["spec"]["initContainers"] = [{"name": "setup", "image": "busybox"}]


def _rename_container(template: dict[str, Any]) -> None:
    template["spec"]["containers"][0]["name"] = "renamed"


def _set_runtime_class(template: dict[str, Any]) -> None:
    template["spec"]["runtimeClassName"] = "kata"


def _claim_other_pod_set(template: dict[str, Any]) -> None:
    template.setdefault("metadata", {}).setdefault("annotations", {})[names.RELATED_PODSET_ANNOTATION] = "ps"


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (_add_sidecar, "containers"),
        (_add_init, "initContainers"),
        (_rename_container, "containers"),
        (_set_runtime_class, "runtimeClassName"),
        (_claim_other_pod_set, names.RELATED_PODSET_ANNOTATION),
    ],
)
def test_an_admitted_job_keeps_what_its_pods_are_charged_for(edit: Any, said: str) -> None:
    """What the apiserver fills into a pod depends on its containers and its RuntimeClass, and the
    pod-set annotation says which admission a pod counts for: none of them changes on an admitted
    job (docs/compatibility.md#admitted-pod-size)."""
    old = admitted(SAMPLES["tfjob"]())
    new = json.loads(json.dumps(old))
    edit(_tf_worker(new))
    message = validate(new, operation="UPDATE", old=old)["status"]["message"]
    assert message.startswith("spec: Forbidden: the job is admitted"), message
    assert "worker" in message and said in message, message
    queued_old = queued(SAMPLES["tfjob"]())
    queued_new = json.loads(json.dumps(queued_old))
    edit(_tf_worker(queued_new))
    assert validate(queued_new, operation="UPDATE", old=queued_old)["allowed"] is True, "queued: it follows"


def test_an_admitted_job_may_change_what_costs_nothing() -> None:
    old = admitted(SAMPLES["tfjob"]())
    new = json.loads(json.dumps(old))
    worker = _tf_worker(new)
    worker["spec"]["containers"][0]["image"] = "other:2"
    worker.setdefault("metadata", {}).setdefault("annotations", {})["example.com/note"] = "x"
    assert validate(new, operation="UPDATE", old=old)["allowed"] is True


def _templates(node: Any) -> list[dict[str, Any]]:
    """Every pod template in a job (a map whose spec lists containers)."""
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        spec = node.get("spec")
        if isinstance(spec, dict) and isinstance(spec.get("containers"), list):
            found.append(node)
        for value in node.values():
            found += _templates(value)
    elif isinstance(node, list):
        for value in node:
            found += _templates(value)
    return found


@pytest.mark.parametrize("extension", sorted(SAMPLES))
def test_a_container_added_to_an_admitted_job_is_refused_for_every_kind(extension: str) -> None:
    config = AdmissionConfig(enabled_extensions=frozenset({extension}))
    sample = SAMPLES[extension]()
    templates = _templates(sample)
    if not templates:  # kinds without pod templates (Workflow, Spark) size their pods elsewhere
        return
    old = apply_patch(sample, decoded_patch(mutate(sample, config)))
    old["metadata"]["annotations"][names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION] = NOW
    new = json.loads(json.dumps(old))
    for template in _templates(new):
        _add_sidecar(template)
    response = validate(new, config, operation="UPDATE", old=old)
    assert response["allowed"] is False, extension
    assert "containers" in response["status"]["message"]


def test_a_legacy_job_without_gates_is_not_blocked_for_missing_them() -> None:
    old = batch_job()
    old["spec"]["suspend"] = True
    new = json.loads(json.dumps(old))
    new["metadata"].setdefault("annotations", {})["example.com/note"] = "x"
    assert validate(new, operation="UPDATE", old=old)["allowed"] is True


def test_a_running_job_cannot_join_a_queue_by_gaining_the_quota_label() -> None:
    old = batch_job()
    del old["metadata"]["labels"]
    new = batch_job()
    response = validate(new, operation="UPDATE", old=old)
    assert response["status"]["message"].startswith("spec.suspend: Forbidden: a Job that gains a quota label")
    new["spec"]["suspend"] = True
    assert validate(new, operation="UPDATE", old=old)["allowed"] is True


def test_a_job_must_arrive_held_even_if_something_mutated_it_after_us() -> None:
    response = validate(batch_job())
    assert response["status"]["message"].startswith("spec.suspend: Forbidden: a Job that is created")
    assert validate(queued(batch_job()))["allowed"] is True


def test_workflow_status_belongs_to_its_controller() -> None:
    old = queued(SAMPLES["workflow"]())
    forged = json.loads(json.dumps(old))
    forged["status"] = {"phase": "Succeeded"}
    response = validate(forged, operation="UPDATE", old=old)
    assert response["status"]["message"].startswith("status: Forbidden")
    writer = next(iter(admission.DEFAULT_STATUS_WRITERS))
    assert validate(forged, operation="UPDATE", old=old, user=writer)["allowed"] is True
    created = json.loads(json.dumps(forged))
    assert validate(created)["allowed"] is False
    # A batch Job's status lives in a subresource: a status in the main resource is not checked.
    job = queued(batch_job())
    job_forged = json.loads(json.dumps(job))
    job_forged["status"] = {"active": 1}
    assert validate(job_forged, operation="UPDATE", old=job)["allowed"] is True


def test_bad_job_annotations_are_denied_on_create_but_ratcheted_on_update() -> None:
    obj = batch_job()
    obj["metadata"]["annotations"] = {names.PRIORITY_ANNOTATION: "high", names.ACTIVE_ANNOTATION: "maybe"}
    response = validate(obj)
    assert response["status"]["code"] == 422
    assert response["status"]["message"].startswith(f"[metadata.annotations[{names.PRIORITY_ANNOTATION}]")
    assert validate(obj, operation="UPDATE", old=obj)["allowed"] is True


def test_the_mutating_webhook_refuses_on_create_what_the_validating_one_would() -> None:
    """The validating job webhooks are called on UPDATE only; on CREATE the mutating webhook checks
    the held job (docs/architecture.md#decision-6-a-stateless-scoped-webhook)."""
    obj = batch_job()
    obj["metadata"]["annotations"] = {names.PRIORITY_ANNOTATION: "high", names.ACTIVE_ANNOTATION: "maybe"}
    refused = mutate(obj)
    assert refused["allowed"] is False and refused["status"]["code"] == 422
    message = refused["status"]["message"]
    assert message.startswith(f"[metadata.annotations[{names.PRIORITY_ANNOTATION}]"), message
    assert names.ACTIVE_ANNOTATION in message and "held" not in message, message
    stamped = batch_job()
    stamped["metadata"]["annotations"] = {names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION: NOW}
    answer = mutate(stamped)  # an admission stamp a user brings is dropped, not honoured
    held = apply_patch(stamped, decoded_patch(answer))
    assert names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION not in held["metadata"].get("annotations", {})
    # The reconciler creates no jobs, but its writes are never refused.
    assert mutate(obj, user=CONFIG.reconciler_username)["allowed"] is True


@pytest.mark.parametrize("extension", registry.DEFAULT_EXTENSIONS)
def test_what_the_mutating_webhook_holds_the_validating_one_would_allow(extension: str) -> None:
    obj = SAMPLES[extension]()
    response = mutate(obj)
    assert response["allowed"] is True
    ops = decoded_patch(response)
    held = apply_patch(obj, ops)
    assert patches.applied(obj, ops) == held
    assert validate(held)["allowed"] is True, validate(held)


def test_status_updates_and_deletes_are_never_blocked_but_a_deleting_job_stays_held() -> None:
    old = queued(batch_job())
    new = json.loads(json.dumps(old))
    new["spec"]["suspend"] = False
    assert validate(new, operation="UPDATE", old=old, sub_resource="status")["allowed"] is True
    assert validate(None, operation="DELETE", old=old)["allowed"] is True
    # A finalizer keeps a deleted job in the API: it must not be released meanwhile.
    new["metadata"]["deletionTimestamp"] = NOW
    assert validate(new, operation="UPDATE", old=old)["allowed"] is False
    unfinalized = json.loads(json.dumps(old))
    unfinalized["metadata"]["deletionTimestamp"] = NOW
    unfinalized["metadata"]["finalizers"] = []
    assert validate(unfinalized, operation="UPDATE", old=old)["allowed"] is True


# --- our own objects ------------------------------------------------------------------------------


def queue(policy: str) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": "Queue",
        "metadata": {"name": "q"},
        "spec": {"queuePolicy": policy},
    }


def test_an_unsupported_queue_policy_is_denied_with_its_path() -> None:
    response = validate(queue("FIFO"))
    assert response["status"] == {
        "code": 422,
        "reason": "Invalid",
        "message": 'spec.queuePolicy: Unsupported value: "FIFO": '
        'supported values: "Priority", "Block", "Intelligent"',
    }
    assert validate(queue("Block"))["allowed"] is True


def test_a_legacy_invalid_queue_can_still_be_updated() -> None:
    old = queue("FIFO")
    new = {**old, "metadata": {"name": "q", "finalizers": []}}
    assert validate(new, operation="UPDATE", old=old)["allowed"] is True
    assert validate(queue("Round"), operation="UPDATE", old=old)["allowed"] is False


def test_an_elastic_quota_with_min_above_max_is_denied() -> None:
    quota = {
        "apiVersion": names.QUOTA_API_VERSION,
        "kind": "ElasticQuota",
        "metadata": {"name": "q", "labels": {names.QUOTA_PARENT_LABEL: "q"}},
        "spec": {"min": {"cpu": "8"}, "max": {"cpu": "4"}},
    }
    message = validate(quota)["status"]["message"]
    assert message.startswith(f"[metadata.labels[{names.QUOTA_PARENT_LABEL}]: Invalid value")
    assert 'spec.min[cpu]: Invalid value: "8": must be less than or equal to spec.max[cpu] ("4")' in message


def test_a_queue_unit_with_too_many_pod_sets_is_denied_except_for_the_reconciler() -> None:
    template = {"spec": {"containers": [{"name": "c"}]}}
    unit = {
        "apiVersion": names.API_VERSION,
        "kind": "QueueUnit",
        "metadata": {"name": "u"},
        "spec": {"podSet": [{"name": f"p{i}", "count": 1, "template": template} for i in range(9)]},
    }
    assert validate(unit)["status"]["message"] == "spec.podSet: Too many: 9: must have at most 8 items"
    assert validate(unit, user=RECONCILER)["allowed"] is True


# --- totality -------------------------------------------------------------------------------------

scalars = st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=4)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)
keys = st.sampled_from(
    ["metadata", "spec", "status", "labels", "annotations", "template", "suspend", "runPolicy", "name",
     "tfReplicaSpecs", "rayClusterSpec", "headGroupSpec", "workerGroupSpecs", "templates", "driver",
     "schedulingGates", names.QUOTA_NAME_LABEL, names.JOB_HAS_ENQUEUED_ANNOTATION, "queuePolicy",
     "min", "max"]
)  # fmt: skip
shaped = st.recursive(
    json_values, lambda inner: st.dictionaries(keys, inner, max_size=5) | st.lists(inner, max_size=2),
    max_leaves=25,
)  # fmt: skip
kinds = st.sampled_from(
    [(a.api_version, a.kind) for a in registry.ADAPTERS]
    + [
        (names.API_VERSION, "Queue"),
        (names.API_VERSION, "QueueUnit"),
        (names.QUOTA_API_VERSION, "ElasticQuota"),
    ]
)


@settings(max_examples=400, deadline=None)
@given(
    kind=kinds,
    new=st.dictionaries(keys, shaped, max_size=5),
    old=st.dictionaries(keys, shaped, max_size=5),
    operation=st.sampled_from(["CREATE", "UPDATE"]),
    which=st.sampled_from(list(Operation)),
    user=st.sampled_from(["alice", RECONCILER]),
)
def test_decisions_are_total(
    kind: tuple[str, str],
    new: dict[str, Any],
    old: dict[str, Any],
    operation: str,
    which: Operation,
    user: str,
) -> None:
    new = {**new, "apiVersion": kind[0], "kind": kind[1]}
    old = {**old, "apiVersion": kind[0], "kind": kind[1]}
    body = review_body(new, operation=operation, old=old if operation == "UPDATE" else None, user=user)
    enabled = AdmissionConfig(enabled_extensions=frozenset(registry.EXTENSIONS))
    response = admission.review(body, operation=which, config=enabled, now_text=NOW)["response"]
    assert response["uid"] == "uid-1"
    assert isinstance(response["allowed"], bool)
    if response["allowed"]:
        if "patch" in response:
            apply_patch(new, decoded_patch(response))  # every patch applies to the object it was made for
    else:
        assert response["status"]["code"] in (403, 422)
        assert response["status"]["message"]


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for key, child in children:
        found += _paths(child, (*prefix, key))
    return found


def _replace(node: Any, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


@settings(max_examples=400, deadline=None)
@given(
    data=st.data(),
    extension=st.sampled_from(registry.EXTENSIONS),
    user=st.sampled_from(["alice", RECONCILER]),
)
def test_decisions_are_total_on_perturbed_samples(data: st.DataObject, extension: str, user: str) -> None:
    """Real jobs with random subtrees replaced: deep paths the flat strategy above rarely reaches."""
    enabled = AdmissionConfig(enabled_extensions=frozenset(registry.EXTENSIONS))
    original = SAMPLES[extension]()
    stored = apply_patch(original, decoded_patch(mutate(original, enabled)))
    new = json.loads(json.dumps(stored))
    candidates = [p for p in _paths(new) if p[:1] not in (("apiVersion",), ("kind",))]
    for path in data.draw(st.lists(st.sampled_from(candidates), min_size=1, max_size=3)):
        value = data.draw(json_values)
        with contextlib.suppress(KeyError, IndexError, TypeError):  # an earlier replacement removed it
            _replace(new, path, value)
    for which in Operation:
        for body in (review_body(new), review_body(new, operation="UPDATE", old=stored, user=user)):
            response = admission.review(body, operation=which, config=enabled, now_text=NOW)["response"]
            assert isinstance(response["allowed"], bool)
            if "patch" in response:
                apply_patch(new, decoded_patch(response))
            if not response["allowed"]:
                assert response["status"]["message"]
