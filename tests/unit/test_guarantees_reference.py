"""The exact guarantee (docs/compatibility.md#quota-guarantees) against a brute-force reference.

Hypothesis draws small quota trees (at most 4 quotas, two or three levels, cpu and memory, some
quotas that do not lend, some with a ``shared-weight``, some whose ``max`` leaves a resource out)
and up to 8 single-pod units on the leaves, then runs the scheduler's own cycles until nothing more
is admitted. The reference below is written from the documented rules alone, over plain integers
(whole cpus and whole GiB) and the admissions the plans announced; it calls none of the product's
helpers. After every cycle it checks:

* **capacity**: no quota holds more than its ``max`` on any resource it names;
* **the guarantee**: no unit is left waiting that fits within ``min`` at its own quota and at every
  quota above it below the top, while every level (the top included) has room for it under ``max``.

And once nothing more is admitted (**work conservation**): no unit is left waiting that fits under
every ``max`` on its chain and, at each level, leaves the siblings what their ``min`` still holds
for them (all of the unused ``min`` of a quota that does not lend; of one that lends, the unused
part of its ``min`` its own waiting demand, or its children's claims, reach).

Two hand-written examples join the drawn ones: a share rounded to whole units, and a five-quota
tree where a lending quota's claim must cover a child that does not lend.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from hypothesis import example, given, settings
from hypothesis import strategies as st

from koord_queue.shared.api import names, parsing
from koord_queue.shared.core.scheduling import Cache
from tests.unit.test_model import queue, unit
from tests.unit.test_scheduling import World, admits

RESOURCES = ("cpu", "memory")
#: whole units of each resource, as the API spells them
SUFFIX = {"cpu": "", "memory": "Gi"}

# --- the reference ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RefQuota:
    name: str
    parent: str  # "" for the top
    min: dict[str, int]
    max: dict[str, int]  # a resource left out is unlimited
    lends: bool = True
    weight: dict[str, int] | None = None


@dataclass(frozen=True)
class RefUnit:
    name: str
    quota: str
    request: dict[str, int]


@dataclass
class Reference:
    quotas: dict[str, RefQuota]
    units: dict[str, RefUnit]
    admitted: set[str] = field(default_factory=set)

    def chain(self, leaf: str) -> list[str]:
        out = [leaf]
        while self.quotas[out[-1]].parent:
            out.append(self.quotas[out[-1]].parent)
        return out

    def used(self, name: str) -> dict[str, int]:
        total = dict.fromkeys(RESOURCES, 0)
        for key in self.admitted:
            u = self.units[key]
            if name in self.chain(u.quota):
                for r, v in u.request.items():
                    total[r] += v
        return total

    def waiting(self) -> list[RefUnit]:
        return [u for k, u in sorted(self.units.items()) if k not in self.admitted]

    def pending(self, name: str) -> dict[str, int]:
        total = dict.fromkeys(RESOURCES, 0)
        for u in self.waiting():
            if name in self.chain(u.quota):
                for r, v in u.request.items():
                    total[r] += v
        return total

    def under_max(self, name: str, extra: dict[str, int]) -> bool:
        used, limit = self.used(name), self.quotas[name].max
        if not limit:
            return not any(extra.values())  # an empty max refuses any request
        return all(used[r] + extra.get(r, 0) <= limit[r] for r in limit)

    def within_min(self, name: str, extra: dict[str, int]) -> bool:
        used, floor = self.used(name), self.quotas[name].min
        return all(used[r] + v <= floor.get(r, 0) for r, v in extra.items() if v)

    def siblings(self, name: str) -> list[str]:
        parent = self.quotas[name].parent
        return sorted(q for q, spec in self.quotas.items() if spec.parent == parent and q != name)

    def claim(self, name: str) -> dict[str, int]:
        """How much of the parent ``name``'s ``min`` claims: all of it when the quota does not
        lend, else as far as its usage plus waiting demand (capped at its ``max``), or what its own
        children's ``min`` claim of it, reaches."""
        spec, used, want = self.quotas[name], self.used(name), self.pending(name)
        kids = [q for q, s in sorted(self.quotas.items()) if s.parent == name]
        out: dict[str, int] = {}
        for r in RESOURCES:
            floor = spec.min.get(r, 0)
            if not spec.lends:
                out[r] = floor
                continue
            demand = used[r] + want[r]
            if r in spec.max:
                demand = min(demand, spec.max[r])
            below = sum(self.claim(k)[r] for k in kids)
            out[r] = min(floor, max(demand, below))
        return out

    def held_for(self, name: str) -> dict[str, int]:
        """What ``name``'s ``min`` still holds for it: its claim beyond what it uses."""
        used = self.used(name)
        return {r: max(0, v - used[r]) for r, v in self.claim(name).items()}

    def guaranteed_refusal(self, u: RefUnit) -> bool:
        """``u`` waits although it fits within ``min`` below the top and the parent has room."""
        chain = self.chain(u.quota)
        below_top = chain[:-1]
        return all(self.within_min(q, u.request) for q in below_top) and all(
            self.under_max(q, u.request) for q in chain
        )

    def idle_refusal(self, u: RefUnit) -> bool:
        """``u`` waits although it fits under every ``max`` and leaves the siblings' held ``min``."""
        chain = self.chain(u.quota)
        if not all(self.under_max(q, u.request) for q in chain):
            return False
        for level in chain[:-1]:
            parent = self.quotas[level].parent
            used, limit = self.used(parent), self.quotas[parent].max
            held = dict.fromkeys(RESOURCES, 0)
            for s in self.siblings(level):
                for r, v in self.held_for(s).items():
                    held[r] += v
            if any(used[r] + u.request.get(r, 0) + held[r] > limit[r] for r in limit):
                return False
        return True


