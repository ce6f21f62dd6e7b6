"""Quota usage and the quota filter: what units hold, and whether a request fits
(docs/compatibility.md#usage-and-the-quota-filter).

Usage is computed from ``status.admissions``
(docs/architecture.md#decision-2-the-cluster-is-the-source-of-truth), kept per quota *and* per ancestor,
and updated on every watch event in O(depth). Where upstream falls short we do better, deliberately:

* **Symmetric accounting.** Upstream adds a unit's admissions but removes its ``spec.resource``, so
  usage drifts. Here one function, ``shared.core.charges.reserved_resources``, computes what a unit holds; the
  ledger remembers exactly what it added per unit and removes exactly that, so usage after any
  sequence of events equals the sum over the units present (a restart rebuilds the same numbers).
* **Exact milli arithmetic**: cpu ``500m`` stays 500 milli-cpu; upstream rounds it up to 1.
* **The request checked is the remaining demand** (pod sets minus admitted replicas), not the
  whole ``spec.resource``, so a partially admitted unit is not double counted.

What a unit holds, per admission: ``max(per_pod x replicas, admissions[i].resources)`` per resource.
``reclaimState`` is **not** subtracted (as upstream): a marked victim keeps holding its quota until
the job extension has deleted its pods and shrunk ``replicas``. Otherwise the preemptor could be
admitted while the victim's pods still exist, and sampled usage could exceed ``max``. Units in a
terminal phase hold nothing (upstream clears their admissions at the same moment). Legacy units with
no admissions but a "dequeued" phase hold ``spec.resource``.

**One quota per name.** Quotas are keyed by name (as upstream, whose units name their quota by a
label), yet ElasticQuotas are namespaced, so two namespaces may hold quotas of the same name. Upstream
lets the later event silently replace the earlier quota's limits. Here every same-named quota is
kept, and one rule picks the one that counts (:func:`winner`): the quota whose namespace the name's
Queue records as the holder (``set_holder``; the reconciler writes it when it first creates the
Queue), else the oldest, the first seen, then by namespace and uid. The others are ignored
everywhere (limits, Queue, namespace bindings) until the holder is gone, so adding a quota can never
change the limits in force, even one created in the same second.

**Namespace bindings.** A quota may be used by units of its own namespace and of the namespaces its
``quota.scheduling.koordinator.sh/namespaces`` annotation lists (Koordinator's meaning). With the
switch on (``quotaNamespaceBinding``, the default), :meth:`QuotaLedger.binding_problem` says why a
unit of another namespace may not use it; the scheduler keeps such a unit waiting with that text.
A quota that does not exist binds nothing and refuses nothing here: its units wait for it anyway.

The filter walks from the unit's quota up the parent chain to ``koordinator-root-quota`` (never
checked itself) and at every level compares the request with ``max - used``: resources absent from
``max`` are unlimited; an empty ``max`` rejects any non-empty request. A cycle or a missing ancestor
fails with upstream's texts. Below a parent that is a quota, the view also holds each quota's
*runtime* (``shared.core.guarantees``: its ``min`` plus its fair share of what siblings leave) as a
second limit at that level (docs/compatibility.md#quota-guarantees); with guarantees switched off,
``min`` is ignored as upstream does.

Pure: standard library and sibling modules only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from koord_queue.shared.api import names, quantities
from koord_queue.shared.api.model import Quota, Unit
from koord_queue.shared.api.names import Message
from koord_queue.shared.api.quantities import Resources
from koord_queue.shared.core import charges

__all__ = [
    "Chain",
    "QuotaLedger",
    "Route",
    "priority_cap",
    "winner",
    "winner_key",
]


@dataclass(frozen=True, slots=True)
class Chain:
    """The quotas from a leaf up to the root, and the structural error that cut the walk short.

    ``names`` are the existing quotas walked, leaf first. ``error`` is ``"cycle"`` or ``"missing"``
    with ``error_quota`` the name at which it happened.
    """

    names: tuple[str, ...]
    error: str | None = None
    error_quota: str = ""

    def message(self, item: str) -> str | None:
        if self.error == "cycle":
            return Message.quota_cycle(item, self.error_quota, list(self.names))
        if self.error == "missing":
            return Message.quota_missing(item, self.error_quota, list(self.names))
        return None


@dataclass(frozen=True, slots=True)
class Route:
    """One way a unit of a quota can be admitted (docs/pools.md#fallback-between-pools): into
    ``pool`` (empty: no pool, nothing placed), charged to its own quota's chain and, when ``via``
    names a quota inside the pool, to that quota's chain too."""

    pool: str
    via: str = ""


_PLAIN = (Route(""),)


def winner_key(quota: Quota, arrival: int = 0) -> tuple[float, int, str, str]:
    """Order of same-named quotas when none holds the name yet: the first counts (oldest, then
    the first seen, then namespace, then uid). Creation times have whole seconds only, so two
    quotas made in one second are told apart by ``arrival``: the order the watch delivered them,
    which for quotas created while the reconciler runs is the order they were created in."""
    return (quota.created, arrival, quota.namespace, quota.uid)


def winner(
    quotas: Iterable[Quota], *, holder: str | None = None, arrival: Mapping[str, int] | None = None
) -> Quota | None:
    """The quota that counts among same-named ones, None for none
    (docs/compatibility.md#same-named-quotas).

    ``holder`` is the namespace recorded on the name's Queue as holding it: that quota counts
    whatever the timestamps say. When it is not among ``quotas`` (deleted, or no claim yet) the
    first by :func:`winner_key` counts, ``arrival`` giving each namespace's order of arrival."""
    found = list(quotas)
    for quota in found:
        if holder is not None and quota.namespace == holder:
            return quota
    seen = arrival or {}
    return min(found, key=lambda q: winner_key(q, seen.get(q.namespace, 0)), default=None)


def _limits(quota: Quota) -> tuple[object, ...]:
    """What of a quota decides admissions (a change wakes the queues that depend on it)."""
    return (
        quota.parent,
        quota.max,
        quota.min,
        quota.is_parent,
        quota.lends,
        quota.shared_weight,
        quota.pool,
        quota.pool_quotas,
    )


def priority_cap(cluster_cap: int | None, quota: Quota | None) -> int | None:
    """The smallest of the cluster-wide cap and the quota's own cap (None: no cap at all)."""
    caps = [c for c in (cluster_cap, quota.max_user_priority if quota is not None else None) if c is not None]
    return min(caps, default=None)


_EMPTY: Mapping[str, int] = MappingProxyType({})


def _nonzero(res: Mapping[str, int]) -> Resources:
    return {name: res[name] for name in sorted(res) if res[name] != 0}


class QuotaLedger:
    """Quota tree plus usage per quota (including every descendant's), kept incrementally.

    ``put_unit``/``delete_unit`` return the quotas whose usage *decreased* (a release), which is
    what makes parked units schedulable again. ``epoch(name)`` changes whenever the availability of
    any quota on ``name``'s chain may have grown (a release there, or any quota spec change).

    ``quotas`` holds, per name, the quota that counts; ``ignored`` the same-named others. With
    ``namespace_binding`` on, :meth:`binding_problem` tells which units may not use a quota, and
    :meth:`take_binding_changes` which quotas' and namespaces' answers changed since last asked.
    """

    def __init__(self, *, namespace_binding: bool = True) -> None:
        self.namespace_binding = namespace_binding
        self._candidates: dict[str, dict[str, Quota]] = {}
        #: per quota name, the namespaces of its quotas in order of arrival, and the namespace
        #: its Queue records as the holder (docs/compatibility.md#same-named-quotas)
        self._arrival: dict[str, dict[str, int]] = {}
        self._arrivals = 0
        self._holders: dict[str, str] = {}
        self._usable: dict[str, set[str]] = {}
        self._changed_quotas: set[str] = set()
        self._changed_namespaces: set[str] = set()
        self._quotas: dict[str, Quota] = {}
        self._self_used: dict[str, Resources] = {}
        self._used: dict[str, Resources] = {}
        self._contrib: dict[str, tuple[str, Resources, str]] = {}
        #: per (quota, pool quota), what units of the quota hold through that pool quota
        #: (docs/pools.md#fallback-between-pools); also counted in ``_self_used`` of the quota
        self._routed: dict[tuple[str, str], Resources] = {}
        #: per quota, per namespace, what the units of that namespace labelled with the quota hold
        #: (docs/compatibility.md#fair-order-inside-a-queue)
        self._ns_used: dict[str, dict[str, dict[str, int]]] = {}
        #: quotas (and quota, namespace pairs) whose usage changed since the usage history last
        #: took them (``take_usage_changes``; docs/compatibility.md#fair-over-time)
        self._usage_changed: set[str] = set()
        self._ns_changed: set[tuple[str, str]] = set()
        self._chains: dict[str, Chain] = {}
        self._route_names: dict[tuple[str, str], tuple[str, ...]] = {}
        self._routes: dict[str, tuple[Route, ...]] = {}
        self._epoch_names: dict[str, tuple[str, ...]] = {}
        self._routes_epoch = -1
        #: quotas that root a pool or fall back through pools: while none does, every route is
        #: the plain one and the pools cost nothing (docs/pools.md)
        self._pooled: set[str] = set()
        self._releases: dict[str, int] = {}
        self._tree_epoch = 0
        self._children: dict[str, tuple[str, ...]] = {}
        self._children_epoch = -1
        self._changed_parent: set[str] = set()
        self._per_tree: dict[str, tuple[int, object]] = {}

    # --- the tree ---------------------------------------------------------------------------------

    @property
    def quotas(self) -> Mapping[str, Quota]:
        return self._quotas

    @property
    def tree_epoch(self) -> int:
        """Changes on every change of any quota spec (limits or parents)."""
        return self._tree_epoch

    def touch(self) -> None:
        """Something outside the tree that decides admissions changed (the pools' placements):
        every epoch moves, so units parked on a quota failure are tried again."""
        self._tree_epoch += 1

    def put_quota(self, quota: Quota) -> bool:
        """Add or replace a quota (keyed by namespace and name); returns False when the limits in
        force did not change (a status update, an ignored same-named quota, an annotation)."""
        self._candidates.setdefault(quota.name, {})[quota.namespace] = quota
        arrival = self._arrival.setdefault(quota.name, {})
        if quota.namespace not in arrival:
            self._arrivals += 1
            arrival[quota.namespace] = self._arrivals
        return self._elect(quota.name)

    def set_holder(self, name: str, namespace: str | None) -> bool:
        """The namespace the Queue ``name`` records as holding the name (None: no record); returns
        whether the limits in force changed."""
        if self._holders.get(name) == namespace:
            return False
        if namespace is None:
            self._holders.pop(name, None)
        else:
            self._holders[name] = namespace
        return self._elect(name)

    def delete_quota(self, name: str, namespace: str | None = None) -> bool:
        """Remove the quota ``namespace/name`` (every quota of that name when ``namespace`` is
        None); a same-named quota left takes over. Returns whether the limits in force changed."""
        found = self._candidates.get(name)
        if not found:
            return False
        arrival = self._arrival.get(name, {})
        if namespace is None:
            found.clear()
            arrival.clear()
        elif found.pop(namespace, None) is None:
            return False
        else:
            arrival.pop(namespace, None)
        if not found:
            del self._candidates[name]
            self._arrival.pop(name, None)
        return self._elect(name)

    def ignored(self) -> list[Quota]:
        """Quotas that do not count because another quota holds their name (sorted)."""
        out = [
            q
            for name in sorted(self._candidates)
            for q in self._candidates[name].values()
            if q is not self._quotas.get(name)
        ]
        return sorted(out, key=lambda q: (q.name, q.namespace))

    def _elect(self, name: str) -> bool:
        old = self._quotas.get(name)
        new = winner(
            self._candidates.get(name, {}).values(),
            holder=self._holders.get(name),
            arrival=self._arrival.get(name),
        )
        if new is None:
            self._quotas.pop(name, None)
        else:
            self._quotas[name] = new
        if new is not None and (new.pool or new.pool_quotas):
            self._pooled.add(name)
        else:
            self._pooled.discard(name)
        self._note_binding(name, old, new)
        if old is None and new is None:
            return False
        if old is not None and new is not None and _limits(old) == _limits(new):
            return False
        self._tree_epoch += 1
        if old is None or new is None or old.parent != new.parent:
            self._rebuild()
        return True

    # --- namespace bindings -----------------------------------------------------------------------

    def _note_binding(self, name: str, old: Quota | None, new: Quota | None) -> None:
        before = old.bound_namespaces if old is not None else None
        after = new.bound_namespaces if new is not None else None
        if (old is not None and old.is_parent) != (new is not None and new.is_parent):
            self._changed_quotas.add(name)
            self._changed_parent.add(name)
        if before == after:
            return
        self._changed_quotas.add(name)
        for namespace in before or ():
            usable = self._usable.get(namespace)
            if usable is not None:
                usable.discard(name)
                if not usable:
                    del self._usable[namespace]
        for namespace in after or ():
            self._usable.setdefault(namespace, set()).add(name)
        self._changed_namespaces.update((before or frozenset()) ^ (after or frozenset()))

    def bound_namespaces(self, name: str) -> frozenset[str] | None:
        """The namespaces whose units may use quota ``name``; None when no check applies (the
        switch is off, or no such quota exists)."""
        quota = self._quotas.get(name)
        if quota is None or not self.namespace_binding:
            return None
        return quota.bound_namespaces

    def usable_in(self, namespace: str) -> tuple[str, ...]:
        """The quotas units of ``namespace`` may use, sorted (same-named losers excluded)."""
        return tuple(sorted(self._usable.get(namespace, ())))

    def binding_problem(self, quota: str, namespace: str) -> str | None:
        """Why units of ``namespace`` may not use ``quota``, or None when they may: a parent quota
        (``is-parent``) takes no jobs at all; otherwise the namespace binding decides."""
        found = self._quotas.get(quota)
        if found is not None and found.is_parent:
            return Message.parent_quota(quota)
        if not self.namespace_binding or found is None:
            return None
        if namespace == found.namespace or namespace in found.extra_namespaces:
            return None  # (on every unit event: no set is built here)
        return names.quota_not_bound_message(quota, namespace, self.usable_in(namespace))

    def take_binding_changes(self) -> tuple[frozenset[str], frozenset[str]]:
        """``(quotas, namespaces)`` whose bound namespaces / usable quotas changed since the last
        call: the units labelled with those quotas, and the refused units of those namespaces,
        need their binding checked again."""
        changed = frozenset(self._changed_quotas), frozenset(self._changed_namespaces)
        parents = frozenset(self._changed_parent)
        self._changed_quotas.clear()
        self._changed_namespaces.clear()
        self._changed_parent.clear()
        if not self.namespace_binding:
            return parents, frozenset()  # the is-parent rule applies without the switch
        return changed

    @property
    def has_subquotas(self) -> bool:
        """Some quota has a parent other than the root: only then do guarantees matter."""
        return bool(self.children())

    def per_tree(self, key: str, make: Callable[[], object]) -> object:
        """``make()``, remembered under ``key`` until the tree changes (limits or parents)."""
        found = self._per_tree.get(key)
        if found is None or found[0] != self._tree_epoch:
            found = self._per_tree[key] = (self._tree_epoch, make())
        return found[1]

    def children(self) -> Mapping[str, tuple[str, ...]]:
        """Parent name -> its child quotas (sorted), for parents that are quotas themselves (the
        root's children are not listed); cached until the tree changes."""
        if self._children_epoch != self._tree_epoch:
            found: dict[str, list[str]] = {}
            for name in sorted(self._quotas):
                parent = self._quotas[name].parent
                if parent and parent != names.ROOT_QUOTA and parent in self._quotas:
                    found.setdefault(parent, []).append(name)
            self._children = {p: tuple(c) for p, c in found.items()}
            self._children_epoch = self._tree_epoch
        return self._children

    def chain(self, name: str) -> Chain:
        """Cycle-safe walk from ``name`` to the root (cached until the tree changes)."""
        cached = self._chains.get(name)
        if cached is not None:
            return cached
        walked: list[str] = []
        current = name
        chain = Chain(names=())
        while current != names.ROOT_QUOTA:
            if current in walked:
                chain = Chain(tuple(walked), "cycle", current)
                break
            quota = self._quotas.get(current)
            if quota is None:
                chain = Chain(tuple(walked), "missing", current)
                break
            walked.append(current)
            if not quota.parent:
                chain = Chain(tuple(walked))
                break
            current = quota.parent
        else:
            chain = Chain(tuple(walked))
        self._chains[name] = chain
        return chain

    # --- pools (docs/pools.md) ----------------------------------------------------------------------

    def pool_of(self, name: str) -> str:
        """The pool whose root tops ``name``'s parent chain; empty for none (or a broken chain)."""
        chain = self.chain(name)
        if chain.error is not None or not chain.names:
            return ""
        return self._quotas[chain.names[-1]].pool

    @property
    def pooled(self) -> bool:
        """Some quota roots a pool or falls back through pools."""
        return bool(self._pooled)

    def routes(self, name: str) -> tuple[Route, ...]:
        """The routes of quota ``name`` in order: one per quota its ``koord-queue/pool-quotas``
        lists, else its own (in its own pool, if any); cached until the tree changes."""
        if not self._pooled:
            return _PLAIN
        self._fresh()
        found = self._routes.get(name)
        if found is None:
            quota = self._quotas.get(name)
            listed = quota.pool_quotas if quota is not None else ()
            found = (
                tuple(Route(self.pool_of(via), via) for via in listed)
                if listed
                else (Route(self.pool_of(name)),)
            )
            self._routes[name] = found
        return found

    def route_names(self, leaf: str, via: str) -> tuple[str, ...]:
        """The quotas a unit of ``leaf`` admitted through ``via`` is charged to: ``leaf``'s chain,
        then the part of ``via``'s chain not already in it."""
        if not via:
            return self.chain(leaf).names
        self._fresh()
        found = self._route_names.get((leaf, via))
        if found is None:
            own = self.chain(leaf).names
            found = own + tuple(n for n in self.chain(via).names if n not in own)
            self._route_names[(leaf, via)] = found
        return found

    def _fresh(self) -> None:
        if self._routes_epoch != self._tree_epoch:
            self._routes_epoch = self._tree_epoch
            self._routes.clear()
            self._route_names.clear()
            self._epoch_names.clear()

    def _rebuild(self) -> None:
        self._chains.clear()
        self._route_names.clear()
        self._routes.clear()
        self._epoch_names.clear()
        self._used = {}
        for leaf in sorted(self._self_used):
            for name in self.chain(leaf).names:
                self._used[name] = quantities.add(self._used.get(name, {}), self._self_used[leaf])
        for (leaf, via), res in sorted(self._routed.items()):
            own = self.chain(leaf).names
            for name in self.route_names(leaf, via):
                if name not in own:
                    self._used[name] = quantities.add(self._used.get(name, {}), res)

    # --- usage ------------------------------------------------------------------------------------

    def used(self, name: str) -> Resources:
        """Usage of ``name`` including all its descendants (a copy, zeros dropped)."""
        return _nonzero(self._used.get(name, {}))

    def holding(self, name: str) -> Mapping[str, int]:
        """Usage of ``name`` including its descendants, read only and live (zeros may appear): for
        a caller that copies what it keeps, without :meth:`used`'s sorting."""
        return self._used.get(name, _EMPTY)

    def self_used(self, name: str) -> Resources:
        """Usage of the units labelled with ``name`` itself (a copy, zeros dropped)."""
        return _nonzero(self._self_used.get(name, {}))

    def contribution(self, key: str) -> tuple[str, Resources] | None:
        found = self._contrib.get(key)
        return None if found is None else (found[0], found[1])

    def charged_via(self, key: str) -> str:
        """The pool quota the unit ``key`` is charged through, empty for none."""
        found = self._contrib.get(key)
        return found[2] if found is not None else ""

    def epoch(self, name: str) -> int:
        """Changes when room may have grown for ``name``'s units: on any route of theirs."""
        if not self._pooled:
            return self._tree_epoch + sum(self._releases.get(n, 0) for n in self.chain(name).names)
        self._fresh()
        watched = self._epoch_names.get(name)
        if watched is None:
            routes = self.routes(name)
            if len(routes) == 1 and not routes[0].via:
                watched = self.chain(name).names
            else:
                seen: dict[str, None] = dict.fromkeys(self.chain(name).names)
                for route in routes:
                    seen.update(dict.fromkeys(self.route_names(name, route.via)))
                watched = tuple(seen)
            self._epoch_names[name] = watched
        return self._tree_epoch + sum(self._releases.get(n, 0) for n in watched)

    def put_unit(self, unit: Unit) -> frozenset[str]:
        """Record what ``unit`` holds now; returns the quotas whose usage decreased."""
        held = charges.reserved_resources(unit) if unit.quota else {}
        if not unit.quota or not held:
            return self._set(unit.key, None)
        return self._set(unit.key, (unit.quota, held, unit.pool_quota))

    def delete_unit(self, key: str) -> frozenset[str]:
        return self._set(key, None)

    def apply(self, old: Unit | None, new: Unit | None) -> frozenset[str]:
        """Watch-event form: ``(None, u)`` add, ``(u, u')`` update, ``(u, None)`` delete."""
        if new is None:
            return self.delete_unit(old.key) if old is not None else frozenset()
        released = frozenset[str]()
        if old is not None and old.key != new.key:
            released = self.delete_unit(old.key)
        return released | self.put_unit(new)

    def _set(self, key: str, new: tuple[str, Resources, str] | None) -> frozenset[str]:
        old = self._contrib.get(key)
        if old == new:
            return frozenset()
        delta: dict[str, dict[str, int]] = {}
        namespace = key.partition("/")[0]
        if old is not None:
            self._contrib.pop(key)
            self._move(old[0], old[1], -1, delta, old[2])
            self._by_namespace(old[0], namespace, old[1], -1)
        if new is not None:
            self._contrib[key] = new
            self._move(new[0], new[1], 1, delta, new[2])
            self._by_namespace(new[0], namespace, new[1], 1)
        self._usage_changed.update(delta)
        released = frozenset(n for n, d in delta.items() if any(v < 0 for v in d.values()))
        for name in released:
            self._releases[name] = self._releases.get(name, 0) + 1
        return released

    def _by_namespace(self, leaf: str, namespace: str, res: Resources, sign: int) -> None:
        self._ns_changed.add((leaf, namespace))
        per = self._ns_used.setdefault(leaf, {})
        own = per.setdefault(namespace, {})
        for r, v in res.items():
            own[r] = own.get(r, 0) + sign * v
        if quantities.is_zero(own):
            del per[namespace]
            if not per:
                del self._ns_used[leaf]

    def take_usage_changes(self) -> tuple[set[str], set[tuple[str, str]]]:
        """The quotas, and the (quota, namespace) pairs, whose usage changed since the last call."""
        quotas, pairs = self._usage_changed, self._ns_changed
        self._usage_changed, self._ns_changed = set(), set()
        return quotas, pairs

    def namespace_used(self, name: str) -> Mapping[str, Resources]:
        """Per namespace, what its units labelled with ``name`` itself hold (read only)."""
        return self._ns_used.get(name, {})

    def _move(
        self, leaf: str, res: Resources, sign: int, delta: dict[str, dict[str, int]], via: str = ""
    ) -> None:
        own = self._self_used.setdefault(leaf, {})
        for r, v in res.items():
            own[r] = own.get(r, 0) + sign * v
        if quantities.is_zero(own):
            del self._self_used[leaf]
        if via:
            routed = self._routed.setdefault((leaf, via), {})
            for r, v in res.items():
                routed[r] = routed.get(r, 0) + sign * v
            if quantities.is_zero(routed):
                del self._routed[(leaf, via)]
        for name in self.route_names(leaf, via) if via else self.chain(leaf).names:
            used = self._used.setdefault(name, {})
            d = delta.setdefault(name, {})
            for r, v in res.items():
                used[r] = used.get(r, 0) + sign * v
                d[r] = d.get(r, 0) + sign * v
