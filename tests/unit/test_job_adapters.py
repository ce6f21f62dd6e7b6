"""Job adapters: one contract test over every registered adapter, then per-kind tables.

The contract (docs/architecture.md#decision-7-one-adapter-per-job-kind): a minimal managed job of each
kind is suspended and gated by its ``suspend_patch`` (applied with the strict RFC 6902 applier below,
which fails on a missing parent exactly as the apiserver does), re-mutating it yields a valid patch, its
pod sets are non-empty, ``resume_patch`` releases it and ``pod_set_of`` maps a pod built from every
template.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koord_queue.shared.api import names
from koord_queue.shared.jobs import base, registry
from koord_queue.shared.jobs.base import JobAdapter, JobSpecError, JobStatus
from koord_queue.shared.jobs.patches import escape, pointer
from koord_queue.shared.jobs.podspec import parse_min_resources, pod_requests

NOW = "2025-01-02T03:04:05Z"
QUOTA = {names.QUOTA_NAME_LABEL: "team-a"}
GATED = {
    "job",
    "tfjob",
    "pytorchjob",
    "paddlejob",
    "xgboostjob",
    "jaxjob",
    "mpijob",
    "jobset",
    "rayjob",
    "rayjobv1alpha1",
    "raycluster",
}
GATE = {"name": names.ADMISSION_GATE}
WF_PATH = f"metadata.annotations[{names.MIN_RESOURCES_ANNOTATION}]"


# --- RFC 6902 / RFC 7386 appliers (strict: a missing parent is an error, as in the apiserver) -----


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def apply_patch(doc: dict[str, Any], ops: list[base.JsonPatchOp]) -> dict[str, Any]:
    result = copy.deepcopy(doc)
    for op in ops:
        assert op["path"].startswith("/"), op
        tokens = [_unescape(t) for t in op["path"].split("/")[1:]]
        parent: Any = result
        for token in tokens[:-1]:
            parent = parent[int(token)] if isinstance(parent, list) else parent[token]
        last = tokens[-1]
        if op["op"] == "add":
            if isinstance(parent, list):
                parent.append(op["value"]) if last == "-" else parent.insert(int(last), op["value"])
            else:
                assert isinstance(parent, dict), f"parent of {op['path']} is not an object"
                parent[last] = copy.deepcopy(op["value"])
        elif op["op"] == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        elif op["op"] == "replace":
            assert last in parent
            parent[last] = copy.deepcopy(op["value"])
        else:
            raise AssertionError(f"unexpected op {op}")
    return result


def merge_patch(doc: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(doc) if isinstance(doc, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# --- builders -------------------------------------------------------------------------------------


def container(cpu: str = "1", memory: str = "1Gi", **extra: Any) -> dict[str, Any]:
    return {
        "name": "c",
        "image": "busybox",
        "resources": {"requests": {"cpu": cpu, "memory": memory}},
        **extra,
    }


def template(*containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"spec": {"containers": list(containers) or [container()], **spec}}


def meta(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": "ns", "labels": dict(QUOTA), **extra}


def batch_job(**spec: Any) -> dict[str, Any]:
    body = {"parallelism": 2, "template": template(), **spec}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta("train"), "spec": body}


#: The Kubeflow kinds not served as ``kubeflow.org/v1`` (the MPI operator's own version).
KUBEFLOW_VERSIONS = {"MPIJob": "kubeflow.org/v2beta1"}


def kubeflow_job(kind: str, field: str, roles: dict[str, int | None]) -> dict[str, Any]:
    specs = {role: {"replicas": n, "template": template()} for role, n in roles.items()}
    api_version = KUBEFLOW_VERSIONS.get(kind, "kubeflow.org/v1")
    return {"apiVersion": api_version, "kind": kind, "metadata": meta("tf"), "spec": {field: specs}}


def replicated_job(name: str, replicas: int | None = 1, **job_spec: Any) -> dict[str, Any]:
    """One entry of a JobSet's ``spec.replicatedJobs``: ``replicas`` Jobs of this Job spec."""
    entry: dict[str, Any] = {"name": name, "template": {"spec": {"template": template(), **job_spec}}}
    if replicas is not None:
        entry["replicas"] = replicas
    return entry


def job_set(*entries: dict[str, Any]) -> dict[str, Any]:
    jobs = list(entries) or [replicated_job("driver"), replicated_job("workers", 2, parallelism=3)]
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": meta("js"),
        "spec": {"replicatedJobs": jobs},
    }


def ray_cluster_spec(*groups: tuple[str | None, int | None]) -> dict[str, Any]:
    workers = []
    for name, replicas in groups:
        group: dict[str, Any] = {"replicas": replicas, "template": template(container("2", "4Gi"))}
        if name is not None:
            group["groupName"] = name
        workers.append(group)
    return {"headGroupSpec": {"template": template()}, "workerGroupSpecs": workers}


def ray_job(api_version: str = "ray.io/v1") -> dict[str, Any]:
    spec = {"entrypoint": "python x.py", "rayClusterSpec": ray_cluster_spec(("Small-Group", 2))}
    return {"apiVersion": api_version, "kind": "RayJob", "metadata": meta("ray"), "spec": spec}


def ray_cluster() -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": meta("rc"),
        "spec": ray_cluster_spec((None, 3)),
    }


def workflow(min_resources: str | None = '{"cpu": "4", "memory": "8Gi"}') -> dict[str, Any]:
    metadata = meta("wf")
    if min_resources is not None:
        metadata["annotations"] = {names.MIN_RESOURCES_ANNOTATION: min_resources}
    spec = {"entrypoint": "main", "templates": [{"name": "main", "container": {"image": "busybox"}}]}
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "metadata": metadata, "spec": spec}


def spark_app(**spec: Any) -> dict[str, Any]:
    body = {
        "type": "Scala",
        "mode": "cluster",
        "driver": {"cores": 1, "memory": "512m"},
        "executor": {"instances": 2, "cores": 2, "memory": "1g", "memoryOverhead": "512m"},
        **spec,
    }
    return {
        "apiVersion": "sparkoperator.k8s.io/v1beta2",
        "kind": "SparkApplication",
        "metadata": meta("sp"),
        "spec": body,
    }


SAMPLES = {
    "job": batch_job,
    "tfjob": lambda: kubeflow_job("TFJob", "tfReplicaSpecs", {"PS": 1, "Worker": 2}),
    "pytorchjob": lambda: kubeflow_job("PyTorchJob", "pytorchReplicaSpecs", {"Master": 1, "Worker": 3}),
    "paddlejob": lambda: kubeflow_job("PaddleJob", "paddleReplicaSpecs", {"Master": 1, "Worker": 2}),
    "xgboostjob": lambda: kubeflow_job("XGBoostJob", "xgbReplicaSpecs", {"Master": 1, "Worker": 2}),
    "jaxjob": lambda: kubeflow_job("JAXJob", "jaxReplicaSpecs", {"Worker": 2}),
    "mpijob": lambda: kubeflow_job("MPIJob", "mpiReplicaSpecs", {"Launcher": 1, "Worker": 2}),
    "jobset": job_set,
    "rayjob": ray_job,
    "rayjobv1alpha1": lambda: ray_job("ray.io/v1alpha1"),
    "raycluster": ray_cluster,
    "workflow": workflow,
    "sparkapp": spark_app,
}
ADAPTERS = {adapter.extension: adapter for adapter in registry.ADAPTERS}


