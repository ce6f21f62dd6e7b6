"""Multi-tenancy rules of the pure core: quota namespace bindings, same-named quotas, the cap on
user-chosen priorities.

* bindings: Koordinator's ``quota.scheduling.koordinator.sh/namespaces`` parsed leniently; a unit of
  a namespace its quota is not bound to waits with the binding text and is never admitted (and never
  holds back anyone else); the switch turns the check off; the admission policy's ConfigMap data;
* same name: the oldest quota counts (then namespace, then uid), whatever the order of events; the
  others never change limits, Queue or bindings, and take over when the winner goes;
* priority: the annotation is clamped to the smallest cap (cluster-wide, per quota) and refused at
  the door above the cluster-wide one; PriorityClass values are never clamped.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koord_queue.shared.admission import decisions as admission
from koord_queue.shared.admission import validation
from koord_queue.shared.api import durations, model, names, parsing
from koord_queue.shared.api.model import Quota
from koord_queue.shared.api.names import Message
from koord_queue.shared.core import config, quotaqueues
from koord_queue.shared.core.quota import QuotaLedger, priority_cap, winner, winner_key
from koord_queue.shared.core.scheduling import Cache, Park, Plan
from koord_queue.shared.jobs import jobext
from koord_queue.shared.jobs.batch_job import BatchJobAdapter
from tests.unit.test_model import BASE_TIME, QueueBuilder, UnitBuilder, queue, unit


def eq(
    name: str,
    namespace: str,
    *,
    cpu: str = "4",
    created: float = 0.0,
    uid: str | None = None,
    namespaces: Any = None,
    cap: str | None = None,
    parent: str | None = None,
) -> Quota:
    """An ElasticQuota as parsed from the API (``namespaces``: the annotation's value, any JSON)."""
    annotations: dict[str, str] = {}
    if namespaces is not None:
        annotations[names.QUOTA_NAMESPACES_ANNOTATION] = (
            namespaces if isinstance(namespaces, str) else json.dumps(namespaces)
        )
    if cap is not None:
        annotations[names.MAX_USER_PRIORITY_ANNOTATION] = cap
    labels = {names.QUOTA_PARENT_LABEL: parent} if parent else {}
    return parsing.parse_quota(
        {
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": uid or f"uid-{namespace}-{name}",
                "creationTimestamp": durations.format_time(BASE_TIME + created),
                "labels": labels,
                "annotations": annotations,
            },
            "spec": {"min": {"cpu": cpu}, "max": {"cpu": cpu}},
        }
    )


class Tenants:
    """A cache with quotas and queues, cycles applied like the reconciler applies them."""

    def __init__(self, *quotas: Quota, queues: tuple[QueueBuilder, ...] = (), binding: bool = True) -> None:
        self.cache = Cache(quota_namespace_binding=binding)
        self.now = BASE_TIME + 1000
        for q in quotas:
            self.cache.put_quota(q)
        for qb in queues or tuple(queue(n) for n in sorted({q.name for q in quotas})):
            self.cache.put_queue(qb.build())

    def add(self, *builders: UnitBuilder) -> Tenants:
        for b in builders:
            self.cache.put_unit(b.build())
        return self

    def cycle(self) -> Plan:
        self.now += 1
        plan = self.cache.schedule(self.now)
        for admit in plan.admits:
            self.cache.assume(admit, now=self.now)
        for park in plan.parks:  # the reconciler writes the message onto the unit
            u = self.cache.units[park.key]
            self.cache.put_unit(model.evolve(u, message=park.message, phase=names.Phase.ENQUEUED.value))
        return plan


def admitted(plan: Plan) -> list[str]:
    return [a.key for a in plan.admits]


def park_of(plan: Plan, key: str) -> Park | None:
    found = [p for p in plan.parks if p.key == key]
    return found[-1] if found else None


