"""Parsing of QueueUnits, Queues and ElasticQuotas into the core's values; pod requests; durations.

Also home of the fluent builders the other core tests use (``unit("a").quota("q").cpu("2")``):
they build *raw* API objects and parse them, so every scheduling test exercises the parser too.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from koord_queue.shared.api import durations, model, names, parsing, quantities
from koord_queue.shared.api import podtemplates as podspec
from koord_queue.shared.api.admission_checks import LabelSelector, Requirement
from koord_queue.shared.api.model import QueueConfig, Quota, Unit
from koord_queue.shared.api.quantities import QuantityError

BASE_TIME = 1_700_000_000.0
_SEQ = itertools.count()


# --- builders --------------------------------------------------------------------------------------


class UnitBuilder:
    def __init__(self, name: str, namespace: str = "default") -> None:
        created = durations.format_time(BASE_TIME + next(_SEQ))
        self._raw: dict[str, Any] = {
            "apiVersion": names.API_VERSION,
            "kind": "QueueUnit",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": f"uid-{namespace}-{name}",
                "creationTimestamp": created,
                "labels": {},
            },
            "spec": {"podSet": []},
            "status": {},
        }
        self._default_podset = True

    @property
    def spec(self) -> dict[str, Any]:
        return self._raw["spec"]  # type: ignore[no-any-return]

    @property
    def status(self) -> dict[str, Any]:
        return self._raw["status"]  # type: ignore[no-any-return]

    def quota(self, name: str) -> UnitBuilder:
        self._raw["metadata"]["labels"][names.QUOTA_NAME_LABEL] = name
        return self

    def label(self, key: str, value: str) -> UnitBuilder:
        self._raw["metadata"]["labels"][key] = value
        return self

    def priority(self, value: int) -> UnitBuilder:
        self.spec["priority"] = value
        return self

    def created(self, offset: float) -> UnitBuilder:
        self._raw["metadata"]["creationTimestamp"] = durations.format_time(BASE_TIME + offset)
        return self

    def active(self, value: bool) -> UnitBuilder:
        self.spec["active"] = value
        return self

    def podset(self, name: str, count: int = 1, **requests: str) -> UnitBuilder:
        container = {"name": "main", "resources": {"requests": dict(requests)}}
        self.spec["podSet"].append(
            {"name": name, "count": count, "template": {"spec": {"containers": [container]}}}
        )
        return self

    def cpu(self, value: str, count: int = 1) -> UnitBuilder:
        """One pod set named after the unit with ``count`` pods of ``value`` cpu (the fixture shape)."""
        name = self._raw["metadata"]["name"]
        self.podset(name, count, cpu=value)
        total = quantities.format_milli(quantities.parse_milli(value) * count)
        self.spec["resource"] = {"cpu": total}
        self.spec["request"] = {"cpu": total}
        return self

    def admitted(
        self, replicas: int = 1, running: int = 0, *, podset: str | None = None, reclaim: int | None = None
    ) -> UnitBuilder:
        adm: dict[str, Any] = {
            "name": podset or self._raw["metadata"]["name"],
            "replicas": replicas,
            "running": running,
        }
        if reclaim is not None:
            adm["reclaimState"] = {"replicas": reclaim}
        self.status.setdefault("admissions", []).append(adm)
        self.status.setdefault("phase", names.Phase.DEQUEUED.value)
        return self

    def allocated_at(self, offset: float) -> UnitBuilder:
        self.status["lastAllocateTime"] = durations.format_time(BASE_TIME + offset)
        return self

    def phase(self, value: str) -> UnitBuilder:
        self.status["phase"] = value
        return self

    def message(self, value: str) -> UnitBuilder:
        self.status["message"] = value
        return self

    def checks(self, *states: tuple[str, str]) -> UnitBuilder:
        self.status["admissionChecks"] = [
            {"name": n, "state": s, "message": "", "lastTransitionTime": "2024-01-01T00:00:00Z"}
            for n, s in states
        ]
        return self

    def raw(self) -> dict[str, Any]:
        return self._raw

    def build(self) -> Unit:
        return parsing.parse_unit(self._raw)


def unit(name: str, namespace: str = "default") -> UnitBuilder:
    return UnitBuilder(name, namespace)


class QueueBuilder:
    def __init__(self, name: str) -> None:
        self._raw: dict[str, Any] = {
            "metadata": {"name": name, "namespace": names.COMPONENT_NAMESPACE, "annotations": {}},
            "spec": {"queuePolicy": "Priority", "priority": 1000},
        }

    def policy(self, value: str) -> QueueBuilder:
        self._raw["spec"]["queuePolicy"] = value
        return self

    def priority(self, value: int) -> QueueBuilder:
        self._raw["spec"]["priority"] = value
        return self

    def annotate(self, key: str, value: str) -> QueueBuilder:
        self._raw["metadata"]["annotations"][key] = value
        return self

    def wait_for_pods_running(self) -> QueueBuilder:
        return self.annotate(names.WAIT_FOR_PODS_RUNNING_ANNOTATION, "true")

    def preemption(self) -> QueueBuilder:
        return self.wait_for_pods_running().annotate(names.ENABLE_PREEMPTION_ANNOTATION, "true")

    def max_depth(self, value: int) -> QueueBuilder:
        return self.annotate(names.MAX_DEPTH_ANNOTATION, str(value))

    def threshold(self, value: int) -> QueueBuilder:
        return self.annotate(names.PRIORITY_THRESHOLD_ANNOTATION, str(value))

    def check(self, name: str, selector: dict[str, Any] | None = None) -> QueueBuilder:
        entry: dict[str, Any] = {"name": name}
        if selector is not None:
            entry["labelSelector"] = selector
        self._raw["spec"].setdefault("admissionChecks", []).append(entry)
        return self

    def build(self) -> QueueConfig:
        return parsing.parse_queue(self._raw)


def queue(name: str) -> QueueBuilder:
    return QueueBuilder(name)


def quota(name: str, *, parent: str | None = None, **max_: str) -> Quota:
    """A quota in namespace ``default``, the namespace of ``unit``'s units (bound to them)."""
    labels = {names.QUOTA_PARENT_LABEL: parent} if parent is not None else {}
    return parsing.parse_quota(
        {
            "metadata": {"name": name, "namespace": "default", "labels": labels},
            "spec": {"min": dict(max_), "max": dict(max_)},
        }
    )


