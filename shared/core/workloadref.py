"""Native gang hand-off: gangs described to kube-scheduler's own gang scheduling
(docs/compatibility.md#native-gang-hand-off).

Off by default (``nativeGangHandoff`` in the component configuration). When on, and only when the
cluster serves the alpha Workload API (``scheduling.k8s.io/v1alpha1``, feature gates
``GenericWorkload`` and ``GangScheduling``), koord-queue hands the all-or-nothing placement of a
gang's pods to kube-scheduler:

* on CREATE the job webhook adds ``spec.workloadRef`` to the pod template of every gang pod set
  (:func:`stamp_ops`): ``name`` is the unit's name, ``podGroup`` is :func:`pod_group_name` of the pod
  set; the pods the job's controller creates from the template carry it (the field is immutable on
  a pod, so it can only be set through the template);
* before it ungates the pods of an admitted unit, the reconciler creates the ``Workload`` of that
  name (:func:`workload_for`), owned by the job, with one gang pod group per gang pod set whose
  ``minCount`` is the gang's floor (``shared.core.gangs.floor``). kube-scheduler then keeps the pods
  out of its queue until ``minCount`` of them exist (PreEnqueue) and binds none of them until
  ``minCount`` have a node reserved (Permit, with a timeout), so a gang that does not fit binds no
  pod at all instead of a useless part of it.

Which pod sets are gangs is decided once, by ``shared.core.gangs.floor`` (:func:`gang_pod_groups`):
the webhook reads the job's pod sets, the reconciler its unit's, which are built from the same
adapter answer. A job with more gang pod sets than a Workload may hold (8), or whose pod set names
map to the same pod group name, is not handed off at all (neither stamped nor described).

Whether the API is served is found by the reconciler (discovery, :func:`served_in`) and published in
the ConfigMap :data:`STATE_CONFIGMAP` (key :data:`STATE_KEY`), which the webhook Deployment mounts;
the webhook stamps only while that file names :data:`WORKLOAD_API_VERSION`
(:class:`ServedProbe`). The webhook makes no API call of its own
(docs/architecture.md#decision-6-a-stateless-scoped-webhook).

Pure: standard library and sibling modules only.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol

from koord_queue.shared.api import names
from koord_queue.shared.api.model import PodSet, Unit
from koord_queue.shared.core import gangs
from koord_queue.shared.jobs import base, patches
from koord_queue.shared.jobs.base import Job, JobAdapter, JobSpecError, JsonPatchOp
from koord_queue.shared.jobs.patches import escape

__all__ = [
    "FEATURE_GATES",
    "MAX_POD_GROUPS",
    "STATE_CONFIGMAP",
    "STATE_KEY",
    "WORKLOAD_API_VERSION",
    "ServedProbe",
    "gang_pod_groups",
    "pod_group_name",
    "refusal",
    "served_in",
    "stamp_ops",
    "unit_of_job",
    "workload_for",
]

WORKLOAD_GROUP: Final = "scheduling.k8s.io"
WORKLOAD_VERSION: Final = "v1alpha1"
WORKLOAD_API_VERSION: Final = f"{WORKLOAD_GROUP}/{WORKLOAD_VERSION}"
WORKLOAD_PLURAL: Final = "workloads"
#: The feature gates the cluster needs (apiserver, scheduler; GangScheduling requires GenericWorkload).
FEATURE_GATES: Final = ("GenericWorkload", "GangScheduling")
#: ``WorkloadMaxPodGroups`` of the v1alpha1 API.
MAX_POD_GROUPS: Final = 8
#: The ConfigMap (in ``koord-queue``) the reconciler publishes the detection in, and its key.
STATE_CONFIGMAP: Final = "koord-queue-native-gangs"
STATE_KEY: Final = "workloadAPI"
_LABEL_MAX: Final = 63
_NOT_LABEL: Final = re.compile(r"[^a-z0-9-]+")
_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class ServedProbe(Protocol):
    """Tells the webhook whether the reconciler found the Workload API (``webhook.nativegangs``)."""

    def served(self) -> bool: ...


def refusal(found: str | None) -> str:
    """The error logged when the switch is on but the cluster cannot take the hand-off."""
    what = f"serves {found} instead" if found else "does not serve it"
    return (
        f"nativeGangHandoff is on but the cluster {what}: it needs the {WORKLOAD_API_VERSION} Workload "
        f"API (kube-apiserver --runtime-config={WORKLOAD_API_VERSION}=true) and the feature gates "
        f"{' and '.join(FEATURE_GATES)} on kube-apiserver and kube-scheduler; gangs are NOT handed to "
        "kube-scheduler (no workloadRef is stamped, no Workload is created) until it is restarted "
        "on such a cluster"
    )


def served_in(resources: Mapping[str, Any] | None) -> bool:
    """``resources`` (the APIResourceList of ``/apis/scheduling.k8s.io/v1alpha1``, or None when
    absent) lists ``workloads``."""
    if resources is None:
        return False
    listed = resources.get("resources")
    return isinstance(listed, list) and any(
        isinstance(r, Mapping) and r.get("name") == WORKLOAD_PLURAL for r in listed
    )


def pod_group_name(pod_set: str) -> str:
    """The pod group of ``pod_set``: a DNS label (as the Workload API requires), the pod set's own
    name when it already is one, else a lower-cased, cleaned form with a hash of the name."""
    if len(pod_set) <= _LABEL_MAX and _LABEL.fullmatch(pod_set):
        return pod_set
    label = _NOT_LABEL.sub("-", pod_set.lower())[: _LABEL_MAX - 9].strip("-")
    digest = hashlib.sha256(pod_set.encode()).hexdigest()[:8]
    return f"{label}-{digest}" if label else digest


def gang_pod_groups(unit: Unit) -> dict[str, tuple[str, int]] | None:
    """Pod set -> ``(pod group, minCount)`` of every gang pod set of ``unit``; None when the unit
    cannot be handed off (more gang pod sets than a Workload holds, or two mapping to one group).
    Empty when it has no gang. ``minCount`` is the floor, at least 1."""
    found: dict[str, tuple[str, int]] = {}
    for ps in unit.pod_sets:
        least = gangs.floor(unit, ps.name)
        if least is not None:
            found[ps.name] = (pod_group_name(ps.name), max(1, least))
    if len(found) > MAX_POD_GROUPS or len({group for group, _ in found.values()}) != len(found):
        return None
    return found


def unit_of_job(adapter: JobAdapter, job: Job) -> Unit | None:
    """What the unit of ``job`` will say about its pod sets (None when they cannot be read)."""
    try:
        pod_sets = adapter.pod_sets(job)
    except JobSpecError:
        return None
    name, namespace = adapter.queue_unit_name(job), base.namespace_of(job)
    return Unit(
        key=f"{namespace}/{name}",
        namespace=namespace,
        name=name,
        consumer_kind=adapter.kind,
        pod_sets=tuple(PodSet(ps.name, ps.count, ps.min_count, ps.per_pod) for ps in pod_sets),
    )


def stamp_ops(
    adapter: JobAdapter, job: Job, ops: Sequence[JsonPatchOp], probe: ServedProbe | None
) -> list[JsonPatchOp]:
    """The operations adding ``spec.workloadRef`` to the gang pod templates of ``job``, to follow
    ``ops`` (its suspend patch); empty when the hand-off is off (``probe`` None), the API is not
    served, the unit's name is not known yet (``generateName``) or the job has no gang.

    A template is found through what the suspend patch leaves on it (the admission gate and the
    pod-set annotation), so every kind with pod templates is covered; a template that already has
    a ``workloadRef`` keeps it (its owner hands its pods to a Workload of their own).
    """
    if probe is None or not probe.served():
        return []
    unit_name = adapter.queue_unit_name(job)
    unit = unit_of_job(adapter, job) if unit_name else None
    groups = gang_pod_groups(unit) if unit is not None else None
    if not groups:
        return []
    patched = patches.applied(job, ops)
    stamps: list[JsonPatchOp] = []
    for pointer, pod_set in _gated_templates(patched, ()):
        wanted = groups.get(pod_set)
        if wanted is None or base.dig(_at(patched, pointer), "spec", "workloadRef") is not None:
            continue
        path = "".join(f"/{escape(seg)}" for seg in pointer) + "/spec/workloadRef"
        stamps.append({"op": "add", "path": path, "value": {"name": unit_name, "podGroup": wanted[0]}})
    return stamps


def workload_for(
    unit_name: str, namespace: str, job: Job, adapter: JobAdapter, groups: Mapping[str, tuple[str, int]]
) -> dict[str, Any]:
    """The Workload of a unit: named after it, owned by its job (garbage-collected with it),
    one gang pod group per gang pod set, in pod set order."""
    meta = job.get("metadata") or {}
    owner = {
        "apiVersion": adapter.api_version,
        "kind": adapter.kind,
        "name": base.text(meta.get("name")),
        "uid": base.text(meta.get("uid")),
    }
    group_api = adapter.api_version.rpartition("/")[0]
    controller: dict[str, str] = {"kind": adapter.kind, "name": owner["name"]}
    if group_api:
        controller = {"apiGroup": group_api, **controller}
    return {
        "apiVersion": WORKLOAD_API_VERSION,
        "kind": "Workload",
        "metadata": {
            "name": unit_name,
            "namespace": namespace,
            "annotations": {names.RELATED_QUEUEUNIT_ANNOTATION: f"{namespace}/{unit_name}"},
            "ownerReferences": [owner],
        },
        "spec": {
            "controllerRef": controller,
            "podGroups": [
                {"name": group, "policy": {"gang": {"minCount": least}}} for group, least in groups.values()
            ],
        },
    }


# --- finding the gated templates ------------------------------------------------------------------

_MAX_DEPTH: Final = 12


def _at(doc: Any, tokens: Sequence[str | int]) -> Any:
    for token in tokens:
        if isinstance(doc, list):
            index = int(token) if str(token).isdigit() else -1
            doc = doc[index] if 0 <= index < len(doc) else None
        elif isinstance(doc, dict):
            doc = doc.get(str(token))
        else:
            return None
    return doc


def _gated_templates(node: Any, at: tuple[str | int, ...]) -> list[tuple[tuple[str | int, ...], str]]:
    """``(path, pod set)`` of every pod template below ``node`` that carries the admission gate and
    the pod-set annotation (what ``AdapterBase.gate_template`` leaves on a template)."""
    if len(at) > _MAX_DEPTH:
        return []
    found: list[tuple[tuple[str | int, ...], str]] = []
    if isinstance(node, dict):
        gates = base.dig(node, "spec", "schedulingGates")
        pod_set = base.annotations_of(node).get(names.RELATED_PODSET_ANNOTATION)
        if (
            pod_set
            and isinstance(gates, list)
            and any(base.dig(g, "name") == names.ADMISSION_GATE for g in gates)
        ):
            return [(at, pod_set)]
        for key, child in node.items():
            if isinstance(child, dict | list) and key not in ("metadata", "status"):
                found += _gated_templates(child, (*at, key))
    elif isinstance(node, list):
        for i, child in enumerate(node):
            found += _gated_templates(child, (*at, i))
    return found