# --- the namespaces annotation --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "found", "problem"),
    [
        ('["team-b","team-c"]', {"team-b", "team-c"}, None),
        ('["team-b", "team-b"]', {"team-b"}, None),
        ("[]", set(), None),
        ("", set(), None),
        ("  ", set(), None),
        ("null", set(), None),
        ("team-b", set(), "not valid JSON"),
        ('["team-b"', set(), "not valid JSON"),
        ('{"team-b": true}', set(), "expected a JSON array"),
        ('"team-b"', set(), "expected a JSON array"),
        ('["team-b", "Team-C", "a b", 7, null, ""]', {"team-b"}, "is not a namespace name"),
        ('["' + "a" * 64 + '"]', set(), "is not a namespace name"),
    ],
)
def test_the_namespaces_annotation_is_read_leniently(text: str, found: set[str], problem: str | None) -> None:
    namespaces, problems = parsing.parse_namespaces_annotation(text)
    assert namespaces == found
    if problem is None:
        assert problems == ()
    else:
        assert problems and all(
            p.startswith(f"metadata.annotations[{names.QUOTA_NAMESPACES_ANNOTATION}]") for p in problems
        )
        assert problem in problems[0]


def test_a_quota_is_bound_to_its_own_namespace_and_the_listed_ones() -> None:
    assert eq("q", "team-a").bound_namespaces == {"team-a"}
    assert eq("q", "team-a", namespaces=["team-b"]).bound_namespaces == {"team-a", "team-b"}
    broken = eq("q", "team-a", namespaces="[team-b")
    assert broken.bound_namespaces == {"team-a"}  # fails closed: its own namespace only
    assert any("not valid JSON" in p for p in broken.problems)


@given(st.lists(st.from_regex(r"[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?", fullmatch=True), max_size=6))
def test_any_list_of_namespace_names_round_trips(listed: list[str]) -> None:
    assert parsing.parse_namespaces_annotation(json.dumps(listed)) == (frozenset(listed), ())


@given(
    st.one_of(st.text(max_size=40), st.lists(st.one_of(st.text(max_size=8), st.integers())).map(json.dumps))
)
def test_the_reader_never_raises_and_agrees_with_the_webhook(text: str) -> None:
    """What the reconciler binds is exactly what the webhook accepts (when it accepts the value)."""
    namespaces, problems = parsing.parse_namespaces_annotation(text)
    errors = validation.validate_elastic_quota(_quota_obj({names.QUOTA_NAMESPACES_ANNOTATION: text}))
    assert bool(problems) == bool(errors)
    for namespace in namespaces:
        assert len(namespace) <= 63 and namespace == namespace.lower() and " " not in namespace


# --- bindings in the ledger -----------------------------------------------------------------------


def test_binding_problem_names_the_quota_the_namespace_and_the_usable_quotas() -> None:
    ledger = QuotaLedger()
    for q in (
        eq("team-a", "ns-a"),
        eq("team-b", "ns-b"),
        eq("team-c", "ns-c", namespaces=["ns-b"]),
    ):
        ledger.put_quota(q)
    assert ledger.binding_problem("team-a", "ns-a") is None
    assert ledger.binding_problem("team-c", "ns-b") is None
    assert ledger.binding_problem("unknown", "ns-b") is None  # no such quota: its units wait anyway
    assert ledger.binding_problem("team-a", "ns-b") == (
        'quota "team-a" is not bound to namespace "ns-b"; quotas usable in ns-b: team-b, team-c; use one '
        "of those, or ask a cluster admin to add ns-b to the quota.scheduling.koordinator.sh/namespaces "
        "annotation of quota team-a"
    )
    assert ledger.binding_problem("team-a", "ns-z") == names.quota_not_bound_message("team-a", "ns-z", [])
    assert "quotas usable in ns-z: none;" in str(ledger.binding_problem("team-a", "ns-z"))
    assert ledger.usable_in("ns-b") == ("team-b", "team-c")


def test_the_switch_turns_the_binding_check_off() -> None:
    ledger = QuotaLedger(namespace_binding=False)
    ledger.put_quota(eq("team-a", "ns-a"))
    assert ledger.binding_problem("team-a", "ns-b") is None
    assert ledger.bound_namespaces("team-a") is None
    assert ledger.take_binding_changes() == (frozenset(), frozenset())