# --- QueueUnit ------------------------------------------------------------------------------------


def test_a_fixture_unit_parses_into_pod_sets_and_requests() -> None:
    u = unit("a").quota("team-a").priority(10).cpu("500m", count=2).build()
    assert u.key == "default/a"
    assert u.quota == "team-a"
    assert u.priority == 10
    assert u.active is True
    assert u.pod_sets[0].count == 2
    assert u.pod_sets[0].per_pod == {"cpu": 500}
    assert u.request == {"cpu": 1000}
    assert u.problems == ()
    assert u.invalid is None


def test_the_fallback_quota_label_is_used_when_the_koordinator_label_is_missing() -> None:
    u = unit("a").label(names.QUOTA_NAME_LABEL_FALLBACK, "legacy").build()
    assert u.quota == "legacy"
    assert unit("b").build().quota is None


def test_admissions_with_reclaim_state_and_times_are_parsed() -> None:
    u = unit("a").cpu("1").admitted(2, 1, reclaim=1).allocated_at(30).build()
    assert u.admissions[0] == model.Admission(
        name="a", replicas=2, running=1, resources={}, reclaim_replicas=1
    )
    assert u.last_allocate_time == BASE_TIME + 30
    assert u.phase == "Dequeued"


@pytest.mark.parametrize(
    ("patch", "problem"),
    [
        ({"spec": {"priority": "high"}}, "spec.priority"),
        ({"spec": {"active": "yes"}}, "spec.active"),
        ({"spec": {"podSet": "nope"}}, "spec.podSet"),
        ({"status": {"admissions": [{"name": "a", "replicas": "two"}]}}, "status.admissions[0].replicas"),
        ({"metadata": {"creationTimestamp": "yesterday"}}, "metadata.creationTimestamp"),
    ],
)
def test_a_malformed_field_becomes_a_problem_and_never_raises(patch: dict[str, Any], problem: str) -> None:
    raw = unit("a").quota("q").cpu("1").raw()
    for section, values in patch.items():
        raw[section].update(values)
    parsed = parsing.parse_unit(raw)
    assert any(problem in text for text in parsed.problems), parsed.problems


def test_a_bad_quantity_makes_the_unit_invalid_rather_than_guessing_its_demand() -> None:
    raw = unit("a").quota("q").podset("main", 1, cpu="lots").raw()
    parsed = parsing.parse_unit(raw)
    assert parsed.invalid is not None and "cpu" in parsed.invalid
    assert parsed.pod_sets[0].per_pod == {}


def test_garbage_input_still_parses() -> None:
    parsed = parsing.parse_unit({"metadata": 5, "spec": [], "status": "x"})
    assert parsed.problems
    assert parsed.key == "/"