def pod_from(pod_template: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": copy.deepcopy(pod_template.get("metadata", {})), "spec": pod_template.get("spec", {})}


# --- the contract ---------------------------------------------------------------------------------


def sample_disagreements(samples: Mapping[str, Callable[[], dict[str, Any]]] = SAMPLES) -> list[str]:
    """Registered extensions without a sample in ``SAMPLES`` and samples of no registered extension
    (docs/development.md#adding-a-job-kind); read at call time, so a test may register a kind."""
    extensions = set(registry.EXTENSIONS)
    return [
        *(
            f"tests/unit/test_job_adapters.py: no sample in SAMPLES for {e!r}"
            for e in sorted(extensions - set(samples))
        ),
        *(
            f"tests/unit/test_job_adapters.py: SAMPLES has {e!r}, no adapter does"
            for e in sorted(set(samples) - extensions)
        ),
    ]


def test_every_registered_adapter_has_a_sample() -> None:
    assert sample_disagreements() == []


@pytest.fixture(params=registry.EXTENSIONS)
def case(request: pytest.FixtureRequest) -> tuple[JobAdapter, dict[str, Any]]:
    adapter = registry.by_extension(request.param)
    job = SAMPLES[request.param]()
    assert (job["apiVersion"], job["kind"]) == (adapter.api_version, adapter.kind)
    return adapter, job


def test_a_fresh_labelled_job_is_managed_and_not_started(case: tuple[JobAdapter, dict[str, Any]]) -> None:
    adapter, job = case
    assert adapter.is_managed(job)
    assert adapter.quota_name(job) == "team-a"
    assert not adapter.is_suspended(job)
    assert adapter.job_status(job) in (JobStatus.CREATED, JobStatus.PENDING)


def test_an_unlabelled_job_is_not_managed(case: tuple[JobAdapter, dict[str, Any]]) -> None:
    adapter, job = case
    del job["metadata"]["labels"]
    assert not adapter.is_managed(job)
    job["metadata"]["labels"] = {names.QUOTA_NAME_LABEL_FALLBACK: "legacy"}
    assert adapter.is_managed(job) and adapter.quota_name(job) == "legacy"


def kuberay_default_submitter(job: dict[str, Any], pod_set: str) -> bool:
    """The pod set is a RayJob's submitter without a declared template (docs/compatibility.md#rayjob)."""
    return (
        job.get("kind") == "RayJob" and pod_set == "submitter" and "submitterPodTemplate" not in job["spec"]
    )


def test_suspend_patch_holds_gates_and_stamps_the_job(case: tuple[JobAdapter, dict[str, Any]]) -> None:
    adapter, job = case
    original = copy.deepcopy(job)
    mutated = apply_patch(job, adapter.suspend_patch(job, now_text=NOW))
    assert job == original, "the adapter must not modify its input"
    assert adapter.is_suspended(mutated)
    assert all(adapter.suspend_state(mutated).values())
    annotations = mutated["metadata"]["annotations"]
    assert annotations[names.JOB_HAS_ENQUEUED_ANNOTATION] == "true"
    assert annotations[names.JOB_ENQUEUE_TIMESTAMP_ANNOTATION] == NOW
    assert adapter.job_status(mutated) is JobStatus.QUEUING
    pod_sets = adapter.pod_sets(mutated)
    assert pod_sets and all(p.count >= 0 for p in pod_sets)
    for pod_set in pod_sets:
        if kuberay_default_submitter(mutated, pod_set.name):
            continue  # KubeRay builds its template: none in the job to gate
        gates = pod_set.template.get("spec", {}).get("schedulingGates", [])
        assert gates.count(GATE) == (1 if adapter.extension in GATED else 0)
        assert adapter.pod_set_of(pod_from(pod_set.template)) == pod_set.name
    # Nothing outside metadata.annotations and spec is touched.
    assert {k: v for k, v in mutated.items() if k not in ("metadata", "spec")} == {
        k: v for k, v in original.items() if k not in ("metadata", "spec")
    }
    assert mutated["metadata"]["labels"] == original["metadata"]["labels"]


def test_mutating_a_mutated_job_gives_a_valid_patch_and_no_duplicates(
    case: tuple[JobAdapter, dict[str, Any]],
) -> None:
    adapter, job = case
    once = apply_patch(job, adapter.suspend_patch(job, now_text=NOW))
    twice = apply_patch(once, adapter.suspend_patch(once, now_text=NOW))
    assert twice == once


def test_resume_then_suspend_merge_patches(case: tuple[JobAdapter, dict[str, Any]]) -> None:
    adapter, job = case
    queued = apply_patch(job, adapter.suspend_patch(job, now_text=NOW))
    resumed = merge_patch(queued, adapter.resume_patch(queued, now_text="later"))
    assert not adapter.is_suspended(resumed)
    assert not any(adapter.suspend_state(resumed).values())
    assert base.is_dequeued(resumed)
    assert adapter.job_status(resumed) in (JobStatus.PENDING, JobStatus.RUNNING)
    held = merge_patch(resumed, adapter.suspend_merge_patch(resumed))
    assert adapter.is_suspended(held) and not base.is_dequeued(held)
    assert adapter.job_status(held) is JobStatus.QUEUING


def test_a_held_job_passes_its_own_kind_rules(case: tuple[JobAdapter, dict[str, Any]]) -> None:
    """What the webhook stores on CREATE is accepted by the kind's rules, on CREATE and on an
    UPDATE that changes nothing (the controllers' own writes)."""
    adapter, job = case
    held = apply_patch(job, adapter.suspend_patch(job, now_text=NOW))
    assert adapter.admission_errors(None, held) == []
    assert adapter.admission_errors(held, copy.deepcopy(held)) == []


def test_only_the_workflow_crd_lacks_a_status_subresource(case: tuple[JobAdapter, dict[str, Any]]) -> None:
    adapter, _ = case
    assert adapter.status_subresource is (adapter.kind != "Workflow")


def test_identity_and_queue_unit_name(case: tuple[JobAdapter, dict[str, Any]]) -> None:
    adapter, job = case
    name = job["metadata"]["name"]
    expected = f"{name}-{adapter.queue_unit_suffix}" if adapter.queue_unit_suffix else name
    assert adapter.queue_unit_name(job) == expected
    assert adapter.plural == adapter.plural.lower() and adapter.plural.endswith("s")
    class_name, value = adapter.priority(job)
    assert class_name is None or isinstance(class_name, str)
    assert value is None or isinstance(value, int)


def test_total_request_is_the_sum_over_pod_sets(case: tuple[JobAdapter, dict[str, Any]]) -> None:
    adapter, job = case
    total = base.total_request(adapter, job)
    expected: dict[str, int] = {}
    for pod_set in adapter.pod_sets(job):
        for resource, milli in pod_set.per_pod.items():
            expected[resource] = expected.get(resource, 0) + milli * pod_set.count
    assert total == dict(sorted(expected.items()))


def test_predicates_are_total_on_garbage(case: tuple[JobAdapter, dict[str, Any]]) -> None:
    adapter, _ = case
    for garbage in ({}, {"metadata": 1, "spec": [], "status": "x"}, {"spec": {"suspend": "yes"}}):
        adapter.is_managed(garbage)
        adapter.is_suspended(garbage)
        adapter.job_status(garbage)
        adapter.priority(garbage)
        adapter.pod_set_of(garbage)
        assert all(isinstance(e, JobSpecError) for e in adapter.admission_errors(None, garbage))

        assert all(isinstance(e, JobSpecError) for e in adapter.admission_errors(garbage, garbage))
        try:  # an unreadable spec is reported, never a KeyError/TypeError
            ops = adapter.suspend_patch({"metadata": {"labels": QUOTA}, "spec": 5}, now_text=NOW)
        except JobSpecError:
            continue
        assert all(not op["path"].startswith("/spec/") for op in ops)


#: The contract every adapter meets on its sample (the ``case`` tests above, in order).
CONTRACT: tuple[Callable[[tuple[JobAdapter, dict[str, Any]]], None], ...] = (
    test_a_fresh_labelled_job_is_managed_and_not_started,
    test_an_unlabelled_job_is_not_managed,
    test_suspend_patch_holds_gates_and_stamps_the_job,
    test_mutating_a_mutated_job_gives_a_valid_patch_and_no_duplicates,
    test_resume_then_suspend_merge_patches,
    test_a_held_job_passes_its_own_kind_rules,
    test_only_the_workflow_crd_lacks_a_status_subresource,
    test_identity_and_queue_unit_name,
    test_total_request_is_the_sum_over_pod_sets,
    test_predicates_are_total_on_garbage,
)


def contract_failures(adapter: JobAdapter, sample: Callable[[], dict[str, Any]]) -> list[str]:
    """The contract run on ``adapter`` outside the ``case`` fixture (whose kinds are fixed when this
    module is collected): tests/unit/test_kind_registry.py runs it on a kind it registers itself.
    Empty when the adapter meets it; else the failing checks by name."""
    if (sample()["apiVersion"], sample()["kind"]) != (adapter.api_version, adapter.kind):
        return [f"the sample is not a {adapter.api_version} {adapter.kind}"]
    failures = []
    for check in CONTRACT:
        try:
            check((adapter, sample()))
        except AssertionError as error:
            failures.append(f"{check.__name__}: {error}")
    return failures


def test_the_contract_list_is_every_case_test() -> None:
    """A contract test added above but not to ``CONTRACT`` would skip a registered-by-test kind."""
    case_tests = {
        name
        for name, value in globals().items()
        if name.startswith("test_") and callable(value) and "case" in inspect.signature(value).parameters
    }
    assert case_tests == {check.__name__ for check in CONTRACT}


# --- JSON Patch construction ----------------------------------------------------------------------


def test_pointer_escapes_tilde_and_slash() -> None:
    assert escape("a~b/c") == "a~0b~1c"
    assert (
        pointer(("metadata", "annotations", "koord-queue/x~y")) == "/metadata/annotations/koord-queue~1x~0y"
    )


def test_missing_parents_are_created_in_order() -> None:
    job = batch_job()
    ops = ADAPTERS["job"].suspend_patch(job, now_text=NOW)
    paths = [op["path"] for op in ops]
    assert paths.index("/metadata/annotations") < paths.index(
        "/metadata/annotations/koord-queue~1job-has-enqueued"
    )
    assert paths.index("/spec/template/metadata") < paths.index("/spec/template/metadata/annotations")
    assert {"op": "add", "path": "/spec/template/spec/schedulingGates", "value": [GATE]} in ops


def test_kubeflow_run_policy_is_created_before_its_suspend_field() -> None:
    job = SAMPLES["tfjob"]()
    paths = [op["path"] for op in ADAPTERS["tfjob"].suspend_patch(job, now_text=NOW)]
    assert paths.index("/spec/runPolicy") < paths.index("/spec/runPolicy/suspend")


def test_a_user_supplied_dequeue_stamp_is_removed_on_create() -> None:
    job = batch_job()
    job["metadata"]["annotations"] = {names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION: "forged"}
    mutated = apply_patch(job, ADAPTERS["job"].suspend_patch(job, now_text=NOW))
    assert not base.is_dequeued(mutated)


def test_existing_gates_are_kept_and_ours_appended() -> None:
    job = batch_job()
    job["spec"]["template"]["spec"]["schedulingGates"] = [{"name": "other"}]
    mutated = apply_patch(job, ADAPTERS["job"].suspend_patch(job, now_text=NOW))
    assert mutated["spec"]["template"]["spec"]["schedulingGates"] == [{"name": "other"}, GATE]


@settings(max_examples=150, deadline=None)
@given(
    annotations=st.one_of(st.none(), st.just({}), st.dictionaries(st.text(max_size=8), st.text(max_size=4))),
    template_meta=st.one_of(
        st.none(), st.just({}), st.just({"annotations": None}), st.just({"labels": {"a": "b"}})
    ),
    gates=st.one_of(st.none(), st.just([]), st.just([{"name": "x"}]), st.just([GATE])),
    suspend=st.sampled_from([None, True, False]),
)
def test_job_patches_apply_whatever_the_object_shape(
    annotations: dict[str, str] | None, template_meta: dict[str, Any] | None, gates: Any, suspend: bool | None
) -> None:
    job = batch_job()
    if annotations is not None:
        job["metadata"]["annotations"] = annotations
    if template_meta is not None:
        job["spec"]["template"]["metadata"] = template_meta
    if gates is not None:
        job["spec"]["template"]["spec"]["schedulingGates"] = gates
    if suspend is not None:
        job["spec"]["suspend"] = suspend
    mutated = apply_patch(job, ADAPTERS["job"].suspend_patch(job, now_text=NOW))
    assert mutated["spec"]["suspend"] is True
    assert mutated["spec"]["template"]["spec"]["schedulingGates"].count(GATE) == 1
    for key, value in (annotations or {}).items():
        ours = (
            names.JOB_HAS_ENQUEUED_ANNOTATION,
            names.JOB_ENQUEUE_TIMESTAMP_ANNOTATION,
            names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION,
        )
        if key not in ours:
            assert mutated["metadata"]["annotations"][key] == value


# --- per-kind tables: pod sets --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("parallelism", "completions", "succeeded", "count"),
    [
        (None, None, None, 1),
        (3, None, None, 3),
        (3, 10, 8, 2),
        (5, 2, None, 2),
        (0, None, None, 0),
        (2, 4, 4, 0),
        (2, 4, 9, 0),
    ],
)
def test_batch_job_pod_set_count(
    parallelism: int | None, completions: int | None, succeeded: int | None, count: int
) -> None:
    job = batch_job(parallelism=parallelism, completions=completions)
    if succeeded is not None:
        job["status"] = {"succeeded": succeeded}
    [pod_set] = ADAPTERS["job"].pod_sets(job)
    assert (pod_set.name, pod_set.count) == ("train", count)
    assert pod_set.per_pod == {"cpu": 1000, "memory": 1024**3 * 1000}


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda j: j["spec"].update(parallelism="3"), "spec.parallelism"),
        (lambda j: j["spec"].update(parallelism=-1), "spec.parallelism"),
        (lambda j: j["spec"].update(template=None), "spec.template"),
        (lambda j: j["spec"]["template"]["spec"].update(containers={}), "spec.template.spec.containers"),
        (
            lambda j: j["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"].update(
                cpu="lots"
            ),
            "spec.template.spec.containers[0].resources.requests[cpu]",
        ),
        (
            lambda j: j["spec"]["template"]["spec"]["containers"][0]["resources"].update(limits=[]),
            "spec.template.spec.containers[0].resources.limits",
        ),
    ],
)
def test_unreadable_specs_raise_job_spec_error_with_the_path(mutate: Any, path: str) -> None:
    job = batch_job()
    mutate(job)
    with pytest.raises(JobSpecError) as info:
        ADAPTERS["job"].pod_sets(job)
    assert info.value.path == path