def test_binding_changes_are_reported_once() -> None:
    ledger = QuotaLedger()
    ledger.put_quota(eq("q", "ns-a"))
    assert ledger.take_binding_changes() == ({"q"}, {"ns-a"})
    assert ledger.take_binding_changes() == (frozenset(), frozenset())
    ledger.put_quota(eq("q", "ns-a", cpu="8"))  # limits only
    assert ledger.take_binding_changes() == (frozenset(), frozenset())
    ledger.put_quota(eq("q", "ns-a", cpu="8", namespaces=["ns-b"]))
    assert ledger.take_binding_changes() == ({"q"}, {"ns-b"})


# --- the scheduler --------------------------------------------------------------------------------


def test_a_unit_of_another_namespace_waits_with_the_binding_text_and_is_never_admitted() -> None:
    t = Tenants(eq("team-a", "ns-a"), eq("team-b", "ns-b"))
    t.add(unit("thief", "ns-b").quota("team-a").cpu("1"), unit("owner", "ns-a").quota("team-a").cpu("1"))
    plan = t.cycle()
    assert admitted(plan) == ["ns-a/owner"]
    park = park_of(plan, "ns-b/thief")
    assert park is not None
    assert park.message == names.quota_not_bound_message("team-a", "ns-b", ["team-b"])
    for _ in range(3):  # the quota has room, yet nothing ever admits it
        assert "ns-b/thief" not in admitted(t.cycle())
    assert t.cache.ledger.used("team-a") == {"cpu": 1000}


def test_binding_the_namespace_lets_the_unit_in_and_unbinding_holds_new_ones() -> None:
    t = Tenants(eq("team-a", "ns-a"))
    t.add(unit("u", "ns-b").quota("team-a").cpu("1"))
    assert admitted(t.cycle()) == []
    t.cache.put_quota(eq("team-a", "ns-a", namespaces=["ns-b"]))
    assert admitted(t.cycle()) == ["ns-b/u"]
    t.cache.put_quota(eq("team-a", "ns-a"))
    t.add(unit("later", "ns-b").quota("team-a").cpu("1"))
    plan = t.cycle()
    assert admitted(plan) == []
    assert park_of(plan, "ns-b/later") is not None
    # What was admitted before the binding changed keeps its quota (as a running job would).
    assert t.cache.ledger.used("team-a") == {"cpu": 1000}


def test_the_waiting_text_follows_the_quotas_usable_in_the_namespace() -> None:
    t = Tenants(eq("team-a", "ns-a"))
    t.add(unit("u", "ns-b").quota("team-a").cpu("1"))
    plan = t.cycle()
    assert park_of(plan, "ns-b/u").message == names.quota_not_bound_message("team-a", "ns-b", [])  # type: ignore[union-attr]
    t.cache.put_quota(eq("team-b", "ns-b"))
    t.cache.put_queue(queue("team-b").build())
    plan = t.cycle()
    assert park_of(plan, "ns-b/u").message == names.quota_not_bound_message("team-a", "ns-b", ["team-b"])  # type: ignore[union-attr]


def test_a_refused_unit_neither_blocks_a_block_queue_nor_holds_intelligent_low_units() -> None:
    block = Tenants(eq("q", "ns-a", cpu="2"), queues=(queue("q").policy("Block"),))
    block.add(
        unit("big-thief", "ns-b").quota("q").priority(9).cpu("1"),
        unit("owner", "ns-a").quota("q").priority(1).cpu("1"),
    )
    assert admitted(block.cycle()) == ["ns-a/owner"]

    smart = Tenants(eq("q", "ns-a", cpu="2"), queues=(queue("q").policy("Intelligent").threshold(4),))
    smart.add(
        unit("high-thief", "ns-b").quota("q").priority(9).cpu("1"),
        unit("low", "ns-a").quota("q").priority(1).cpu("1"),
    )
    plan = smart.cycle()
    assert admitted(plan) == ["ns-a/low"]
    assert park_of(plan, "ns-b/high-thief") is not None