def test_with_grants_adds_replicas_and_appends_missing_pod_sets() -> None:
    u = unit("a").podset("x", 2, cpu="1").podset("y", 1, cpu="1").admitted(1, podset="x").build()
    after = model.with_grants(u, {"x": 1, "y": 1}, phase="Dequeued", message="m", now=BASE_TIME)
    assert [(a.name, a.replicas, a.running) for a in after.admissions] == [("x", 2, 0), ("y", 1, 0)]
    assert after.last_allocate_time == BASE_TIME


# --- Queue and ElasticQuota -----------------------------------------------------------------------


def test_queue_annotations_and_admission_checks() -> None:
    cfg = (
        queue("q")
        .policy("Block")
        .preemption()
        .max_depth(5)
        .annotate(names.QUEUE_ITEMS_REFRESH_ANNOTATION, "100ms")
        .check("ac", {"matchLabels": {"a": "b"}, "matchExpressions": [{"key": "k", "operator": "Exists"}]})
        .build()
    )
    assert cfg.policy is names.QueuePolicy.BLOCK
    assert (cfg.wait_for_pods_running, cfg.enable_preemption, cfg.max_depth) == (True, True, 5)
    assert cfg.items_refresh_seconds == pytest.approx(0.1)
    assert cfg.admission_checks[0].selector == LabelSelector({"a": "b"}, (Requirement("k", "Exists"),))
    assert cfg.problems == ()


@pytest.mark.parametrize("policy", ["FIFO", "Round", "whatever"])
def test_an_unsupported_policy_is_reported_not_raised(policy: str) -> None:
    cfg = queue("q").policy(policy).build()
    assert cfg.policy is None
    assert cfg.policy_error == "unsupported strategy"


def test_bad_queue_annotations_fall_back_to_defaults_with_problems() -> None:
    cfg = (
        queue("q")
        .annotate(names.MAX_DEPTH_ANNOTATION, "ten")
        .annotate(names.WAIT_FOR_PODS_RUNNING_ANNOTATION, "yes")
        .annotate(names.QUEUE_ITEMS_REFRESH_ANNOTATION, "soon")
        .build()
    )
    assert (cfg.max_depth, cfg.wait_for_pods_running, cfg.items_refresh_seconds) == (-1, False, 15.0)
    assert len(cfg.problems) == 3


def test_quota_parent_and_a_bad_max_entry_fails_closed() -> None:
    q = quota("child", parent="parent", cpu="4", memory="8Gi")
    assert q.parent == "parent"
    assert q.max == {"cpu": 4000, "memory": 8 * 1024**3 * 1000}
    bad = parsing.parse_quota({"metadata": {"name": "x"}, "spec": {"max": {"cpu": "??", "memory": "1Gi"}}})
    assert bad.max["cpu"] == 0 and bad.problems


# --- pod requests ---------------------------------------------------------------------------------


def _c(
    requests: dict[str, str] | None = None, limits: dict[str, str] | None = None, **extra: Any
) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if requests:
        res["requests"] = requests
    if limits:
        res["limits"] = limits
    return {"name": "c", "resources": res, **extra}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"containers": [_c({"cpu": "1"}), _c({"cpu": "500m"})]}, {"cpu": 1500}),
        ({"containers": [_c(limits={"cpu": "2"})]}, {"cpu": 2000}),
        (
            {"containers": [_c({"memory": "1Gi"}, {"cpu": "1", "memory": "2Gi"})]},
            {"cpu": 1000, "memory": 1024**3 * 1000},
        ),
        ({"containers": [_c({"cpu": "1"})], "initContainers": [_c({"cpu": "3"})]}, {"cpu": 3000}),
        (
            {
                "containers": [_c({"cpu": "1"})],
                "initContainers": [_c({"cpu": "1"}, restartPolicy="Always"), _c({"cpu": "2"})],
            },
            {"cpu": 3000},
        ),
        ({"containers": [_c({"cpu": "1"})], "overhead": {"cpu": "250m"}}, {"cpu": 1250}),
        ({"containers": [_c({"cpu": "0"})]}, {}),
        ({}, {}),
    ],
)
def test_pod_requests_follow_kubernetes_rules(spec: dict[str, Any], expected: dict[str, int]) -> None:
    assert podspec.pod_requests(spec) == expected


GI = 1024**3 * 1000