def test_pod_requests_follow_the_scheduler_rule() -> None:
    spec = {
        "containers": [
            container("1", "1Gi"),
            {"name": "limits-only", "resources": {"limits": {"cpu": "500m", "nvidia.com/gpu": "1"}}},
        ],
        "initContainers": [
            {"name": "big-init", "resources": {"requests": {"cpu": "4"}}},
            {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "250m"}}},
            {"name": "late-init", "resources": {"requests": {"memory": "3Gi"}}},
        ],
        "overhead": {"cpu": "100m"},
    }
    gib = 1024**3 * 1000
    # steady: 1 + 0.5 + 0.25 (sidecar) cpu; init peak: 4 cpu alone, then 3Gi + 0.25 cpu.
    assert pod_requests(spec, "spec") == {"cpu": 4100, "memory": 3 * gib, "nvidia.com/gpu": 1000}


def test_kubeflow_pod_sets_are_lowercased_replica_types() -> None:
    job = kubeflow_job("PyTorchJob", "pytorchReplicaSpecs", {"Worker": None, "Master": 1})
    pod_sets = ADAPTERS["pytorchjob"].pod_sets(job)
    assert [(p.name, p.count) for p in pod_sets] == [("master", 1), ("worker", 1)]


@pytest.mark.parametrize(
    ("extension", "kind", "field", "roles"),
    [
        ("tfjob", "TFJob", "tfReplicaSpecs", {"Chief": 1, "PS": 2, "Worker": 3}),
        ("pytorchjob", "PyTorchJob", "pytorchReplicaSpecs", {"Master": 1, "Worker": 3}),
        ("paddlejob", "PaddleJob", "paddleReplicaSpecs", {"Master": 1, "Worker": 3}),
        ("xgboostjob", "XGBoostJob", "xgbReplicaSpecs", {"Master": 1, "Worker": 3}),
        ("jaxjob", "JAXJob", "jaxReplicaSpecs", {"Worker": 3}),
        ("mpijob", "MPIJob", "mpiReplicaSpecs", {"Launcher": 1, "Worker": 3}),
    ],
)
def test_each_kubeflow_kind_reads_only_its_own_replica_specs(
    extension: str, kind: str, field: str, roles: dict[str, int]
) -> None:
    adapter = ADAPTERS[extension]
    job = kubeflow_job(kind, field, roles)
    assert [(p.name, p.count) for p in adapter.pod_sets(job)] == [
        (r.lower(), n) for r, n in sorted(roles.items())
    ]
    paths = {op["path"] for op in adapter.suspend_patch(job, now_text=NOW)}
    assert {f"/spec/{field}/{role}/template/spec/schedulingGates" for role in roles} <= paths
    other = "tfReplicaSpecs" if field != "tfReplicaSpecs" else "pytorchReplicaSpecs"
    with pytest.raises(JobSpecError, match=f"spec.{field}"):
        adapter.pod_sets(kubeflow_job(kind, other, roles))