def test_a_refused_unit_never_preempts() -> None:
    t = Tenants(eq("q", "ns-a", cpu="1"), queues=(queue("q").preemption(),))
    t.add(unit("low", "ns-a").quota("q").priority(1).cpu("1"))
    assert admitted(t.cycle()) == ["ns-a/low"]
    t.add(unit("high-thief", "ns-b").quota("q").priority(100).cpu("1"))
    plan = t.cycle()
    assert plan.marks == []
    assert park_of(plan, "ns-b/high-thief").message.startswith('quota "q" is not bound')  # type: ignore[union-attr]


def test_with_the_switch_off_any_namespace_may_use_any_quota() -> None:
    t = Tenants(eq("team-a", "ns-a"), binding=False)
    t.add(unit("u", "ns-b").quota("team-a").cpu("1"))
    assert admitted(t.cycle()) == ["ns-b/u"]


def test_units_routed_to_a_queue_created_later_are_still_refused() -> None:
    t = Tenants(eq("q", "ns-a"), queues=(queue("other"),))
    t.add(unit("u", "ns-b").quota("q").cpu("1"))
    assert park_of(t.cycle(), "ns-b/u").message == Message.queue_not_exist("q")  # type: ignore[union-attr]
    t.cache.put_queue(queue("q").build())
    plan = t.cycle()
    assert admitted(plan) == []
    assert park_of(plan, "ns-b/u").message.startswith('quota "q" is not bound')  # type: ignore[union-attr]


# --- same-named quotas ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("quotas", "expected"),
    [
        ([("ns-b", 0.0, "u2"), ("ns-a", 5.0, "u1")], "ns-b"),  # the oldest, whatever its namespace
        ([("ns-b", 5.0, "u1"), ("ns-a", 5.0, "u2")], "ns-a"),  # same second: namespace order
        ([("ns-a", 5.0, "u2"), ("ns-a", 5.0, "u1")], "u1"),  # same namespace (re-created): uid
    ],
)
def test_the_oldest_quota_counts_then_namespace_then_uid(
    quotas: list[tuple[str, float, str]], expected: str
) -> None:
    found = [eq("q", ns, created=at, uid=uid) for ns, at, uid in quotas]
    chosen = winner(found)
    assert chosen is not None and expected in (chosen.namespace, chosen.uid)


@settings(max_examples=60)
@given(
    st.lists(
        st.tuples(st.sampled_from(["ns-a", "ns-b", "ns-c", "ns-d"]), st.integers(0, 3), st.integers(1, 9)),
        min_size=1,
        max_size=6,
        unique_by=lambda t: t[0],
    ),
    st.randoms(),
)
def test_the_oldest_quota_counts_and_of_one_seconds_the_first_seen(
    specs: list[tuple[str, int, int]], rnd: Any
) -> None:
    quotas = [eq("q", ns, created=float(at), cpu=str(cpu)) for ns, at, cpu in specs]
    shuffled = list(quotas)
    rnd.shuffle(shuffled)
    expected = min(shuffled, key=lambda q: winner_key(q, shuffled.index(q)))
    ledger = QuotaLedger()
    for q in shuffled:
        ledger.put_quota(q)
    assert ledger.quotas["q"] == expected
    assert {(q.namespace, q.name) for q in ledger.ignored()} == {(q.namespace, "q") for q in quotas} - {
        (expected.namespace, "q")
    }
    assert ledger.bound_namespaces("q") == {expected.namespace}


def test_a_younger_same_named_quota_never_changes_the_limits_in_force() -> None:
    t = Tenants(eq("q", "ns-a", cpu="1"))
    t.add(unit("first", "ns-a").quota("q").cpu("1"), unit("second", "ns-a").quota("q").cpu("1"))
    assert admitted(t.cycle()) == ["ns-a/first"]
    epoch = t.cache.ledger.tree_epoch
    t.cache.put_quota(eq("q", "ns-z", cpu="100", created=10.0))
    assert t.cache.ledger.quotas["q"].namespace == "ns-a"
    assert t.cache.ledger.quotas["q"].max == {"cpu": 1000}
    assert t.cache.ledger.tree_epoch == epoch
    assert [(q.namespace, q.name) for q in t.cache.ledger.ignored()] == [("ns-z", "q")]
    assert admitted(t.cycle()) == []
    # ... and it binds nothing: units of its namespace may not use the name.
    t.add(unit("elsewhere", "ns-z").quota("q").cpu("1"))
    plan = t.cycle()
    assert park_of(plan, "ns-z/elsewhere").message.startswith('quota "q" is not bound to namespace "ns-z"')  # type: ignore[union-attr]


