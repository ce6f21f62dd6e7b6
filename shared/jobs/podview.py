"""What the job extensions read of a pod (:class:`PodView`), and how it is read from the stored pod.

Its own module, below both the pod plan (``shared.jobs.podplan``) and the pod budget of a
reservation (``shared.jobs.podbudget``), which the plan calls: each names the view without the
other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from koord_queue.shared.api import names, podtemplates, quantities
from koord_queue.shared.jobs.base import Job, dig, text


@dataclass(frozen=True, slots=True)
class PodView:
    """What the extensions need of a pod."""

    namespace: str
    name: str
    uid: str
    pod_set: str
    created: str
    bound: bool
    gated: bool
    terminal: bool
    deleting: bool
    resource_version: str = ""
    #: The pod's effective requests as stored (``podtemplates.pod_requests``, sorted pairs), or
    #: None when they cannot be read.
    requests: tuple[tuple[str, int], ...] | None = ()

    @property
    def live(self) -> bool:
        """The pod holds (or may take) what its pod set was admitted for: not finished, and not
        being deleted unless it is bound. A bound pod being deleted runs on for its grace period,
        so it counts until it is gone; an unbound one is never scheduled again
        (docs/compatibility.md#pod-gating)."""
        return not self.terminal and (self.bound or not self.deleting)


def pod_view(pod: Job, pod_set: str) -> PodView:
    gates = dig(pod, "spec", "schedulingGates")
    gated = isinstance(gates, list) and any(dig(g, "name") == names.ADMISSION_GATE for g in gates)
    return PodView(
        namespace=text(dig(pod, "metadata", "namespace")),
        name=text(dig(pod, "metadata", "name")),
        uid=text(dig(pod, "metadata", "uid")),
        pod_set=pod_set,
        created=text(dig(pod, "metadata", "creationTimestamp")),
        bound=bool(dig(pod, "spec", "nodeName")),
        gated=gated,
        terminal=dig(pod, "status", "phase") in ("Succeeded", "Failed"),
        deleting=dig(pod, "metadata", "deletionTimestamp") is not None,
        resource_version=text(dig(pod, "metadata", "resourceVersion")),
        requests=_requests_of(dig(pod, "spec")),
    )


def _requests_of(spec: object) -> tuple[tuple[str, int], ...] | None:
    """A pod's effective requests by the one rule the quota uses (``podtemplates.pod_requests``)."""
    try:
        return tuple(sorted(podtemplates.pod_requests(spec if isinstance(spec, Mapping) else {}).items()))
    except quantities.QuantityError:
        return None
