"""The job extensions where queueing is mandatory (docs/operations.md#mandatory-queueing), with a
fake client: an unlabelled held job of a selected namespace is labelled with the namespace's default
quota, waits held with a Warning when none resolves, is held again when it runs unadmitted, and is
left alone where queueing is not mandatory (the default)."""

from __future__ import annotations

from koord_queue.reconciler.job_units import JobKey
from koord_queue.reconciler.jobs import JobExtensions
from koord_queue.shared import kube
from koord_queue.shared.api import names
from koord_queue.shared.api.model import Quota
from koord_queue.shared.core import mandatory
from koord_queue.shared.jobs import registry
from tests.unit.test_job_extensions_wiring import FakeClient

KEY = JobKey("batch/v1", "Job", "team-a", "train")
SELECTED = mandatory.MandatoryQueueing(
    enabled=True, selector=mandatory.parse_selector({"matchLabels": {"queueing": "mandatory"}}, "s")
)


class RecordingEvents:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    def record(self, obj: kube.Obj, *, type_: str, reason: str, message: str) -> None:
        self.seen.append((type_, reason, message))


def job(*, suspended: bool = True, labels: dict[str, str] | None = None) -> kube.Obj:
    container = {"name": "c", "image": "i", "resources": {"requests": {"cpu": "1"}}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "train",
            "namespace": "team-a",
            "uid": "u-1",
            "resourceVersion": "4",
            "labels": labels or {},
            "annotations": {names.JOB_HAS_ENQUEUED_ANNOTATION: "true"},
        },
        "spec": {"suspend": suspended, "template": {"spec": {"containers": [container]}}},
    }


def extensions(
    queueing: mandatory.MandatoryQueueing, quotas: list[Quota], namespace_labels: dict[str, str] | None
) -> tuple[JobExtensions, FakeClient, RecordingEvents]:
    client, events = FakeClient(), RecordingEvents()
    jobs = JobExtensions(
        client,  # type: ignore[arg-type]
        adapters=registry.enabled_adapters(("job",)),
        units=dict,
        priority_classes=dict,
        events=events,  # type: ignore[arg-type]
        mandatory_queueing=queueing,
        quotas=lambda: quotas,
    )
    if jobs.namespaces is not None and namespace_labels is not None:
        jobs.namespaces.objects["team-a"] = {"metadata": {"name": "team-a", "labels": namespace_labels}}
    return jobs, client, events


async def reconcile(jobs: JobExtensions, obj: kube.Obj) -> None:
    jobs.job_informers[("batch/v1", "Job")].objects["team-a/train"] = obj
    await jobs.reconcile(KEY)


async def test_off_by_default_an_unlabelled_job_is_left_alone() -> None:
    jobs, client, events = extensions(
        mandatory.MandatoryQueueing(), [Quota(name="team-a", namespace="team-a")], None
    )
    assert jobs.namespaces is None  # namespaces are not even watched
    await reconcile(jobs, job(suspended=False))
    assert client.patches == [] and client.creates == [] and events.seen == []


async def test_an_unselected_namespace_keeps_its_unlabelled_jobs_unqueued() -> None:
    jobs, client, _ = extensions(SELECTED, [Quota(name="team-a", namespace="team-a")], {"queueing": "no"})
    await reconcile(jobs, job(suspended=False))
    assert client.patches == [] and client.creates == []


async def test_a_held_unlabelled_job_is_labelled_with_the_namespaces_default_quota() -> None:
    quotas = [Quota(name="team-a", namespace="team-a"), Quota(name="shared", namespace="x")]
    jobs, client, events = extensions(SELECTED, quotas, {"queueing": "mandatory"})
    await reconcile(jobs, job())
    assert client.patches == [
        ("train", {"metadata": {"labels": {names.QUOTA_NAME_LABEL: "team-a"}, "resourceVersion": "4"}}, "")
    ]
    assert client.creates == []  # the unit comes with the label's watch event
    assert [reason for _, reason, _ in events.seen] == [names.EventReason.DEFAULT_QUOTA]


async def test_without_a_default_quota_the_job_stays_held_with_a_warning() -> None:
    jobs, client, events = extensions(SELECTED, [], {"queueing": "mandatory"})
    await reconcile(jobs, job())
    assert client.patches == [] and client.creates == []
    assert events.seen == [
        ("Warning", names.EventReason.NO_DEFAULT_QUOTA, names.no_default_quota_message("team-a"))
    ]


async def test_an_unlabelled_job_running_unadmitted_is_held_first() -> None:
    jobs, client, events = extensions(
        SELECTED, [Quota(name="team-a", namespace="team-a")], {"queueing": "mandatory"}
    )
    await reconcile(jobs, job(suspended=False))
    [(name, patch, _)] = client.patches
    assert name == "train" and patch["spec"]["suspend"] is True
    assert [reason for _, reason, _ in events.seen] == [names.EventReason.HELD_UNADMITTED]


async def test_a_labelled_job_is_handled_as_always_where_queueing_is_mandatory() -> None:
    jobs, client, _ = extensions(
        SELECTED, [Quota(name="team-a", namespace="team-a")], {"queueing": "mandatory"}
    )
    await reconcile(jobs, job(labels={names.QUOTA_NAME_LABEL: "other"}))
    assert [c["metadata"]["labels"][names.QUOTA_NAME_LABEL] for c in client.creates] == ["other"]


def test_a_quota_or_namespace_change_marks_only_unlabelled_jobs_of_selected_namespaces() -> None:
    jobs, _, _ = extensions(SELECTED, [], {"queueing": "mandatory"})
    store = jobs.job_informers[("batch/v1", "Job")].objects
    store["team-a/train"] = job()
    labelled = job(labels={names.QUOTA_NAME_LABEL: "q"})
    labelled["metadata"]["name"] = "other"
    store["team-a/other"] = labelled
    jobs._mark_unlabelled(None)
    assert list(jobs._dirty) == [KEY]