def test_ray_pod_sets_are_head_and_worker_groups() -> None:
    job = ray_job()
    job["spec"]["rayClusterSpec"] = ray_cluster_spec(("GPU", 4), (None, None))
    pod_sets = ADAPTERS["rayjob"].pod_sets(job)
    assert [(p.name, p.count) for p in pod_sets] == [("head", 1), ("gpu", 4), ("worker", 1), ("submitter", 1)]
    assert pod_sets[1].per_pod == {"cpu": 2000, "memory": 4 * 1024**3 * 1000}


def test_ray_duplicate_group_names_are_rejected() -> None:
    job = ray_job()
    job["spec"]["rayClusterSpec"] = ray_cluster_spec(("a", 1), ("A", 1))
    with pytest.raises(JobSpecError, match="Duplicate"):
        ADAPTERS["rayjob"].pod_sets(job)


# JobSet (docs/compatibility.md#jobset): one pod set per replicated job, ``replicas`` Jobs of
# ``min(parallelism, completions)`` pods each.
@pytest.mark.parametrize(
    ("entry", "count"),
    [
        (replicated_job("a"), 1),
        (replicated_job("a", None), 1),  # replicas defaults to 1, as the JobSet CRD defaults it
        (replicated_job("a", 4, parallelism=2), 8),
        (
            replicated_job("a", 3, parallelism=4, completions=2),
            6,
        ),  # a Job never runs more than its completions
        (replicated_job("a", 2, completions=5), 2),  # parallelism defaults to 1
        (replicated_job("a", 0, parallelism=2), 0),
    ],
)
def test_jobset_pod_sets_are_replicated_jobs_times_pods_per_job(entry: dict[str, Any], count: int) -> None:
    [pod_set] = ADAPTERS["jobset"].pod_sets(job_set(entry))
    assert (pod_set.name, pod_set.count) == ("a", count)
    assert pod_set.per_pod == {"cpu": 1000, "memory": 1024**3 * 1000}


def test_jobset_pod_sets_keep_spec_order_and_names() -> None:
    job = job_set(replicated_job("workers", 2, parallelism=2), replicated_job("driver"))
    assert [(p.name, p.count) for p in ADAPTERS["jobset"].pod_sets(job)] == [("workers", 4), ("driver", 1)]


@pytest.mark.parametrize(
    ("entries", "path", "detail"),
    [
        ([{"template": {"spec": {"template": template()}}}], "spec.replicatedJobs[0].name", "Required"),
        (
            [replicated_job("a", 1), {"name": "b", "replicas": "2"}],
            "spec.replicatedJobs[1].replicas",
            "Invalid",
        ),
        ([{"name": "a", "replicas": 1}], "spec.replicatedJobs[0].template.spec", "Required"),
        (
            [{"name": "a", "template": {"spec": {}}}],
            "spec.replicatedJobs[0].template.spec.template",
            "Required",
        ),
        (
            [replicated_job("a", parallelism=-1)],
            "spec.replicatedJobs[0].template.spec.parallelism",
            "Invalid",
        ),
        ([replicated_job("a"), replicated_job("a")], "spec.replicatedJobs", "Duplicate"),
        ("workers", "spec.replicatedJobs", "Invalid"),
    ],
)
def test_an_unreadable_jobset_names_the_field(entries: Any, path: str, detail: str) -> None:
    job = job_set()
    job["spec"]["replicatedJobs"] = entries
    with pytest.raises(JobSpecError) as info:
        ADAPTERS["jobset"].pod_sets(job)
    assert info.value.path == path and info.value.detail.startswith(detail), info.value


def test_every_replicated_jobs_pod_template_is_gated_and_linked_and_its_pods_map_back() -> None:
    """The JobSet controller copies each replicated job's pod template into every child Job, so the
    gate and the links written there reach every pod; the Job template's own metadata stays as it
    was (the controller copies it onto the child Jobs)."""
    adapter = ADAPTERS["jobset"]
    job = job_set()
    job["spec"]["replicatedJobs"][1]["template"]["metadata"] = {"labels": {"team": "a"}}
    stored = apply_patch(job, adapter.suspend_patch(job, now_text=NOW))
    assert stored["spec"]["suspend"] is True
    for entry in stored["spec"]["replicatedJobs"]:
        pod_template = entry["template"]["spec"]["template"]
        assert pod_template["spec"]["schedulingGates"] == [GATE]
        assert pod_template["metadata"]["annotations"] == {
            names.RELATED_QUEUEUNIT_ANNOTATION: "ns/js-jobset-qu",
            names.RELATED_PODSET_ANNOTATION: entry["name"],
        }
        # A pod of a child Job: the template plus the controller's labels.
        pod = pod_from(pod_template)
        pod["metadata"]["labels"] = {"jobset.sigs.k8s.io/replicatedjob-name": entry["name"]}
        assert adapter.pod_set_of(pod) == entry["name"]
        del pod["metadata"]["annotations"]
        assert adapter.pod_set_of(pod) == entry["name"]
    assert stored["spec"]["replicatedJobs"][1]["template"]["metadata"] == {"labels": {"team": "a"}}