@pytest.mark.parametrize(
    ("spec", "expected", "why"),
    [
        (
            {
                "containers": [_c({"cpu": "100m"}), _c({"cpu": "100m"})],
                "resources": {"requests": {"cpu": "8"}},
            },
            {"cpu": 8000},
            "a pod-level request replaces the containers' sum",
        ),
        (
            {"containers": [_c({"cpu": "1", "memory": "1Gi"})], "resources": {"requests": {"memory": "4Gi"}}},
            {"cpu": 1000, "memory": 4 * GI},
            "only for the resources it names",
        ),
        (
            {"containers": [_c()], "resources": {"limits": {"cpu": "4", "memory": "2Gi"}}},
            {"cpu": 4000, "memory": 2 * GI},
            "a pod-level limit alone: the apiserver defaults the request from it",
        ),
        (
            {"containers": [_c({"cpu": "1"})], "resources": {"limits": {"cpu": "4"}}},
            {"cpu": 1000},
            "... unless the containers ask for that resource: then their sum",
        ),
        (
            {
                "containers": [_c({"hugepages-2Mi": "2Mi"})],
                "resources": {"limits": {"hugepages-2Mi": "8Mi"}},
            },
            {"hugepages-2Mi": 8 * 1024**2 * 1000},
            "hugepages are not overcommitted: the limit, whatever the containers ask",
        ),
        (
            {
                "containers": [_c({"cpu": "1", "nvidia.com/gpu": "1"})],
                "resources": {"requests": {"nvidia.com/gpu": "4", "cpu": "2"}},
            },
            {"cpu": 2000, "nvidia.com/gpu": 1000},
            "a resource the pod level may not name stays the containers'",
        ),
        (
            {
                "containers": [_c({"cpu": "1"})],
                "resources": {"requests": {"cpu": "3"}},
                "overhead": {"cpu": "250m"},
            },
            {"cpu": 3250},
            "the overhead on top",
        ),
    ],
)
def test_pod_level_resources_count_as_the_kube_scheduler_counts_them(
    spec: dict[str, Any], expected: dict[str, int], why: str
) -> None:
    assert podspec.pod_requests(spec) == expected, why
    template = podspec.scheduling_template({"spec": spec})
    assert podspec.pod_requests(template["spec"]) == expected, "the unit's scheduling view keeps them"  # type: ignore[arg-type]


def test_a_bad_pod_level_quantity_names_its_field() -> None:
    with pytest.raises(QuantityError, match=r"spec\.resources\.requests"):
        podspec.pod_requests({"containers": [_c({"cpu": "1"})], "resources": {"requests": {"cpu": "lots"}}})


def test_pod_requests_name_the_bad_field() -> None:
    with pytest.raises(QuantityError, match=r"containers\[0\]\.resources\.requests"):
        podspec.pod_requests({"containers": [_c({"cpu": "x"})]})


# --- durations and times --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("0", 0),
        ("100ms", 100_000_000),
        ("1m30s", 90_000_000_000),
        ("5m", 300_000_000_000),
        ("1.5h", 5_400_000_000_000),
        ("-2s", -2_000_000_000),
        ("1h2m3s4ms5us6ns", 3_723_004_005_006),
        ("3\u00b5s", 3000),
        (".5s", 500_000_000),
    ],
)
def test_go_durations(text: str, ns: int) -> None:
    assert durations.parse_duration_ns(text) == ns


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", 'time: invalid duration ""'),
        ("1", 'time: missing unit in duration "1"'),
        ("1d", 'time: unknown unit "d" in duration "1d"'),
        ("s", 'time: invalid duration "s"'),
        ("1.s.", 'time: invalid duration "1.s."'),
    ],
)
def test_bad_go_durations_use_go_wording(text: str, error: str) -> None:
    with pytest.raises(durations.DurationError) as info:
        durations.parse_duration_ns(text)
    assert str(info.value) == error


def test_format_duration_and_rfc3339_round_trip() -> None:
    assert durations.format_duration(90) == "1m30s"
    assert durations.format_duration(0.1) == "100ms"
    assert durations.parse_time(durations.format_time(BASE_TIME)) == BASE_TIME
    assert durations.parse_time("2024-01-01T00:00:00.5+01:00") == pytest.approx(1704063600.5)
    assert durations.parse_time("nonsense") is None


def test_evolve_equals_dataclasses_replace_and_rejects_unknown_fields() -> None:
    import dataclasses

    u = unit("a").quota("q").cpu("1").build()
    changed = model.evolve(u, priority=7, phase="Dequeued")
    assert changed == dataclasses.replace(u, priority=7, phase="Dequeued")
    with pytest.raises(TypeError, match="nope"):
        model.evolve(u, nope=1)
