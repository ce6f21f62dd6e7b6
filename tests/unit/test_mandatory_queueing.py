"""Mandatory queueing (docs/operations.md#mandatory-queueing): the configuration, which jobs it
manages, the namespace's default quota, and the webhook's answers on both routes, off (the default:
an unlabelled job passes untouched) and on (it is held, and a namespace user cannot take it out of
the queue)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from koord_queue.shared.admission import decisions as admission
from koord_queue.shared.admission.decisions import Operation
from koord_queue.shared.api import names
from koord_queue.shared.api.model import Quota
from koord_queue.shared.core import config, mandatory
from koord_queue.shared.jobs import registry
from koord_queue.shared.jobs.batch_job import BatchJobAdapter
from tests.unit.test_admission import CONFIG, NOW, decoded_patch, review_body
from tests.unit.test_job_adapters import SAMPLES, apply_patch, batch_job

JOB = BatchJobAdapter()
HEADER = "apiVersion: scheduling.k8s.io/v1\nkind: KoordQueueConfiguration\n"


def unlabelled(**spec: Any) -> dict[str, Any]:
    job = batch_job(**spec)
    job["metadata"]["labels"] = {}
    return job


def answer(obj: dict[str, Any] | None, *, operation: Operation, all_jobs: bool, **kw: Any) -> dict[str, Any]:
    body = review_body(obj, operation="UPDATE" if "old" in kw else "CREATE", **kw)
    reply = admission.review(body, operation=operation, config=CONFIG, now_text=NOW, all_jobs=all_jobs)
    response: dict[str, Any] = reply["response"]
    return response


def forged_owner(job: dict[str, Any]) -> dict[str, Any]:
    forged = copy.deepcopy(job)
    forged["metadata"]["ownerReferences"] = [
        {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "name": "ghost", "uid": "u-1", "controller": True}
    ]
    return forged


# --- configuration --------------------------------------------------------------------------------


def test_mandatory_queueing_is_off_by_default() -> None:
    settings = config.parse(HEADER)
    assert settings.mandatory_queueing.enabled is False
    assert not settings.mandatory_queueing.applies("team-a", {"kubernetes.io/metadata.name": "team-a"})


def test_the_switch_and_the_selector_are_read_from_the_configuration() -> None:
    text = HEADER + (
        "manageJobsWithoutQuotaName: true\n"
        "managedJobsNamespaceSelector:\n"
        "  matchLabels: {queueing: mandatory}\n"
        "  matchExpressions: [{key: tier, operator: NotIn, values: [dev]}]\n"
    )
    queueing = config.parse(text).mandatory_queueing
    assert queueing.applies("a", {"queueing": "mandatory"})
    assert not queueing.applies("a", {"queueing": "mandatory", "tier": "dev"})
    assert not queueing.applies("a", {})
    assert not queueing.applies("a", None)  # a namespace not seen yet selects nothing


def test_without_a_selector_every_namespace_but_ours_and_kube_system_is_selected() -> None:
    queueing = config.parse(HEADER + "manageJobsWithoutQuotaName: true\n").mandatory_queueing
    assert queueing.applies("team-a", {"kubernetes.io/metadata.name": "team-a"})
    for name in ("kube-system", names.COMPONENT_NAMESPACE):
        assert not queueing.applies(name, {"kubernetes.io/metadata.name": name})


def test_an_excluded_namespace_is_never_selected_even_by_an_empty_selector() -> None:
    queueing = mandatory.MandatoryQueueing(enabled=True, selector=mandatory.LabelSelector())
    assert queueing.applies("team-a", {})
    assert not queueing.applies("kube-system", {})


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("[a]", "expected a label selector"),
        ("{matchLabels: [a]}", "matchLabels"),
        ("{matchExpressions: [{key: a, operator: Near}]}", "operator"),
        ("{matchExpressions: [{key: a, operator: In}]}", "values"),
        ("{matchExpressions: [{key: a, operator: Exists, values: [b]}]}", "values"),
        ("{podSelector: {}}", "unknown field"),
    ],
)
def test_a_bad_selector_stops_the_reconciler_naming_the_field(value: str, fragment: str) -> None:
    with pytest.raises(config.ConfigError, match="managedJobsNamespaceSelector") as err:
        config.parse(HEADER + f"manageJobsWithoutQuotaName: true\nmanagedJobsNamespaceSelector: {value}\n")
    assert fragment in str(err.value)


def test_the_selector_renders_as_kubernetes_json_for_the_webhook_registration() -> None:
    selector = mandatory.parse_selector({"matchLabels": {"q": "on"}}, "s")
    assert selector.raw() == {"matchExpressions": [{"key": "q", "operator": "In", "values": ["on"]}]}


# --- which jobs are managed -----------------------------------------------------------------------


def test_an_unlabelled_job_is_managed_only_where_queueing_is_mandatory() -> None:
    assert not mandatory.is_managed(JOB, unlabelled(), mandatory=False)
    assert mandatory.is_managed(JOB, unlabelled(), mandatory=True)
    assert mandatory.is_managed(JOB, batch_job(), mandatory=False)


def test_every_kind_manages_its_unlabelled_jobs_where_queueing_is_mandatory() -> None:
    for extension, sample in SAMPLES.items():
        adapter = registry.by_extension(extension)
        job = copy.deepcopy(sample())
        job["metadata"]["labels"] = {}
        assert not mandatory.is_managed(adapter, job, mandatory=False), adapter
        assert mandatory.is_managed(adapter, job, mandatory=True), adapter


# --- the namespace's default quota ----------------------------------------------------------------


def quota(name: str, namespace: str, *extra: str, parent: bool = False) -> Quota:
    return Quota(name=name, namespace=namespace, extra_namespaces=frozenset(extra), is_parent=parent)


def test_the_quota_named_after_the_namespace_comes_first() -> None:
    quotas = [quota("shared", "infra", "team-a"), quota("team-a", "team-a")]
    assert mandatory.default_quota("team-a", quotas) == mandatory.DefaultQuota("team-a")


def test_a_quota_of_the_namespaces_name_elsewhere_does_not_count() -> None:
    found = mandatory.default_quota("team-a", [quota("team-a", "other")])
    assert found.name is None and found.message == names.no_default_quota_message("team-a")


def test_else_the_one_quota_that_lists_the_namespace() -> None:
    assert mandatory.default_quota("team-a", [quota("shared", "infra", "team-a")]).name == "shared"


def test_several_listing_quotas_are_not_guessed_between() -> None:
    found = mandatory.default_quota("team-a", [quota("x", "i", "team-a"), quota("y", "i", "team-a")])
    assert found.name is None
    assert found.message is not None and "(x, y)" in found.message


def test_a_parent_quota_is_never_a_default() -> None:
    found = mandatory.default_quota("team-a", [quota("team-a", "team-a", parent=True)])
    assert found.name is None


def test_without_a_quota_the_job_waits_with_a_reason_naming_what_to_do() -> None:
    message = mandatory.default_quota("team-a", []).message
    assert message is not None
    assert "stays held" in message and names.QUOTA_NAMESPACES_ANNOTATION in message


def test_the_label_patch_is_conditional_on_the_version_read() -> None:
    job = unlabelled()
    job["metadata"]["resourceVersion"] = "7"
    assert mandatory.label_patch(job, "team-a") == {
        "metadata": {"labels": {names.QUOTA_NAME_LABEL: "team-a"}, "resourceVersion": "7"}
    }


# --- the webhook, both ways -----------------------------------------------------------------------


def test_off_an_unlabelled_job_passes_the_ordinary_webhook_untouched() -> None:
    response = answer(unlabelled(), operation=Operation.MUTATE, all_jobs=False)
    assert response == {"uid": "uid-1", "allowed": True}


def test_on_an_unlabelled_job_is_held_and_gated() -> None:
    response = answer(unlabelled(), operation=Operation.MUTATE, all_jobs=True)
    held = apply_patch(unlabelled(), decoded_patch(response))
    assert held["spec"]["suspend"] is True
    assert {"name": names.ADMISSION_GATE} in held["spec"]["template"]["spec"]["schedulingGates"]
    assert JOB.is_suspended(held)


def held_job() -> dict[str, Any]:
    response = answer(unlabelled(), operation=Operation.MUTATE, all_jobs=True)
    job = apply_patch(unlabelled(), decoded_patch(response))
    job["metadata"]["uid"] = "job-uid"
    return job


def test_on_a_user_cannot_release_an_unlabelled_held_job() -> None:
    old = held_job()
    new = copy.deepcopy(old)
    new["spec"]["suspend"] = False
    response = answer(new, old=old, operation=Operation.VALIDATE, all_jobs=True, user="alice")
    assert response["allowed"] is False and "spec.suspend" in response["status"]["message"]


def test_on_a_user_cannot_label_an_unlabelled_held_job_into_another_quota() -> None:
    old = held_job()
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {names.QUOTA_NAME_LABEL: "elsewhere"}
    response = answer(new, old=old, operation=Operation.VALIDATE, all_jobs=True, user="alice")
    assert response["allowed"] is False


def test_the_reconciler_labels_an_unlabelled_held_job_with_its_default_quota() -> None:
    old = held_job()
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {names.QUOTA_NAME_LABEL: "ns"}
    user = admission.DEFAULT_RECONCILER_USERNAME
    assert answer(new, old=old, operation=Operation.VALIDATE, all_jobs=True, user=user)["allowed"] is True


@pytest.mark.parametrize("all_jobs", [False, True])
def test_a_forged_owner_cannot_take_a_queued_job_out_of_the_queue(all_jobs: bool) -> None:
    old = held_job()
    if not all_jobs:
        old["metadata"]["labels"] = {names.QUOTA_NAME_LABEL: "ns"}
    new = forged_owner(old)
    response = answer(new, old=old, operation=Operation.VALIDATE, all_jobs=all_jobs, user="alice")
    assert response["allowed"] is False
    assert "metadata.ownerReferences" in response["status"]["message"]


def test_removing_the_label_of_a_queued_job_is_refused_on_both_routes() -> None:
    old = held_job()
    old["metadata"]["labels"] = {names.QUOTA_NAME_LABEL: "ns"}
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {}
    for all_jobs in (False, True):
        response = answer(new, old=old, operation=Operation.VALIDATE, all_jobs=all_jobs, user="alice")
        assert response["allowed"] is False, all_jobs


def test_a_finished_job_may_lose_its_owner_references_and_labels_freely() -> None:
    old = held_job()
    old["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    new = forged_owner(old)
    response = answer(new, old=old, operation=Operation.VALIDATE, all_jobs=True, user="alice")
    assert response["allowed"] is True


def test_every_enabled_kind_is_held_on_the_mandatory_route() -> None:
    for extension, sample in SAMPLES.items():
        adapter = registry.by_extension(extension)
        if extension not in registry.DEFAULT_EXTENSIONS:
            continue
        job = copy.deepcopy(sample())
        job["metadata"]["labels"] = {}
        response = answer(job, operation=Operation.MUTATE, all_jobs=True)
        assert response["allowed"] is True and "patch" in response, adapter