def test_a_generate_name_jobset_is_linked_by_its_release_in_one_conditional_patch() -> None:
    """Under ``generateName`` the webhook cannot name the unit; the resume writes the links into
    each pod template (through the list, so the patch carries the whole list and is conditional on
    the version it was built from)."""
    adapter = ADAPTERS["jobset"]
    job = job_set()
    del job["metadata"]["name"]
    stored = apply_patch(job, adapter.suspend_patch(job, now_text=NOW))
    assert names.RELATED_QUEUEUNIT_ANNOTATION not in str(stored["spec"])
    stored["metadata"].update(name="js-x7k2p", resourceVersion="42")
    patch = adapter.resume_patch(stored, now_text="later")
    assert patch["metadata"]["resourceVersion"] == "42"
    assert patch["spec"]["suspend"] is False
    released = merge_patch(stored, patch)
    for entry in released["spec"]["replicatedJobs"]:
        annotations = entry["template"]["spec"]["template"]["metadata"]["annotations"]
        assert annotations[names.RELATED_QUEUEUNIT_ANNOTATION] == "ns/js-x7k2p-jobset-qu"
        assert annotations[names.RELATED_PODSET_ANNOTATION] == entry["name"]
        assert entry["template"]["spec"]["template"]["spec"]["schedulingGates"] == [GATE]


def test_mpijob_pod_sets_are_its_launcher_and_workers_and_its_pods_map_by_job_role() -> None:
    """The MPI operator labels its pods with the role, not the replica type; the launcher pod is
    created by a Job the operator makes from the Launcher template, so it carries that template's
    annotations too."""
    adapter = ADAPTERS["mpijob"]
    job = kubeflow_job("MPIJob", "mpiReplicaSpecs", {"Worker": 4, "Launcher": None})
    assert (adapter.api_version, adapter.queue_unit_name(job)) == ("kubeflow.org/v2beta1", "tf-mpi-qu")
    assert [(p.name, p.count) for p in adapter.pod_sets(job)] == [("launcher", 1), ("worker", 4)]
    for role in ("launcher", "worker"):
        pod = {"metadata": {"labels": {"training.kubeflow.org/job-role": role}}}
        assert adapter.pod_set_of(pod) == role


def test_only_mpijob_jobset_and_rayjob_have_pods_owned_by_child_jobs() -> None:
    """A RayJob's submitter pod is owned by KubeRay's submitter Job (docs/compatibility.md#rayjob)."""
    expected = {"mpijob", "jobset", "rayjob", "rayjobv1alpha1"}
    assert {a.extension for a in registry.ADAPTERS if a.pods_through_jobs} == expected


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({}, [("driver", 1, 1000, 512), ("executor", 2, 2000, 1536)]),
        ({"mode": "client"}, [("executor", 2, 2000, 1536)]),
        (
            {"executor": {"coreRequest": "500m", "cores": 4, "memory": "2g"}, "driver": {"coreLimit": "2"}},
            [("driver", 1, 2000, 0), ("executor", 1, 500, 2048)],
        ),
        (
            {
                "executor": {"cores": 1, "memory": "1024"},
                "dynamicAllocation": {"enabled": True, "initialExecutors": 5},
            },
            [("driver", 1, 1000, 512), ("executor", 5, 1000, 1024)],
        ),
    ],
)
def test_spark_pod_sets(spec: dict[str, Any], expected: list[tuple[str, int, int, int]]) -> None:
    pod_sets = ADAPTERS["sparkapp"].pod_sets(spark_app(**spec))
    mib = 1024**2 * 1000
    got = [(p.name, p.count, p.per_pod.get("cpu", 0), p.per_pod.get("memory", 0) // mib) for p in pod_sets]
    assert got == expected


def test_spark_gpu_and_bad_memory() -> None:
    job = spark_app(executor={"instances": 1, "gpu": {"name": "nvidia.com/gpu", "quantity": 2}})
    assert ADAPTERS["sparkapp"].pod_sets(job)[1].per_pod == {"nvidia.com/gpu": 2000}
    with pytest.raises(JobSpecError) as info:
        ADAPTERS["sparkapp"].pod_sets(spark_app(driver={"memory": "1.5x"}))
    assert info.value.path == "spec.driver.memory"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"cpu": "4", "memory": "8Gi"}', {"cpu": 4000, "memory": 8 * 1024**3 * 1000}),
        ("cpu: 2\nmemory: 1Gi\n", {"cpu": 2000, "memory": 1024**3 * 1000}),
        ("cpu: 0.5", {"cpu": 500}),
        ("", {}),
    ],
)
def test_min_resources_json_or_yaml(text: str, expected: dict[str, int]) -> None:
    assert parse_min_resources(text, "a") == expected


@pytest.mark.parametrize("text", ["{not json", "- a\n- b", "cpu: [1]", "cpu: -1", "{1: 2}", "[" * 5000])
def test_min_resources_errors_are_job_spec_errors(text: str) -> None:
    with pytest.raises(JobSpecError):
        parse_min_resources(text, "a")


