"""Gangs: pod sets that only work with enough of their pods, for reclaim and partial admission
(docs/compatibility.md#gangs-and-partial-admission).

A distributed training job missing one worker is not slow, it is stopped. Two facts make a pod set
a gang:

* ``spec.podSet[].minCount`` (the job's own statement, as in Kueue): at least that many pods;
* the kind: the workers of the Kubeflow kinds (TF, PyTorch, MPI, Paddle, XGBoost, JAX) and every Ray
  worker group only work whole, so their floor is their ``count``.

**Reclaim** (:func:`reclaim_count`): a gang pod set is reclaimed whole or not at all. Only unbound
pods are ever deleted (docs/architecture.md#decision-5-gate-pods-reclaim-only-unbound-ones), so
"whole" means: when no pod of the unit is bound, every admitted replica of the set; otherwise only
what leaves at least the floor admitted. A half-bound gang therefore keeps its unbound members and
is never left with idle bound pods.

**Partial admission** (:func:`partial_grants`): opt-in by ``minCount``. When a unit's full remaining
demand does not fit, the largest size between ``minCount`` and ``count`` that fits without any
reclaim is admitted; the unit keeps waiting for the rest and grows as quota frees (pods beyond the
admission stay gated, so no replica field of the job is changed).

Pure: standard library and sibling modules only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from koord_queue.shared.api.model import Unit
from koord_queue.shared.api.predicates import expected_pod_sets
from koord_queue.shared.api.quantities import Resources
from koord_queue.shared.core.charges import grants_request

__all__ = ["WHOLE_WORKER_KINDS", "floor", "partial_grants", "reclaim_count", "smallest_request"]

#: Kinds whose worker pod sets only work whole (named ``worker``; Ray: every group but ``head``).
WHOLE_WORKER_KINDS: Final = frozenset({"TFJob", "PyTorchJob", "MPIJob", "PaddleJob", "XGBoostJob", "JAXJob"})
_RAY_KINDS: Final = frozenset({"RayJob", "RayCluster"})


def floor(unit: Unit, podset: str) -> int | None:
    """The fewest pods pod set ``podset`` of ``unit`` works with, or None when it is no gang."""
    for ps in expected_pod_sets(unit):
        if ps.name != podset:
            continue
        if ps.min_count is not None:
            return min(ps.min_count, ps.count)
        kind = unit.consumer_kind or ""
        if (kind in WHOLE_WORKER_KINDS and podset == "worker") or (kind in _RAY_KINDS and podset != "head"):
            return ps.count
        return None
    return None


def reclaim_count(replicas: int, running: int, gang_floor: int, *, unit_bound: bool) -> int:
    """How many admitted replicas of a gang pod set may be reclaimed: all of them when no pod of the
    unit is bound (the whole gang goes), else only unbound ones beyond the floor."""
    if not unit_bound:
        return max(replicas, 0)
    return max(0, min(replicas - running, replicas - gang_floor))


def smallest_request(unit: Unit) -> Resources | None:
    """The least the unit would accept now: its ``minCount`` pod sets at their floor (counting what
    is admitted), the others whole; None when no pod set has a ``minCount`` (the whole demand)."""
    sets = expected_pod_sets(unit)
    if all(ps.min_count is None for ps in sets):
        return None
    admitted = {adm.name: adm.replicas for adm in unit.admissions}
    total: dict[str, int] = {}
    for ps in sets:
        missing = ps.count - admitted.get(ps.name, 0)
        if missing <= 0:
            continue
        want = (
            missing
            if ps.min_count is None
            else min(missing, max(1, min(ps.min_count, ps.count) - admitted.get(ps.name, 0)))
        )
        for r, v in ps.per_pod.items():
            total[r] = total.get(r, 0) + v * want
    return {r: v for r, v in sorted(total.items()) if v}


def partial_grants(
    unit: Unit, missing: Mapping[str, int], fits: Callable[[Resources], bool]
) -> dict[str, int] | None:
    """The largest grants below ``missing`` that ``fits`` accepts, shrinking only pod sets with a
    ``minCount`` and never below it (counting what is already admitted); None when the unit has no
    such pod set or even the smallest size does not fit. ``fits`` must be monotone (a smaller
    request never fits less); a binary search asks it O(log count) times."""
    sets = {ps.name: ps for ps in expected_pod_sets(unit)}
    admitted = {adm.name: adm.replicas for adm in unit.admissions}
    lower: dict[str, int] = {}
    for name, want in missing.items():
        ps = sets.get(name)
        if ps is None or ps.min_count is None:
            lower[name] = want
            continue
        lower[name] = min(max(1, min(ps.min_count, ps.count) - admitted.get(name, 0)), want)
    slack = max((missing[n] - lower[n] for n in missing), default=0)
    if slack <= 0:
        return None

    def grants(cut: int) -> dict[str, int]:
        return {n: max(lower[n], missing[n] - cut) for n in missing}

    if not fits(grants_request(unit, grants(slack))):
        return None
    lo, hi = 1, slack  # the smallest cut that fits lies in [lo, hi]
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(grants_request(unit, grants(mid))):
            hi = mid
        else:
            lo = mid + 1
    return {n: k for n, k in grants(lo).items() if k > 0}
