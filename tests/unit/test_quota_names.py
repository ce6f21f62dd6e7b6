"""Quota names are unique: the quota that first claims a name keeps it
(docs/compatibility.md#same-named-quotas).

Covers, with plain data and the reconciler's Queue sync over an in-memory API:

* the rule: the namespace the name's Queue records as the holder counts, whatever the timestamps
  say; without a record the oldest counts and, of quotas made in one second (timestamps have whole
  seconds only), the first seen, not the first by namespace;
* the scheduler's cache follows the record: a team's units keep being admitted beside a duplicate
  made in another namespace in the same second, and after a restart that lists the duplicate first;
* the reconciler claims the name by creating the Queue (recording the holder), respects a record
  another writer made, moves a claim only once its holder is really gone (asked directly, not read
  from a lagging store), and tells every duplicate which quota holds the name;
* the admission policy's ConfigMap names the holder of every name, for the door's refusal.

The real apiserver runs the same paths in tests/integration/test_quota_names.py.
"""

from __future__ import annotations

import dataclasses

from koord_queue.reconciler.quotas import QuotaQueueSync
from koord_queue.shared import kube
from koord_queue.shared.api import names, parsing
from koord_queue.shared.api.model import QueueConfig
from koord_queue.shared.core import quotaqueues
from koord_queue.shared.core.quota import QuotaLedger, winner
from koord_queue.shared.core.scheduling import Cache
from tests.unit.test_model import queue, unit
from tests.unit.test_quota_sync import Events, FakeAPI, quota_obj
from tests.unit.test_tenancy import Tenants, admitted, eq, park_of

TEAM = "team-a"  # the original team's namespace
EARLY = "a-dup"  # a namespace that sorts before the team's: the old tie-break chose it


def held(name: str, holder: str) -> QueueConfig:
    """The Queue of quota ``name`` as the reconciler writes it: it records the holder."""
    return dataclasses.replace(queue(name).build(), quota_holder=holder)


# --- the rule ----------------------------------------------------------------------------------------


def test_the_recorded_holder_counts_whatever_the_timestamps_say() -> None:
    original = eq("q", TEAM, created=10.0)
    older_duplicate = eq("q", EARLY, created=0.0)
    assert winner([older_duplicate, original], holder=TEAM) == original
    assert winner([older_duplicate, original]) == older_duplicate  # no record: the oldest


def test_of_quotas_made_in_one_second_the_first_seen_counts_not_the_first_namespace() -> None:
    original, duplicate = eq("q", TEAM, created=5.0), eq("q", EARLY, created=5.0)
    assert winner([original, duplicate], arrival={TEAM: 1, EARLY: 2}) == original
    assert winner([original, duplicate], arrival={TEAM: 2, EARLY: 1}) == duplicate


def test_a_holder_that_is_gone_leaves_the_name_to_the_rule() -> None:
    duplicate = eq("q", EARLY, created=5.0)
    assert winner([duplicate], holder=TEAM) == duplicate
    assert winner([], holder=TEAM) is None


def test_the_ledger_elects_the_holder_once_the_queue_records_it() -> None:
    ledger = QuotaLedger()
    ledger.put_quota(eq("q", EARLY, cpu="100", created=0.0))
    ledger.put_quota(eq("q", TEAM, cpu="1", created=3.0))
    assert ledger.quotas["q"].namespace == EARLY
    assert ledger.set_holder("q", TEAM) is True  # the limits in force changed
    assert ledger.quotas["q"].namespace == TEAM
    assert [q.namespace for q in ledger.ignored()] == [EARLY]
    assert ledger.bound_namespaces("q") == frozenset({TEAM})
    assert ledger.set_holder("q", TEAM) is False  # said again: nothing changes


def test_the_queue_record_is_parsed() -> None:
    raw = {
        "metadata": {"name": "q", "annotations": {names.QUOTA_HOLDER_ANNOTATION: TEAM}},
        "spec": {"queuePolicy": "Priority"},
    }
    assert parsing.parse_queue(raw).quota_holder == TEAM
    assert parsing.parse_queue({"metadata": {"name": "q"}}).quota_holder == ""


# --- the scheduler keeps serving the team ----------------------------------------------------------


