"""Releasing the pods of a kind that declares a reservation instead of pods (pure).

A Workflow is admitted for ``koord-queue/min-resources``: one pod set of count 1 whose per-pod
size is that reservation (``shared.jobs.workflow``). Its pods are created step by step, any number
and size of them, so "release at most ``replicas`` pods that each fit the per-pod size" (what
``shared.jobs.podplan.plan_pods`` does for every other kind) would both let two small steps wait
for each other needlessly and say nothing about their sum. Here the admission is a budget instead
(docs/compatibility.md#argo-workflow):

* the reservation is ``replicas`` times the admitted per-pod size, per resource; a resource it does
  not name is reserved at zero;
* what is in use is the summed requests (``shared.api.podtemplates.pod_requests``, the quota's own
  rule) of the pod set's live pods that are bound or out of the gate: a bound pod being deleted still
  runs, so it counts until it is gone (``PodView.live``), a finished one does not;
* a gated pod is released, oldest first, only when in use plus its requests fit the reservation for
  every resource it asks for. One that does not waits, and so does every younger one (first come,
  first served: a large step is never starved by small ones that keep fitting); one larger than the
  whole reservation can never run and is passed over with a reason that says so;
* released pods that are unbound and past the reservation are deleted like any pod released beyond
  its admission, and bound pods past it are reported, never charged
  (docs/architecture.md#trust-boundaries).

So the sum of what runs never exceeds what the unit is charged: steps larger in sum than the
reservation run one after another within it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from koord_queue.shared.api import quantities
from koord_queue.shared.jobs.podview import PodView


@dataclass
class Release:
    """What to do with one pod set's pods under a reservation.

    ``ungate``: released now. ``waiting``: gated until the pods in use leave room (a Normal event
    says why). ``never``: gated for good, larger than the whole reservation or unreadable (a
    Warning says why). ``unadmitted``: released, unbound pods past the reservation, deleted.
    ``beyond``: bound pods past the reservation, reported.
    """

    ungate: list[PodView] = field(default_factory=list)
    waiting: list[tuple[PodView, str]] = field(default_factory=list)
    never: list[tuple[PodView, str]] = field(default_factory=list)
    unadmitted: list[PodView] = field(default_factory=list)
    beyond: list[PodView] = field(default_factory=list)


def reservation(per_pod: Mapping[str, int] | None, replicas: int) -> dict[str, int] | None:
    """What the admission holds: ``replicas`` times the per-pod size (None when unreadable)."""
    if per_pod is None:
        return None
    return {name: value * max(0, replicas) for name, value in per_pod.items()}


def fits(in_use: Mapping[str, int], requests: Sequence[tuple[str, int]], limit: Mapping[str, int]) -> bool:
    """Whether ``requests`` added to ``in_use`` stay within ``limit`` for every resource asked."""
    return all(in_use.get(name, 0) + value <= limit.get(name, 0) for name, value in requests if value > 0)


def _add(in_use: dict[str, int], requests: Sequence[tuple[str, int]]) -> None:
    for name, value in requests:
        in_use[name] = in_use.get(name, 0) + value


def _text(values: Mapping[str, int] | Sequence[tuple[str, int]]) -> str:
    pairs = sorted(values.items()) if isinstance(values, Mapping) else list(values)
    shown = [f"{name} {quantities.format_milli(value, resource=name)}" for name, value in pairs if value > 0]
    return ", ".join(shown) or "nothing"


def _order(pods: Sequence[PodView]) -> list[PodView]:
    return sorted(pods, key=lambda p: (p.created, p.name))


def release(
    live: Sequence[PodView], per_pod: Mapping[str, int] | None, replicas: int, *, releasing: bool
) -> Release:
    """Decide one pod set's pods against its reservation (module docstring).

    ``live`` are the pod set's live pods (``PodView.live``), ``per_pod`` the admitted per-pod
    size (None when it cannot be read), ``replicas`` the admitted replicas, ``releasing`` whether
    the unit is in a phase that releases pods (``podplan.ADMITTED_PHASES``); when it is not,
    nothing is released and every released, unbound pod is past the admission.
    """
    out = Release()
    limit = reservation(per_pod, replicas) if releasing else {}
    in_use: dict[str, int] = {}
    for pod in _order([p for p in live if p.bound]):
        requests = pod.requests or ()
        if pod.requests is None or limit is None or not fits(in_use, requests, limit):
            out.beyond.append(pod)
        _add(in_use, requests)
    for pod in _order([p for p in live if not p.bound and not p.gated]):
        requests = pod.requests or ()
        if not releasing or pod.requests is None or limit is None or not fits(in_use, requests, limit):
            out.unadmitted.append(pod)
            continue
        _add(in_use, requests)
    out.beyond.reverse()  # newest first, as ``podplan`` reports them
    out.unadmitted.reverse()
    if not releasing:
        return out
    blocked: PodView | None = None
    for pod in _order([p for p in live if not p.bound and p.gated]):
        if pod.requests is None:
            out.never.append((pod, "its resource requests cannot be read"))
        elif limit is None:
            out.never.append((pod, f"the admitted size of pod set {pod.pod_set} cannot be read"))
        elif not fits({}, pod.requests, limit):
            why = (
                f"it asks for {_text(pod.requests)}, more than the whole reservation of its job "
                f"({_text(limit)}), so it can never run; re-create the job with a larger "
                "koord-queue/min-resources"
            )
            out.never.append((pod, why))
        elif blocked is not None:
            out.waiting.append((pod, f"it waits behind the older pod {blocked.name}"))
        elif fits(in_use, pod.requests, limit):
            out.ungate.append(pod)
            _add(in_use, pod.requests)
        else:
            why = (
                f"it asks for {_text(pod.requests)} and the job's running pods use {_text(in_use)} "
                f"of its reservation ({_text(limit)}); it is released when they leave room"
            )
            out.waiting.append((pod, why))
            blocked = pod
    return out


def reclaimable(live: Sequence[PodView], replicas: int, wanted: int) -> int:
    """Replicas a reclaim of ``wanted`` takes back: all it asks while no pod of the pod set is
    bound or released, none otherwise. No pod is deleted for it: a released pod may be about to
    run, and Argo fails a step whose pod is deleted; gated pods hold nothing and wait for the
    next admission."""
    if any(p.bound or not p.gated for p in live):
        return 0
    return max(0, min(wanted, replicas))