# --- drawing trees and units ------------------------------------------------------------------------


def _limits(draw: st.DrawFn, *, low: int = 0, high: int = 8, optional: bool = True) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in RESOURCES:
        if optional and draw(st.integers(0, 5)) == 0:
            continue  # left out: unlimited in a max, nothing guaranteed in a min
        out[r] = draw(st.integers(low, high))
    return out


def _child(draw: st.DrawFn, name: str, parent: RefQuota, room: dict[str, int]) -> RefQuota:
    """A child of ``parent`` whose ``min`` fits in ``room`` (what the parent's ``min`` has left
    after the siblings drawn before it: the webhook's tree rule) and stays below its ``max``."""
    mx = _limits(draw, low=1)
    mn: dict[str, int] = {}
    for r in RESOURCES:
        cap = min(room.get(r, 0) if r in parent.min else 8, mx.get(r, 8))
        if cap > 0 and draw(st.integers(0, 3)) > 0:
            mn[r] = draw(st.integers(0, cap))
            room[r] = room.get(r, 0) - mn[r]
    weight = {r: draw(st.integers(1, 4)) for r in RESOURCES} if draw(st.integers(0, 3)) == 0 else None
    return RefQuota(name, parent.name, mn, mx, lends=draw(st.integers(0, 3)) > 0, weight=weight)


@st.composite
def scenarios(draw: st.DrawFn) -> Reference:
    top_max = _limits(draw, low=2, optional=False)
    top = RefQuota("p", "", dict(top_max), top_max)
    quotas = {"p": top}
    room = dict(top.min)
    deep = draw(st.booleans())
    for name in ("a", "b") if deep else ("a", "b", "c")[: draw(st.integers(2, 3))]:
        quotas[name] = _child(draw, name, top, room)
    leaves = sorted(q for q in quotas if q != "p")
    if deep:  # a third level: "a" takes no jobs itself and passes its share on to "a1"
        a = quotas["a"]
        quotas["a1"] = _child(draw, "a1", a, dict(a.min))
        leaves = ["a1", "b"]
    units: dict[str, RefUnit] = {}
    for i in range(draw(st.integers(1, 8))):
        memory = draw(st.integers(0, 4)) if draw(st.booleans()) else 0
        request = {"cpu": draw(st.integers(1, 4)), "memory": memory}
        units[f"u{i}"] = RefUnit(f"u{i}", draw(st.sampled_from(leaves)), request)
    return Reference(quotas, units)