def test_a_duplicate_made_in_the_same_second_elsewhere_never_locks_the_team_out() -> None:
    t = Tenants(eq("q", TEAM, cpu="2", created=7.0))
    t.cache.put_quota(eq("q", EARLY, cpu="0", created=7.0))  # same second, seen after
    t.add(unit("job-1", TEAM).quota("q").cpu("1"))
    plan = t.cycle()
    assert admitted(plan) == [f"{TEAM}/job-1"]
    # ... and the duplicate serves nobody, not even its own namespace.
    t.add(unit("elsewhere", EARLY).quota("q").cpu("1"))
    refusal = park_of(t.cycle(), f"{EARLY}/elsewhere")
    assert refusal is not None
    assert refusal.message == names.quota_not_bound_message("q", EARLY, [])


def test_after_a_restart_that_lists_the_duplicate_first_the_holder_still_counts() -> None:
    cache = Cache()
    # A fresh reconciler lists quotas in namespace order, and both carry the same second.
    cache.put_quota(eq("q", EARLY, cpu="0", created=7.0))
    cache.put_quota(eq("q", TEAM, cpu="2", created=7.0))
    cache.put_queue(held("q", TEAM))
    assert cache.ledger.quotas["q"].namespace == TEAM
    cache.put_unit(unit("job-1", TEAM).quota("q").cpu("1").build())
    assert [a.key for a in cache.schedule(2e9).admits] == [f"{TEAM}/job-1"]


def test_a_queue_record_arriving_after_the_units_rebinds_them() -> None:
    cache = Cache()
    cache.put_quota(eq("q", EARLY, created=0.0))
    cache.put_quota(eq("q", TEAM, created=9.0))
    cache.put_queue(queue("q").build())  # no record yet: the oldest (the duplicate) counts
    cache.put_unit(unit("job-1", TEAM).quota("q").cpu("1").build())
    plan = cache.schedule(2e9)
    assert plan.admits == [] and "not bound" in plan.parks[0].message
    cache.put_queue(held("q", TEAM))
    assert [a.key for a in cache.schedule(2e9 + 1).admits] == [f"{TEAM}/job-1"]


# --- the door's parameters ---------------------------------------------------------------------------


def test_the_bindings_configmap_names_the_holder_of_every_name() -> None:
    data = quotaqueues.binding_data([eq("q", TEAM), eq("r", EARLY)], enforce=False)
    assert data[names.QUOTA_BINDING_HOLDER_PREFIX + "q"] == TEAM
    assert data[names.QUOTA_BINDING_HOLDER_PREFIX + "r"] == EARLY


def test_a_quotas_own_holder_annotation_is_not_copied_to_its_queue() -> None:
    raw = quota_obj("q", TEAM, annotations={names.QUOTA_HOLDER_ANNOTATION: EARLY})
    assert quotaqueues.intent(raw, names.COMPONENT_NAMESPACE).queue["metadata"]["annotations"] == {
        names.QUOTA_HOLDER_ANNOTATION: TEAM
    }


def test_the_messages_name_the_holder() -> None:
    taken = names.quota_name_taken_message("q", TEAM)
    assert taken.startswith('quota name "q" is already held by ElasticQuota team-a/q')
    ignored = names.duplicate_quota_message(EARLY, "q", TEAM)
    assert ignored.startswith(taken) and f"ElasticQuota {EARLY}/q is ignored" in ignored


# --- the reconciler's claim ----------------------------------------------------------------------------


class QueueAPI(FakeAPI):
    """The fake API with Queues that behave as the apiserver's: a second create is refused."""

    async def create(self, res: kube.Resource, obj: kube.Obj, *, namespace: str | None = None) -> kube.Obj:
        if self._key(res, obj["metadata"]["name"], namespace) in self.objects:
            raise kube.Conflict(409, "AlreadyExists", "already exists")
        return await super().create(res, obj, namespace=namespace)

    def queue(self, name: str) -> kube.Obj | None:
        return self.objects.get((names.QUEUE_PLURAL, names.COMPONENT_NAMESPACE, name))