def test_when_the_winner_goes_the_next_oldest_takes_over() -> None:
    t = Tenants(eq("q", "ns-a", cpu="1"))
    t.cache.put_quota(eq("q", "ns-z", cpu="3", created=10.0))
    t.add(*(unit(f"u{i}", "ns-z").quota("q").cpu("1") for i in range(3)))
    assert admitted(t.cycle()) == []
    t.cache.delete_quota("q", "ns-a")
    assert t.cache.ledger.quotas["q"].namespace == "ns-z"
    assert t.cache.ledger.ignored() == []
    assert sorted(admitted(t.cycle())) == ["ns-z/u0", "ns-z/u1", "ns-z/u2"]


def test_deleting_an_ignored_quota_changes_nothing() -> None:
    ledger = QuotaLedger()
    ledger.put_quota(eq("q", "ns-a", cpu="1"))
    ledger.put_quota(eq("q", "ns-z", cpu="9", created=1.0))
    epoch = ledger.tree_epoch
    assert ledger.delete_quota("q", "ns-z") is False
    assert ledger.delete_quota("q", "ns-nowhere") is False
    assert ledger.tree_epoch == epoch and ledger.quotas["q"].max == {"cpu": 1000}


# --- the admission policy's ConfigMap and the Queue -----------------------------------------------


def test_binding_data_lists_the_winners_namespaces_and_each_namespaces_quotas() -> None:
    quotas = [
        eq("team-a", "ns-a", namespaces=["ns-c"]),
        eq("team-a", "ns-z", created=5.0, namespaces=["ns-y"]),  # ignored: binds nothing
        eq("team-b", "ns-b"),
    ]
    assert quotaqueues.binding_data(quotas, enforce=True) == {
        "enforce": "true",
        "holder.team-a": "ns-a",
        "holder.team-b": "ns-b",
        "q.team-a": " ns-a ns-c ",
        "q.team-b": " ns-b ",
        "ns.ns-a": "team-a",
        "ns.ns-b": "team-b",
        "ns.ns-c": "team-a",
    }
    assert quotaqueues.binding_data([], enforce=False) == {"enforce": "false"}


def test_binding_data_leaves_out_a_quota_name_too_long_for_a_configmap_key() -> None:
    long_name = "q" * 252
    data = quotaqueues.binding_data([eq(long_name, "ns-a")], enforce=True)
    assert f"q.{long_name}" not in data
    assert data["ns.ns-a"] == long_name


def test_the_queue_gets_neither_the_cap_nor_the_ignored_reason() -> None:
    raw = _quota_obj(
        {
            names.MAX_USER_PRIORITY_ANNOTATION: "10",
            names.IGNORED_REASON_ANNOTATION: "older one wins",
            names.WAIT_FOR_PODS_RUNNING_ANNOTATION: "true",
        }
    )
    assert quotaqueues.synced_annotations(raw) == {names.WAIT_FOR_PODS_RUNNING_ANNOTATION: "true"}


def test_ignored_patch_sets_and_clears_the_annotation_only_when_needed() -> None:
    raw = _quota_obj({})
    reason = names.duplicate_quota_message("ns-z", "q", "ns-a")
    assert quotaqueues.ignored_patch(raw, reason) == {
        "metadata": {"annotations": {names.IGNORED_REASON_ANNOTATION: reason}}
    }
    assert quotaqueues.ignored_patch(raw, None) is None
    marked = _quota_obj({names.IGNORED_REASON_ANNOTATION: reason})
    assert quotaqueues.ignored_patch(marked, reason) is None
    assert quotaqueues.ignored_patch(marked, None) == {
        "metadata": {"annotations": {names.IGNORED_REASON_ANNOTATION: None}}
    }
    assert "ElasticQuota ns-z/q is ignored" in reason and "ns-a/q" in reason