def _world(ref: Reference) -> World:
    w = World(queues=())
    w.cache = Cache(quota_guarantees=True)
    for spec in ref.quotas.values():
        labels = {names.QUOTA_PARENT_LABEL: spec.parent} if spec.parent else {}
        if not spec.lends:
            labels[names.QUOTA_ALLOW_LENT_LABEL] = "false"
        annotations: dict[str, str] = {}
        if spec.weight is not None:
            annotations[names.QUOTA_SHARED_WEIGHT_ANNOTATION] = json.dumps(
                {r: f"{v}{SUFFIX[r]}" for r, v in spec.weight.items()}
            )
        quota = parsing.parse_quota(
            {
                "metadata": {
                    "name": spec.name,
                    "namespace": "default",
                    "labels": labels,
                    "annotations": annotations,
                },
                "spec": {
                    "min": {r: f"{v}{SUFFIX[r]}" for r, v in spec.min.items()},
                    "max": {r: f"{v}{SUFFIX[r]}" for r, v in spec.max.items()},
                },
            }
        )
        w.cache.put_quota(quota)
        w.cache.put_queue(queue(spec.name).build())
    for i, u in enumerate(ref.units.values()):
        requests = {r: f"{v}{SUFFIX[r]}" for r, v in u.request.items() if v}
        w.add(unit(u.name).quota(u.quota).created(float(i)).podset(u.name, 1, **requests))
    return w


# --- the property -----------------------------------------------------------------------------------


def _rounding_case() -> Reference:
    """Rounding ``a``'s share down to whole 2-cpu steps once cut it below its ``min`` of 5."""
    top = RefQuota("p", "", {"cpu": 10, "memory": 10}, {"cpu": 10, "memory": 10})
    quotas = {
        "p": top,
        "a": RefQuota("a", "p", {"cpu": 5}, {"cpu": 10, "memory": 10}),
        "b": RefQuota("b", "p", {"cpu": 5}, {"cpu": 10, "memory": 10}),
    }
    sizes = [("a", 2), ("a", 3), ("a", 4)] + [("b", 1)] * 5
    units = {f"u{i}": RefUnit(f"u{i}", q, {"cpu": cpu, "memory": 0}) for i, (q, cpu) in enumerate(sizes)}
    return Reference(quotas, units)


def _deep_case() -> Reference:
    """``a`` lends and asks little itself, but below it ``a2`` does not lend: ``a``'s claim on ``p``
    must cover ``a2``'s reserved ``min`` too, or ``a1``'s guaranteed units are squeezed out."""
    top = RefQuota("p", "", {"cpu": 10, "memory": 10}, {"cpu": 10, "memory": 10})
    quotas = {
        "p": top,
        "a": RefQuota("a", "p", {"cpu": 5}, {"cpu": 10, "memory": 10}),
        "b": RefQuota("b", "p", {"cpu": 5}, {"cpu": 10, "memory": 10}),
        "a1": RefQuota("a1", "a", {"cpu": 2}, {"cpu": 10, "memory": 10}),
        "a2": RefQuota("a2", "a", {"cpu": 3}, {"cpu": 10, "memory": 10}, lends=False),
    }
    sizes = [("a1", 1), ("a1", 1)] + [("b", 1)] * 6
    units = {f"u{i}": RefUnit(f"u{i}", q, {"cpu": cpu, "memory": 0}) for i, (q, cpu) in enumerate(sizes)}
    return Reference(quotas, units)


@settings(max_examples=400, deadline=None)
@example(_rounding_case())
@example(_deep_case())
@given(scenarios())
def test_guarantees_hold_exactly_and_no_capacity_idles_while_a_unit_would_fit(ref: Reference) -> None:
    w = _world(ref)
    quiet = 0
    for _ in range(12):
        got = admits(w.cycle())
        ref.admitted.update(got)
        for name in ref.quotas:
            assert ref.under_max(name, {}), f"{name} holds more than its max"
        late = [u.name for u in ref.waiting() if ref.guaranteed_refusal(u)]
        assert not late, f"{late} fit within min and the parent has room, yet wait"
        quiet = 0 if got else quiet + 1
        if quiet == 2:
            break
    idle = [u.name for u in ref.waiting() if ref.idle_refusal(u)]
    assert not idle, f"{idle} would fit beside every sibling's held min, yet capacity stays idle"