class World:
    """A quota store fed like the informer feeds it, and the Queue sync over it."""

    def __init__(self, api: QueueAPI | None = None) -> None:
        self.api = api or QueueAPI()
        self.events = Events()
        self.store: dict[str, kube.Obj] = {}
        self.queues: dict[str, kube.Obj] = {}
        self.sync = QuotaQueueSync(
            self.api,  # type: ignore[arg-type]
            quotas=lambda: self.store,
            queues=lambda: self.queues,
            events=self.events,  # type: ignore[arg-type]
            namespace=names.COMPONENT_NAMESPACE,
        )

    def add(self, obj: kube.Obj) -> None:
        meta = obj["metadata"]
        self.store[f"{meta['namespace']}/{meta['name']}"] = obj
        self.sync.on_quota(None, obj)

    def remove(self, namespace: str, name: str) -> None:
        self.sync.on_quota(self.store.pop(f"{namespace}/{name}"), None)

    def holder(self, name: str) -> str | None:
        return quotaqueues.holder_of(self.api.queue(name))


async def test_the_first_quota_seen_claims_the_name_and_the_duplicate_is_told_who_holds_it() -> None:
    w = World()
    w.add(quota_obj("q", TEAM))
    w.add(quota_obj("q", EARLY))  # the same second, delivered after
    await w.sync.sync("q")
    assert w.holder("q") == TEAM
    reason = names.duplicate_quota_message(EARLY, "q", TEAM)
    assert w.events.recorded == [(f"{EARLY}/q", names.DUPLICATE_QUOTA_NAME_REASON, reason)]
    told = {"metadata": {"annotations": {names.IGNORED_REASON_ANNOTATION: reason}}}
    assert ("patch", f"{EARLY}/q", told) in w.api.writes


async def test_a_record_another_writer_made_first_decides() -> None:
    api = QueueAPI()
    earlier = quotaqueues.intent(quota_obj("q", TEAM), names.COMPONENT_NAMESPACE).queue
    api._store((names.QUEUE_PLURAL, names.COMPONENT_NAMESPACE, "q"), earlier)  # a previous leader's
    w = World(api)
    w.add(quota_obj("q", EARLY, created="2025-01-01T00:00:00Z"))  # older, and first in this store
    w.add(quota_obj("q", TEAM))
    await w.sync.sync("q")  # the store shows no Queue yet: the create fails, the record is read
    assert w.holder("q") == TEAM
    assert [e[0] for e in w.events.recorded] == [f"{EARLY}/q"]


async def test_a_holder_missing_from_a_lagging_store_keeps_the_name() -> None:
    w = World()
    team = quota_obj("q", TEAM)
    w.api._store((names.QUOTA_PLURAL, TEAM, "q"), team)  # in the cluster ...
    w.queues[f"{names.COMPONENT_NAMESPACE}/q"] = quotaqueues.intent(team, names.COMPONENT_NAMESPACE).queue
    w.add(quota_obj("q", EARLY))  # ... but the store has only seen the duplicate
    await w.sync.sync("q")
    assert not any(verb == "patch" and target == "koord-queue/q" for verb, target, _ in w.api.writes)
    assert [e[0] for e in w.events.recorded] == [f"{EARLY}/q"]


async def test_once_the_holder_is_gone_the_next_quota_takes_the_name() -> None:
    w = World()
    w.add(quota_obj("q", TEAM))
    w.add(quota_obj("q", EARLY))
    await w.sync.sync("q")
    w.queues[f"{names.COMPONENT_NAMESPACE}/q"] = w.api.queue("q") or {}
    reason = names.duplicate_quota_message(EARLY, "q", TEAM)
    w.store[f"{EARLY}/q"]["metadata"]["annotations"][names.IGNORED_REASON_ANNOTATION] = reason  # landed
    w.remove(TEAM, "q")  # deleted: neither the store nor the API has it
    await w.sync.sync("q")
    assert w.api.writes[-2:] == [
        ("patch", f"{EARLY}/q", {"metadata": {"annotations": {names.IGNORED_REASON_ANNOTATION: None}}}),
        ("patch", "koord-queue/q", {"metadata": {"annotations": {names.QUOTA_HOLDER_ANNOTATION: EARLY}}}),
    ]


async def test_a_queue_deleted_behind_our_back_comes_back_naming_the_same_holder() -> None:
    w = World()
    w.add(quota_obj("q", TEAM))
    w.add(quota_obj("q", EARLY))
    await w.sync.sync("q")
    queue = w.api.objects.pop((names.QUEUE_PLURAL, names.COMPONENT_NAMESPACE, "q"))
    w.sync._arrival.clear()  # as after a restart, nothing of the arrival order is left
    w.sync.on_queue_gone(queue)
    assert "q" in w.sync._dirty
    await w.sync.sync("q")
    assert w.holder("q") == TEAM