def _quota_obj(annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": names.QUOTA_API_VERSION,
        "kind": "ElasticQuota",
        "metadata": {"name": "q", "namespace": "ns-a", "annotations": annotations},
        "spec": {"max": {"cpu": "1"}},
    }


# --- the component configuration ----------------------------------------------------------------


HEAD = "apiVersion: scheduling.k8s.io/v1\nkind: KoordQueueConfiguration\n"


@pytest.mark.parametrize(
    ("body", "binding", "cap"),
    [
        ("", True, None),
        ("quotaNamespaceBinding: false\n", False, None),
        ("quotaNamespaceBinding: true\nmaxUserPriority: 1000\n", True, 1000),
        ("quotaNamespaceBinding:\nmaxUserPriority:\n", True, None),
        ("maxUserPriority: -5\n", True, -5),
    ],
)
def test_the_configuration_switch_and_cap(body: str, binding: bool, cap: int | None) -> None:
    settings_ = config.parse(HEAD + body)
    assert (settings_.quota_namespace_binding, settings_.max_user_priority) == (binding, cap)
    assert settings_.warnings == ()


@pytest.mark.parametrize(
    "body",
    [
        'quotaNamespaceBinding: "false"\n',
        "quotaNamespaceBinding: 0\n",
        "maxUserPriority: 10.5\n",
        'maxUserPriority: "100"\n',
        "maxUserPriority: true\n",
        "maxUserPriority: 2147483648\n",
    ],
)
def test_a_bad_switch_or_cap_is_refused_with_its_field(body: str) -> None:
    field = body.split(":", 1)[0]
    with pytest.raises(config.ConfigError, match=field):
        config.parse(HEAD + body)


# --- the priority cap -----------------------------------------------------------------------------


def _job(annotation: str | None, *, priority_class: str | None = None) -> dict[str, Any]:
    pod: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}
    if priority_class:
        pod["priorityClassName"] = priority_class
    annotations = {names.PRIORITY_ANNOTATION: annotation} if annotation is not None else {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "j",
            "namespace": "ns-a",
            "uid": "uid-j",
            "labels": {names.QUOTA_NAME_LABEL: "team-a"},
            "annotations": annotations,
        },
        "spec": {"parallelism": 1, "suspend": True, "template": {"spec": pod}},
    }


@settings(max_examples=80)
@given(
    st.integers(-(2**31), 2**31 - 1),
    st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1)),
)
def test_the_annotation_is_clamped_to_the_cap(asked: int, cap: int | None) -> None:
    _, value = jobext.resolve_priority(_job(str(asked)), BatchJobAdapter(), {}, max_user_priority=cap)
    assert value == (asked if cap is None else min(asked, cap))


def test_a_priority_class_is_never_clamped_and_the_unit_carries_the_clamped_value() -> None:
    adapter = BatchJobAdapter()
    classes = {"urgent": 100_000}
    assert jobext.resolve_priority(
        _job(None, priority_class="urgent"), adapter, classes, max_user_priority=10
    ) == (
        "urgent",
        100_000,
    )
    assert jobext.resolve_priority(
        _job("50", priority_class="urgent"), adapter, classes, max_user_priority=10
    ) == (
        "urgent",
        10,
    )
    unit_ = jobext.build_queue_unit(_job("5000"), adapter, {}, max_user_priority=100)
    assert unit_["spec"]["priority"] == 100
    assert jobext.desired_spec(_job("5000"), adapter, {})["priority"] == 5000  # no cap: as upstream


@pytest.mark.parametrize(
    ("cluster", "quota_cap", "expected"),
    [
        (None, None, None),
        (100, None, 100),
        (None, "50", 50),
        (100, "50", 50),
        (10, "50", 10),
        (None, "x", None),
    ],
)
def test_the_smallest_cap_applies(cluster: int | None, quota_cap: str | None, expected: int | None) -> None:
    assert priority_cap(cluster, eq("q", "ns-a", cap=quota_cap)) == expected
    assert priority_cap(cluster, None) == cluster