def test_workflow_pod_set_from_min_resources() -> None:
    [pod_set] = ADAPTERS["workflow"].pod_sets(workflow())
    assert (pod_set.name, pod_set.count) == ("default", 1)
    assert pod_set.per_pod == {"cpu": 4000, "memory": 8 * 1024**3 * 1000}
    assert pod_set.template["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "4", "memory": "8Gi"}


@pytest.mark.parametrize("min_resources", [None, "", "{}", "cpu: 0", '{"cpu": "0", "memory": "0"}'])
def test_a_workflow_that_declares_no_size_has_no_pod_sets_but_an_error_naming_the_annotation(
    min_resources: str | None,
) -> None:
    """The reconciler's half of the rule (the webhook's is ``admission_errors``): a Workflow stored
    without a size gets no QueueUnit, so it stays held instead of running uncharged."""
    with pytest.raises(JobSpecError) as info:
        ADAPTERS["workflow"].pod_sets(workflow(min_resources))
    assert info.value.path == WF_PATH
    assert info.value.detail.startswith("Required value: ")
    assert names.MIN_RESOURCES_ANNOTATION in info.value.detail


def test_workflow_suspend_template_is_appended_once() -> None:
    adapter = ADAPTERS["workflow"]
    job = workflow()
    once = apply_patch(job, adapter.suspend_patch(job, now_text=NOW))
    templates = once["spec"]["templates"]
    assert templates[-1] == {"name": names.WORKFLOW_SUSPEND_TEMPLATE, "suspend": {}}
    del job["spec"]["templates"]
    created = apply_patch(job, adapter.suspend_patch(job, now_text=NOW))
    assert created["spec"]["templates"] == [{"name": names.WORKFLOW_SUSPEND_TEMPLATE, "suspend": {}}]


# --- per-kind rules for a namespace user's writes (admission_errors) ------------------------------


def queued(job: dict[str, Any]) -> dict[str, Any]:
    """``job`` as the webhook stores it on CREATE."""
    return apply_patch(job, ADAPTERS[EXTENSION_OF[job["kind"]]].suspend_patch(job, now_text=NOW))


EXTENSION_OF = {"Workflow": "workflow", "SparkApplication": "sparkapp"}


@pytest.mark.parametrize("value", [None, "", "{}", "cpu: 0"])
def test_a_workflow_without_a_size_is_refused_with_the_annotation_why_and_an_example(
    value: str | None,
) -> None:
    [error] = ADAPTERS["workflow"].admission_errors(None, queued(workflow(value)))
    assert error.path == WF_PATH
    assert error.detail.startswith("Required value: ")
    assert names.MIN_RESOURCES_ANNOTATION in error.detail
    assert "cannot be counted up front" in error.detail
    assert """koord-queue/min-resources: '{"cpu": "4", "memory": "8Gi"}'""" in error.detail
    # ...and the example it gives is itself accepted.
    example = error.detail.rsplit(f"{names.MIN_RESOURCES_ANNOTATION}: ", 1)[1].strip("'")
    assert ADAPTERS["workflow"].admission_errors(None, queued(workflow(example))) == []


@pytest.mark.parametrize("value", ["cpu: 2", '{"memory": "1Gi"}', "cpu: 0\nnvidia.com/gpu: 1"])
def test_a_workflow_with_a_size_is_accepted(value: str) -> None:
    assert ADAPTERS["workflow"].admission_errors(None, queued(workflow(value))) == []


def test_an_unreadable_size_is_left_to_the_annotation_checks() -> None:
    """``validation.validate_job_annotations`` reports it as Invalid; no second error here."""
    assert ADAPTERS["workflow"].admission_errors(None, queued(workflow("cpu: [1, 2]"))) == []


def _with_min_resources(job: dict[str, Any], value: str | None) -> dict[str, Any]:
    changed = copy.deepcopy(job)
    annotations = changed["metadata"]["annotations"]
    if value is None:
        del annotations[names.MIN_RESOURCES_ANNOTATION]
    else:
        annotations[names.MIN_RESOURCES_ANNOTATION] = value
    return changed


@pytest.mark.parametrize(
    ("new_value", "refused"),
    [
        ('{"cpu": "4", "memory": "8Gi"}', False),
        ("cpu: 4\nmemory: 8Gi", False),  # the same size, written as YAML
        ('{"cpu": "1", "memory": "8Gi"}', True),
        ('{"cpu": "40", "memory": "8Gi"}', True),
        ("{}", True),
        ("cpu: [1]", True),
        (None, True),
    ],
)
def test_a_queued_workflows_size_is_frozen(new_value: str | None, refused: bool) -> None:
    old = queued(workflow())
    errors = ADAPTERS["workflow"].admission_errors(old, _with_min_resources(old, new_value))
    if not refused:
        assert errors == []
        return
    [error] = errors
    assert error.path == WF_PATH
    assert error.detail.startswith("Forbidden: ")
    assert names.MIN_RESOURCES_ANNOTATION in error.detail and "until the workflow finishes" in error.detail


def test_a_running_workflows_size_is_frozen_and_a_finished_ones_is_not() -> None:
    adapter = ADAPTERS["workflow"]
    running = merge_patch(queued(workflow()), adapter.resume_patch(queued(workflow()), now_text="t"))
    running["status"] = {"phase": "Running"}
    assert adapter.admission_errors(running, _with_min_resources(running, "cpu: 1"))
    finished = {**running, "status": {"phase": "Succeeded"}}
    assert adapter.admission_errors(finished, _with_min_resources(finished, "cpu: 1")) == []


def test_a_held_workflow_claiming_to_have_finished_keeps_its_size_frozen() -> None:
    """Status is the one part of a Workflow whose writer the apiserver cannot restrict; a held
    workflow does not count as finished whatever its phase says, so the rules stay on."""
    adapter = ADAPTERS["workflow"]
    forged = {**queued(workflow()), "status": {"phase": "Succeeded"}}
    assert adapter.admission_errors(forged, _with_min_resources(forged, "cpu: 1"))


def test_a_workflow_stored_before_the_rule_may_be_updated_and_may_gain_a_size() -> None:
    adapter = ADAPTERS["workflow"]
    legacy = queued(workflow(None))
    legacy["status"] = {"phase": "Running"}  # Argo's own write of an old workflow
    assert adapter.admission_errors(legacy, {**legacy, "status": {"phase": "Running", "x": 1}}) == []
    grown = copy.deepcopy(legacy)
    grown["metadata"]["annotations"][names.MIN_RESOURCES_ANNOTATION] = "cpu: 2"
    assert adapter.admission_errors(legacy, grown) == []


@pytest.mark.parametrize(
    ("phase", "annotations", "suspend", "expected"),
    [
        # Held by the queue: Queuing, whatever the phase says.
        ("Succeeded", {names.JOB_HAS_ENQUEUED_ANNOTATION: "true"}, True, JobStatus.QUEUING),
        ("Failed", {names.JOB_HAS_ENQUEUED_ANNOTATION: "true"}, True, JobStatus.QUEUING),
        ("Error", {names.JOB_ENQUEUE_TIMESTAMP_ANNOTATION: "t"}, True, JobStatus.QUEUING),
        # Released (or never queued): the phase counts.
        (
            "Succeeded",
            {names.JOB_HAS_ENQUEUED_ANNOTATION: "true", names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION: "t"},
            False,
            JobStatus.SUCCEEDED,
        ),
        (
            "Failed",
            {names.JOB_HAS_ENQUEUED_ANNOTATION: "true", names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION: "t"},
            True,  # suspended by the user after admission: still the phase
            JobStatus.FAILED,
        ),
        ("Succeeded", {}, True, JobStatus.SUCCEEDED),
    ],
)
def test_workflow_status_of_a_held_workflow_ignores_its_phase(
    phase: str, annotations: dict[str, str], suspend: bool, expected: JobStatus
) -> None:
    job = workflow()
    job["metadata"]["annotations"].update(annotations)
    job["spec"]["suspend"] = suspend
    job["status"] = {"phase": phase}
    assert ADAPTERS["workflow"].job_status(job) is expected


def test_a_waiting_suspend_step_does_not_make_a_running_workflow_look_held() -> None:
    """A Running ``Suspend`` node is one step waiting (an approval step, maybe beside branches
    that keep running pods); only ``spec.suspend`` holds the workflow."""
    adapter = ADAPTERS["workflow"]
    job = merge_patch(queued(workflow()), adapter.resume_patch(queued(workflow()), now_text="t"))
    job["status"] = {
        "phase": "Running",
        "nodes": {
            "wf-1": {"type": "Suspend", "phase": "Running", "templateName": "approve"},
            "wf-2": {"type": "Suspend", "phase": "Running", "templateName": names.WORKFLOW_SUSPEND_TEMPLATE},
            "wf-3": {"type": "Pod", "phase": "Running"},
        },
    }
    assert not adapter.is_suspended(job)
    assert adapter.job_status(job) is JobStatus.RUNNING
    job["spec"]["suspend"] = True
    assert adapter.is_suspended(job)


# --- SparkApplication: pods held by a label the pod webhook gates ---------------------------------

SPARK_LABEL_PATHS = [f"spec.{role}.labels[{names.GATED_POD_LABEL}]" for role in ("driver", "executor")]


def test_spark_roles_are_labelled_for_the_pod_gate_and_linked_to_the_unit() -> None:
    job = spark_app(driver={"cores": 1, "labels": {"team": "a", names.GATED_POD_LABEL: "false"}})
    stored = queued(job)
    for role in ("driver", "executor"):
        spec = stored["spec"][role]
        assert spec["labels"][names.GATED_POD_LABEL] == "true"
        assert spec["annotations"][names.RELATED_QUEUEUNIT_ANNOTATION] == "ns/sp-spark-qu"
        assert spec["annotations"][names.RELATED_PODSET_ANNOTATION] == role
    assert stored["spec"]["driver"]["labels"]["team"] == "a"


def test_spark_roles_missing_from_the_spec_are_created_labelled() -> None:
    """The operator runs a driver with defaults when ``spec.driver`` is missing; it must be gated."""
    job = spark_app()
    del job["spec"]["driver"], job["spec"]["executor"]
    stored = queued(job)
    assert stored["spec"]["driver"]["labels"] == {names.GATED_POD_LABEL: "true"}
    assert stored["spec"]["executor"]["labels"] == {names.GATED_POD_LABEL: "true"}


def test_a_spark_pod_made_from_the_labelled_spec_is_found_and_linked() -> None:
    """What the operator (driver) and Spark (executors) create: the role's labels and annotations,
    plus Spark's own ``spark-role`` label."""
    adapter = ADAPTERS["sparkapp"]
    stored = queued(spark_app())
    for role in ("driver", "executor"):
        spec = stored["spec"][role]
        labels = {**spec["labels"], "spark-role": role}
        pod = {"metadata": {"labels": labels, "annotations": dict(spec["annotations"])}}
        assert adapter.pod_set_of(pod) == role
        ref = pod["metadata"]["annotations"][names.RELATED_QUEUEUNIT_ANNOTATION]
        assert ref == adapter.queue_unit_ref(stored) == "ns/sp-spark-qu"
        del pod["metadata"]["annotations"]  # linked by annotation; the pod set also by its label
        assert adapter.pod_set_of(pod) == role


def test_a_spark_application_that_skipped_the_mutating_webhook_is_refused() -> None:
    errors = ADAPTERS["sparkapp"].admission_errors(None, spark_app())
    assert [e.path for e in errors] == SPARK_LABEL_PATHS
    assert all(e.detail.startswith("Required value: ") for e in errors)


@pytest.mark.parametrize(
    ("change", "paths"),
    [
        (lambda s: s["driver"]["labels"].pop(names.GATED_POD_LABEL), SPARK_LABEL_PATHS[:1]),
        (lambda s: s["executor"]["labels"].update({names.GATED_POD_LABEL: "false"}), SPARK_LABEL_PATHS[1:]),
        (lambda s: s["executor"].pop("labels"), SPARK_LABEL_PATHS[1:]),
        (lambda s: s.pop("driver") and s.pop("executor"), SPARK_LABEL_PATHS),
        (lambda s: s["executor"].update(instances=5), []),
        (lambda s: s["driver"]["labels"].update(team="b"), []),
    ],
)
@pytest.mark.parametrize("state", ["", "RUNNING", "COMPLETED", "FAILED"])
def test_the_spark_pod_label_cannot_be_removed_or_changed_even_once_finished(
    change: Any, paths: list[str], state: str
) -> None:
    """The operator re-runs an application whose spec changes, a finished one too."""
    old = queued(spark_app())
    if state:
        old["status"] = {"applicationState": {"state": state}}
    new = copy.deepcopy(old)
    change(new["spec"])
    errors = ADAPTERS["sparkapp"].admission_errors(old, new)
    assert [e.path for e in errors] == paths
    for error in errors:
        assert error.detail.startswith("Forbidden: ") and names.GATED_POD_LABEL in error.detail


def test_a_spark_application_stored_before_the_label_existed_need_not_gain_it() -> None:
    old = spark_app()
    old["metadata"]["annotations"] = {names.SUSPEND_ANNOTATION: "true"}
    new = copy.deepcopy(old)
    new["spec"]["executor"]["instances"] = 3
    assert ADAPTERS["sparkapp"].admission_errors(old, new) == []


# --- per-kind tables: management, status, pod mapping, priority -----------------------------------


def test_children_of_managed_kinds_are_not_managed() -> None:
    job = batch_job()
    job["metadata"]["ownerReferences"] = [
        {"apiVersion": "ray.io/v1", "kind": "RayJob", "name": "r", "uid": "u", "controller": True}
    ]
    assert not ADAPTERS["job"].is_managed(job)
    job["metadata"]["ownerReferences"][0] = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "name": "c",
        "controller": True,
    }
    assert ADAPTERS["job"].is_managed(job)
    # A RayCluster leaves the queue only by a controller reference to a RayJob or RayService (a
    # claim the reconciler resolves); KubeRay's origin label claims nothing, nor does a
    # non-controller reference (docs/compatibility.md#raycluster).
    cluster = ray_cluster()
    cluster["metadata"]["labels"]["ray.io/originated-from-crd"] = "RayJob"
    assert ADAPTERS["raycluster"].is_managed(cluster)
    cluster["metadata"]["ownerReferences"] = [
        {"apiVersion": "ray.io/v1", "kind": "RayJob", "name": "r", "uid": "u", "controller": False}
    ]
    assert ADAPTERS["raycluster"].is_managed(cluster)
    cluster["metadata"]["ownerReferences"][0]["controller"] = True
    assert not ADAPTERS["raycluster"].is_managed(cluster)
    selector_job = ray_job()
    selector_job["spec"]["clusterSelector"] = {"ray.io/cluster": "shared"}
    assert not ADAPTERS["rayjob"].is_managed(selector_job)
    # An MPIJob's launcher Job and a JobSet's child Jobs, even labelled for a quota.
    for api_version, kind in (("kubeflow.org/v2beta1", "MPIJob"), ("jobset.x-k8s.io/v1alpha2", "JobSet")):
        child = batch_job()
        child["metadata"]["ownerReferences"] = [
            {"apiVersion": api_version, "kind": kind, "name": "p", "uid": "u", "controller": True}
        ]
        assert not ADAPTERS["job"].is_managed(child), kind


