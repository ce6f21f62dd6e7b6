"""Native gang hand-off (docs/compatibility.md#native-gang-hand-off): the switch, the webhook's
workloadRef stamp, the Workload the reconciler creates, and the refusal on a cluster without the
Workload API (``shared.core.workloadref``, ``reconciler.workloads``, ``webhook.nativegangs``)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from koord_queue.reconciler import workloads
from koord_queue.shared import kube
from koord_queue.shared.admission.decisions import AdmissionConfig
from koord_queue.shared.api import names
from koord_queue.shared.core import config, workloadref
from koord_queue.shared.jobs import registry
from koord_queue.shared.jobs.podplan import PodView
from koord_queue.webhook.nativegangs import PublishedState
from tests.unit.test_admission import decoded_patch, mutate
from tests.unit.test_job_adapters import apply_patch, batch_job, kubeflow_job, ray_job

HEADER = "apiVersion: scheduling.k8s.io/v1\nkind: KoordQueueConfiguration\n"


class Probe:
    def __init__(self, served: bool) -> None:
        self._served = served

    def served(self) -> bool:
        return self._served


ON = AdmissionConfig(native_gangs=Probe(True))
NOT_SERVED = AdmissionConfig(native_gangs=Probe(False))


def gang_job(**spec: Any) -> dict[str, Any]:
    job = batch_job(parallelism=4, **spec)
    job["metadata"]["annotations"] = {names.JOB_MIN_PARALLELISM_ANNOTATION: "4"}
    return job


def stamped(job: dict[str, Any], cfg: AdmissionConfig) -> dict[str, Any]:
    response = mutate(job, cfg)
    return apply_patch(job, decoded_patch(response)) if "patch" in response else job


# --- the switch -----------------------------------------------------------------------------------


def test_the_switch_is_off_by_default_and_read_from_the_file() -> None:
    assert config.parse(HEADER).native_gang_handoff is False
    assert config.parse(HEADER + "nativeGangHandoff: true\n").native_gang_handoff is True
    assert not config.parse(HEADER + "nativeGangHandoff: true\n").warnings
    with pytest.raises(config.ConfigError, match="nativeGangHandoff"):
        config.parse(HEADER + "nativeGangHandoff: yes-please\n")


def test_the_shipped_configuration_keeps_it_off() -> None:
    path = Path(__file__).parents[2] / "manifests" / "config.yaml"
    import yaml

    doc = yaml.safe_load(path.read_text())
    assert config.parse(doc["data"]["config.yaml"]).native_gang_handoff is False


# --- pod groups -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pod_set", "expected"),
    [("worker", "worker"), ("train", "train"), ("small-group", "small-group")],
)
def test_a_pod_set_named_like_a_dns_label_is_its_own_pod_group(pod_set: str, expected: str) -> None:
    assert workloadref.pod_group_name(pod_set) == expected


@pytest.mark.parametrize("pod_set", ["a.b.c", "Upper", "x" * 80, "...", "-lead"])
def test_other_pod_set_names_become_distinct_dns_labels(pod_set: str) -> None:
    group = workloadref.pod_group_name(pod_set)
    assert len(group) <= 63
    assert workloadref._LABEL.fullmatch(group), group
    assert group != workloadref.pod_group_name(pod_set + "z")


def test_which_pod_sets_are_gangs_follows_shared_core_gangs() -> None:
    job_adapter = registry.by_kind("batch/v1", "Job")
    assert job_adapter is not None
    unit = workloadref.unit_of_job(job_adapter, gang_job())
    assert unit is not None
    assert workloadref.gang_pod_groups(unit) == {"train": ("train", 4)}
    plain = workloadref.unit_of_job(job_adapter, batch_job(parallelism=4))
    assert plain is not None and workloadref.gang_pod_groups(plain) == {}
    pytorch = registry.by_kind("kubeflow.org/v1", "PyTorchJob")
    assert pytorch is not None
    job = kubeflow_job("PyTorchJob", "pytorchReplicaSpecs", {"Master": 1, "Worker": 3})
    unit = workloadref.unit_of_job(pytorch, job)
    assert unit is not None and workloadref.gang_pod_groups(unit) == {"worker": ("worker", 3)}


def test_more_gangs_than_a_workload_holds_are_not_handed_off() -> None:
    rayjob = registry.by_kind("ray.io/v1", "RayJob")
    assert rayjob is not None
    job = ray_job()
    group = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    job["spec"]["rayClusterSpec"]["workerGroupSpecs"] = [
        {**group, "groupName": f"g{i}"} for i in range(workloadref.MAX_POD_GROUPS + 1)
    ]
    unit = workloadref.unit_of_job(rayjob, job)
    assert unit is not None and workloadref.gang_pod_groups(unit) is None
    assert stamped(job, ON) == stamped(job, AdmissionConfig())


# --- the webhook's stamp ------------------------------------------------------------------------------


def test_a_gang_template_gets_a_workload_ref_when_the_api_is_served() -> None:
    out = stamped(gang_job(), ON)
    assert out["spec"]["template"]["spec"]["workloadRef"] == {"name": "train", "podGroup": "train"}
    assert out["spec"]["template"]["spec"]["schedulingGates"] == [{"name": names.ADMISSION_GATE}]


@pytest.mark.parametrize("cfg", [AdmissionConfig(), NOT_SERVED], ids=["switch-off", "api-absent"])
def test_no_workload_ref_without_the_switch_or_the_api(cfg: AdmissionConfig) -> None:
    out = stamped(gang_job(), cfg)
    assert "workloadRef" not in out["spec"]["template"]["spec"]
    assert decoded_patch(mutate(gang_job(), cfg)) == decoded_patch(mutate(gang_job(), AdmissionConfig()))


def _unit_name(job: dict[str, Any]) -> str:
    adapter = registry.by_kind(job["apiVersion"], job["kind"])
    assert adapter is not None
    return adapter.queue_unit_name(job)


def test_only_gangs_are_stamped() -> None:
    assert "workloadRef" not in stamped(batch_job(parallelism=4), ON)["spec"]["template"]["spec"]
    job = kubeflow_job("PyTorchJob", "pytorchReplicaSpecs", {"Master": 1, "Worker": 3})
    specs = stamped(job, ON)["spec"]["pytorchReplicaSpecs"]
    assert specs["Worker"]["template"]["spec"]["workloadRef"] == {
        "name": _unit_name(job),
        "podGroup": "worker",
    }
    assert "workloadRef" not in specs["Master"]["template"]["spec"]


def test_ray_worker_groups_are_stamped_in_their_list() -> None:
    job = ray_job()
    spec = stamped(job, ON)["spec"]["rayClusterSpec"]
    ref = spec["workerGroupSpecs"][0]["template"]["spec"]["workloadRef"]
    assert ref == {"name": _unit_name(job), "podGroup": "small-group"}
    assert "workloadRef" not in spec["headGroupSpec"]["template"]["spec"]


def test_a_users_own_workload_ref_is_kept_and_generate_name_is_skipped() -> None:
    job = gang_job()
    job["spec"]["template"]["spec"]["workloadRef"] = {"name": "mine", "podGroup": "p"}
    assert stamped(job, ON)["spec"]["template"]["spec"]["workloadRef"] == {"name": "mine", "podGroup": "p"}
    unnamed = gang_job()
    del unnamed["metadata"]["name"]
    unnamed["metadata"]["generateName"] = "train-"
    assert "workloadRef" not in stamped(unnamed, ON)["spec"]["template"]["spec"]


# --- the Workload ----------------------------------------------------------------------------------------


def test_the_workload_is_owned_by_the_job_and_holds_one_gang_group_per_gang() -> None:
    adapter = registry.by_kind("batch/v1", "Job")
    assert adapter is not None
    job = gang_job()
    job["metadata"]["uid"] = "u-1"
    body = workloadref.workload_for("train", "ns", job, adapter, {"train": ("train", 4)})
    assert body["apiVersion"] == "scheduling.k8s.io/v1alpha1" and body["kind"] == "Workload"
    assert body["metadata"]["name"] == "train" and body["metadata"]["namespace"] == "ns"
    assert body["metadata"]["ownerReferences"] == [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "u-1"}
    ]
    assert body["spec"]["controllerRef"] == {"apiGroup": "batch", "kind": "Job", "name": "train"}
    assert body["spec"]["podGroups"] == [{"name": "train", "policy": {"gang": {"minCount": 4}}}]


# --- the reconciler: detection, refusal, creation -----------------------------------------------------------


class FakeKube:
    def __init__(self, discovery: dict[str, Any]) -> None:
        self.discovery = discovery
        self.created: list[dict[str, Any]] = []

    async def request(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        if path in self.discovery:
            return self.discovery[path]
        raise kube.NotFound(404, "NotFound", path)

    async def create(self, res: kube.Resource, obj: dict[str, Any], *, namespace: str | None = None) -> Any:
        self.created.append(obj)
        return obj


SERVED = {"/apis/scheduling.k8s.io/v1alpha1": {"resources": [{"name": "workloads"}]}}


@pytest.fixture(autouse=True)
def _reset_state() -> Any:
    yield
    workloads.STATE.enabled = workloads.STATE.served = False
    workloads.STATE.known.clear()


async def test_with_the_api_absent_the_switch_is_refused_with_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client: Any = FakeKube({})
    with caplog.at_level(logging.ERROR, logger="koord_queue.reconciler.workloads"):
        state = await workloads.detect(client, enabled=True)
    assert state.enabled and not state.served and not workloads.STATE.active
    message = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
    for needed in ("nativeGangHandoff", "scheduling.k8s.io/v1alpha1", "GenericWorkload", "GangScheduling"):
        assert needed in message
    assert "NOT handed to kube-scheduler" in message


async def test_a_workload_api_of_another_version_is_refused_and_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client: Any = FakeKube(
        {
            "/apis/scheduling.k8s.io/v1alpha1": {"resources": [{"name": "priorityclasses"}]},
            "/apis/scheduling.k8s.io": {"versions": [{"groupVersion": "scheduling.k8s.io/v1beta9"}]},
            "/apis/scheduling.k8s.io/v1beta9": {"resources": [{"name": "workloads"}]},
        }
    )
    with caplog.at_level(logging.ERROR, logger="koord_queue.reconciler.workloads"):
        state = await workloads.detect(client, enabled=True)
    assert not state.served and state.other == "scheduling.k8s.io/v1beta9"
    assert "serves scheduling.k8s.io/v1beta9 instead" in caplog.text


async def test_switch_off_asks_nothing_and_creates_nothing() -> None:
    client: Any = FakeKube(SERVED)
    state = await workloads.detect(client, enabled=False)
    assert not state.active
    await workloads.before_ungate(client, gang_job(), _adapter(), _unit(), [_pod()])
    assert client.created == []


async def test_the_workload_is_created_once_before_the_first_ungate() -> None:
    client: Any = FakeKube(SERVED)
    assert (await workloads.detect(client, enabled=True)).active
    job = gang_job()
    job["metadata"]["uid"] = "u-1"
    await workloads.before_ungate(client, job, _adapter(), _unit(), [])
    assert client.created == []  # nothing to release: nothing to describe yet
    await workloads.before_ungate(client, job, _adapter(), _unit(), [_pod()])
    await workloads.before_ungate(client, job, _adapter(), _unit(), [_pod()])
    assert [w["spec"]["podGroups"] for w in client.created] == [
        [{"name": "train", "policy": {"gang": {"minCount": 4}}}]
    ]


def _adapter() -> Any:
    return registry.by_kind("batch/v1", "Job")


def _unit() -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": "QueueUnit",
        "metadata": {"name": "train", "namespace": "ns", "creationTimestamp": "2025-01-01T00:00:00Z"},
        "spec": {
            "consumerRef": {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "namespace": "ns"},
            "podSet": [
                {
                    "name": "train",
                    "count": 4,
                    "minCount": 4,
                    "template": {"spec": {"containers": [{"name": "c", "resources": {}}]}},
                }
            ],
        },
    }


def _pod() -> PodView:
    return PodView(
        "ns", "train-a", "uid-a", "train", "", bound=False, gated=True, terminal=False, deleting=False
    )


# --- the webhook's view of what the reconciler published -------------------------------------------------


def test_the_webhook_stamps_only_while_the_published_file_names_the_api(tmp_path: Path) -> None:
    path = tmp_path / "workloadAPI"
    state = PublishedState(path, interval=0)
    assert not state.served()  # no file (the ConfigMap is absent: switch off)
    path.write_text("")
    assert not state.served()  # published as not served
    path.write_text("scheduling.k8s.io/v1alpha1")
    assert state.served()
    path.write_text("scheduling.k8s.io/v1beta1")
    assert not state.served()