def test_the_per_quota_cap_is_read_leniently_and_validated_strictly() -> None:
    assert eq("q", "ns-a", cap="250").max_user_priority == 250
    bad = eq("q", "ns-a", cap="lots")
    assert bad.max_user_priority is None
    assert any(names.MAX_USER_PRIORITY_ANNOTATION in p for p in bad.problems)
    errors = validation.validate_elastic_quota(_quota_obj({names.MAX_USER_PRIORITY_ANNOTATION: "lots"}))
    assert [e.path for e in errors] == [f"metadata.annotations[{names.MAX_USER_PRIORITY_ANNOTATION}]"]
    assert validation.validate_elastic_quota(_quota_obj({names.MAX_USER_PRIORITY_ANNOTATION: "250"})) == []


@pytest.mark.parametrize(
    ("value", "paths"),
    [
        ('["ns-b","ns-c"]', []),
        ("", []),
        ("[ns-b]", [""]),
        ('{"ns-b": 1}', [""]),
        ('["ns-b", "NS-C", 3]', ["[1]", "[2]"]),
    ],
)
def test_the_webhook_checks_the_namespaces_annotation(value: str, paths: list[str]) -> None:
    errors = validation.validate_elastic_quota(_quota_obj({names.QUOTA_NAMESPACES_ANNOTATION: value}))
    base_path = f"metadata.annotations[{names.QUOTA_NAMESPACES_ANNOTATION}]"
    assert [e.path for e in errors] == [base_path + p for p in paths]


# --- at the door ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "cap", "denied"),
    [("100", 100, False), ("101", 100, True), ("-7", 100, False), ("5000", None, False), ("+101", 100, True)],
)
def test_validate_job_annotations_refuses_a_priority_above_the_cluster_cap(
    value: str, cap: int | None, denied: bool
) -> None:
    errors = validation.validate_job_annotations({names.PRIORITY_ANNOTATION: value}, max_priority=cap)
    assert bool(errors) is denied
    if denied:
        assert str(errors[0]) == (
            f'metadata.annotations[{names.PRIORITY_ANNOTATION}]: Invalid value: "{value}": must be at most '
            f"{cap}, the highest priority jobs may ask for in this cluster (maxUserPriority); use a lower "
            "value, or ask a cluster admin for a PriorityClass"
        )


def test_an_unchanged_priority_above_the_cap_is_not_refused_again() -> None:
    old = {names.PRIORITY_ANNOTATION: "5000"}
    assert validation.validate_job_annotations(dict(old), unchanged=old, max_priority=10) == []


def _review(job: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "r1",
            "kind": {"group": "batch", "version": "v1", "kind": "Job"},
            "operation": "CREATE",
            "namespace": "ns-a",
            "name": "j",
            "userInfo": {"username": "alice"},
            "object": job,
        },
    }


def test_the_webhook_denies_a_priority_above_its_cap_and_allows_it_without_one() -> None:
    capped = admission.AdmissionConfig(max_user_priority=100)
    answer = admission.review(
        _review(_job("101")), operation=admission.Operation.VALIDATE, config=capped, now_text="t"
    )["response"]
    assert answer["allowed"] is False
    assert "must be at most 100" in answer["status"]["message"]
    for cfg, value in ((capped, "100"), (admission.AdmissionConfig(), "101")):
        answer = admission.review(
            _review(_job(value)), operation=admission.Operation.VALIDATE, config=cfg, now_text="t"
        )["response"]
        assert answer["allowed"] is True, answer


def test_the_webhook_flag_sets_the_cap() -> None:
    from koord_queue.webhook import main as webhook_main

    cfg, _ = webhook_main.parse_config(["--max-user-priority=250"])
    assert cfg.admission.max_user_priority == 250
    cfg, _ = webhook_main.parse_config([])
    assert cfg.admission.max_user_priority is None
    with pytest.raises(SystemExit):
        webhook_main.parse_config(["--max-user-priority=4294967296"])