@pytest.mark.parametrize(
    ("extension", "status", "annotations", "expected"),
    [
        ("job", {"conditions": [{"type": "Complete", "status": "True"}]}, {}, JobStatus.SUCCEEDED),
        ("job", {"conditions": [{"type": "Failed", "status": "True"}]}, {}, JobStatus.FAILED),
        ("job", {"conditions": [{"type": "Failed", "status": "False"}], "active": 2}, {}, JobStatus.RUNNING),
        ("job", {}, {names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION: "t"}, JobStatus.PENDING),
        ("job", {}, {names.JOB_HAS_ENQUEUED_ANNOTATION: "true"}, JobStatus.QUEUING),
        ("job", {}, {}, JobStatus.CREATED),
        ("tfjob", {"conditions": [{"type": "Succeeded", "status": "True"}]}, {}, JobStatus.SUCCEEDED),
        ("tfjob", {"conditions": [{"type": "Running", "status": "True"}]}, {}, JobStatus.RUNNING),
        ("paddlejob", {"conditions": [{"type": "Failed", "status": "True"}]}, {}, JobStatus.FAILED),
        ("xgboostjob", {"conditions": [{"type": "Succeeded", "status": "True"}]}, {}, JobStatus.SUCCEEDED),
        ("jaxjob", {"conditions": [{"type": "Running", "status": "True"}]}, {}, JobStatus.RUNNING),
        ("mpijob", {"conditions": [{"type": "Succeeded", "status": "True"}]}, {}, JobStatus.SUCCEEDED),
        ("mpijob", {"conditions": [{"type": "Running", "status": "False"}]}, {}, JobStatus.PENDING),
        ("jobset", {"terminalState": "Completed"}, {}, JobStatus.SUCCEEDED),
        ("jobset", {"conditions": [{"type": "Completed", "status": "True"}]}, {}, JobStatus.SUCCEEDED),
        ("jobset", {"terminalState": "Failed"}, {}, JobStatus.FAILED),
        ("jobset", {"conditions": [{"type": "Failed", "status": "True"}]}, {}, JobStatus.FAILED),
        (
            "jobset",
            {"replicatedJobsStatus": [{"name": "a", "active": 0}, {"name": "b", "active": 1}]},
            {},
            JobStatus.RUNNING,
        ),
        (
            "jobset",
            {"replicatedJobsStatus": [{"name": "a", "suspended": 2}]},
            {names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION: "t"},
            JobStatus.PENDING,
        ),
        (
            "jobset",
            {"conditions": [{"type": "Suspended", "status": "True"}]},
            {names.JOB_HAS_ENQUEUED_ANNOTATION: "true"},
            JobStatus.QUEUING,
        ),
        ("jobset", {"restarts": 0}, {}, JobStatus.CREATED),
        ("rayjob", {"jobDeploymentStatus": "Complete"}, {}, JobStatus.SUCCEEDED),
        ("rayjob", {"jobDeploymentStatus": "ValidationFailed"}, {}, JobStatus.FAILED),
        ("rayjob", {"jobDeploymentStatus": "Running"}, {}, JobStatus.RUNNING),
        ("rayjob", {}, {names.JOB_ENQUEUE_TIMESTAMP_ANNOTATION: "t"}, JobStatus.QUEUING),
        ("raycluster", {"state": "ready"}, {}, JobStatus.RUNNING),
        ("sparkapp", {"applicationState": {"state": "FAILED"}}, {}, JobStatus.FAILED),
        ("sparkapp", {"applicationState": {"state": "RUNNING"}}, {}, JobStatus.RUNNING),
        ("sparkapp", {"applicationState": {"state": {}}}, {}, JobStatus.CREATED),
        ("workflow", {"phase": "Error"}, {}, JobStatus.FAILED),
        ("workflow", {"phase": "Running"}, {names.JOB_HAS_ENQUEUED_ANNOTATION: "true"}, JobStatus.RUNNING),
        ("workflow", {}, {}, JobStatus.CREATED),
    ],
)
def test_job_status(
    extension: str, status: dict[str, Any], annotations: dict[str, str], expected: JobStatus
) -> None:
    job = SAMPLES[extension]()
    job["status"] = status
    job["metadata"]["annotations"] = annotations
    assert ADAPTERS[extension].job_status(job) is expected


@pytest.mark.parametrize(
    ("extension", "metadata", "expected"),
    [
        ("job", {"ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train"}]}, "train"),
        ("job", {"labels": {"batch.kubernetes.io/job-name": "train"}}, "train"),
        ("tfjob", {"labels": {"job-role": "Worker"}}, "worker"),
        ("tfjob", {"labels": {"training.kubeflow.org/replica-type": "ps"}}, "ps"),
        ("pytorchjob", {"labels": {"pytorch-replica-type": "Master", "job-role": "x"}}, "master"),
        ("paddlejob", {"labels": {"training.kubeflow.org/replica-type": "master"}}, "master"),
        ("xgboostjob", {"labels": {"training.kubeflow.org/replica-type": "worker"}}, "worker"),
        ("jaxjob", {"labels": {"training.kubeflow.org/replica-type": "worker"}}, "worker"),
        ("jaxjob", {"labels": {"job-role": "worker"}}, None),
        ("mpijob", {"labels": {"training.kubeflow.org/job-role": "launcher"}}, "launcher"),
        ("mpijob", {"labels": {"job-role": "worker"}}, None),
        ("jobset", {"labels": {"jobset.sigs.k8s.io/replicatedjob-name": "workers"}}, "workers"),
        ("jobset", {"labels": {"jobset.sigs.k8s.io/jobset-name": "js"}}, None),
        ("rayjob", {"labels": {"ray.io/group": "headgroup"}}, "head"),
        ("rayjob", {"labels": {"ray.io/group": "GPU"}}, "gpu"),
        ("raycluster", {"labels": {"ray.io/group": ""}}, "worker"),
        ("sparkapp", {"labels": {"spark-role": "executor"}}, "executor"),
        ("workflow", {"labels": {"workflows.argoproj.io/workflow": "wf"}}, "default"),
        ("job", {"annotations": {names.RELATED_PODSET_ANNOTATION: "x"}, "labels": {"job-name": "y"}}, "x"),
        ("sparkapp", {"labels": {"spark-role": "shuffle"}}, None),
        ("tfjob", {}, None),
    ],
)
def test_pod_set_of_uses_annotation_then_kind_labels(
    extension: str, metadata: dict[str, Any], expected: str | None
) -> None:
    assert ADAPTERS[extension].pod_set_of({"metadata": metadata}) == expected


def test_priority_per_kind() -> None:
    job = batch_job(template=template(priorityClassName="high", priority=100))
    # A template's raw priority is no claim (docs/compatibility.md#priority-cap).
    assert ADAPTERS["job"].priority(job) == ("high", None)
    tf = kubeflow_job("TFJob", "tfReplicaSpecs", {"Master": 1, "Worker": 1})
    tf["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["priorityClassName"] = "w"
    tf["spec"]["tfReplicaSpecs"]["Master"]["template"]["spec"]["priorityClassName"] = "m"
    assert ADAPTERS["tfjob"].priority(tf) == ("w", None)
    xgb = kubeflow_job("XGBoostJob", "xgbReplicaSpecs", {"Master": 1, "Worker": 1})
    xgb["spec"]["xgbReplicaSpecs"]["Master"]["template"]["spec"]["priorityClassName"] = "m"
    xgb["spec"]["xgbReplicaSpecs"]["Worker"]["template"]["spec"]["priorityClassName"] = "w"
    assert ADAPTERS["xgboostjob"].priority(xgb) == ("w", None)
    jax = kubeflow_job("JAXJob", "jaxReplicaSpecs", {"Worker": 4})
    jax["spec"]["jaxReplicaSpecs"]["Worker"]["template"]["spec"]["priorityClassName"] = "j"
    assert ADAPTERS["jaxjob"].priority(jax) == ("j", None)
    mpi = kubeflow_job("MPIJob", "mpiReplicaSpecs", {"Launcher": 1, "Worker": 2})
    mpi["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["priorityClassName"] = "w"
    assert ADAPTERS["mpijob"].priority(mpi) == (None, None)  # the first replica type: Launcher
    mpi["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["priorityClassName"] = "l"
    assert ADAPTERS["mpijob"].priority(mpi) == ("l", None)
    js = job_set(replicated_job("driver"), replicated_job("workers", 2))
    assert ADAPTERS["jobset"].priority(js) == (None, None)
    js["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]["priority"] = 9
    assert ADAPTERS["jobset"].priority(js) == (None, None)  # a raw template priority is ignored
    js["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]["priorityClassName"] = "w"
    assert ADAPTERS["jobset"].priority(js) == ("w", None)  # the first replicated job that names one
    js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["priorityClassName"] = "d"
    assert ADAPTERS["jobset"].priority(js) == ("d", None)
    spark = spark_app(batchSchedulerOptions={"priorityClassName": "batch"})
    assert ADAPTERS["sparkapp"].priority(spark) == ("batch", None)
    wf = workflow()
    wf["spec"]["priority"] = 7
    wf["spec"]["templates"][0]["priorityClassName"] = "entry"
    assert ADAPTERS["workflow"].priority(wf) == ("entry", 7)


# --- registry -------------------------------------------------------------------------------------


def test_registry_lookups() -> None:
    assert registry.EXTENSIONS == (
        "job", "tfjob", "pytorchjob", "paddlejob", "xgboostjob", "jaxjob", "mpijob", "jobset",
        "rayjob", "rayjobv1alpha1", "raycluster", "workflow", "sparkapp",
    )  # fmt: skip
    assert "raycluster" not in registry.DEFAULT_EXTENSIONS
    assert {"paddlejob", "xgboostjob", "jaxjob", "mpijob", "jobset"} <= set(registry.DEFAULT_EXTENSIONS)
    assert registry.by_kind("kubeflow.org/v1", "XGBoostJob") is registry.by_extension("xgboostjob")
    assert registry.by_kind("kubeflow.org/v2beta1", "MPIJob") is registry.by_extension("mpijob")
    assert registry.by_kind("kubeflow.org/v1", "MPIJob") is None  # the training operator's is not served
    assert registry.by_kind("jobset.x-k8s.io/v1alpha2", "JobSet") is registry.by_extension("jobset")
    assert registry.by_kind("ray.io/v1alpha1", "RayJob") is registry.by_extension("rayjobv1alpha1")
    assert registry.by_kind("batch/v1", "CronJob") is None
    assert [a.extension for a in registry.enabled_adapters(["sparkapp", " job", ""])] == ["job", "sparkapp"]
    with pytest.raises(
        registry.UnknownExtensionError, match=r"'clusterresourcebinding', 'nope'.*known extensions: job"
    ):
        registry.enabled_adapters(["job", "nope", "clusterresourcebinding"])
