"""What the apiserver adds to a pod at creation that its job's template does not say: LimitRange
default requests and RuntimeClass overhead (docs/compatibility.md#requests-the-apiserver-fills-in).

A unit is charged per pod from its job's template, but the pods are charged by the kube-scheduler
as the apiserver stored them, and two admission plugins add to them:

* **LimitRanger**: a container (or init container) that names a resource in neither its requests
  nor its limits gets the namespace's LimitRange ``defaultRequest`` for it (a stored LimitRange
  always has one where it has a ``default`` or ``min``: the apiserver defaults it). Without this a
  namespace user in a namespace with a LimitRange could leave requests out and be charged nothing
  for pods that each reserve the default: the queue would admit any number of them. With several
  LimitRanges the apiserver takes the first it lists, in no fixed order; we take the largest, so
  the charge is never less than what any of them gives;
* **RuntimeClass**: a pod naming a ``runtimeClassName`` without ``overhead`` gets the class's
  ``overhead.podFixed``, which the kube-scheduler adds to the pod's requests.

A unit holding an admission keeps what was filled in when it was admitted (``frozen``): its pods
were made with those values, so a LimitRange or RuntimeClass changed later must neither change
the charge under them nor look like the job changing size
(docs/compatibility.md#admitted-pod-size). Kueue adjusts its Workloads the same way
(``workload.AdjustResources``). What the template gained since, though, is filled in as the
apiserver would fill it now: a container (or init container) the admitted template did not name,
and the overhead of a ``runtimeClassName`` other than the admitted one. Their pods would be made
with those values, so the charge they bring shows as a resize instead of running uncharged.

Pure: the reconciler keeps the LimitRanges and RuntimeClasses and passes a :class:`PodDefaults`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from koord_queue.shared.api import quantities

Obj = dict[str, Any]

__all__ = ["PodDefaults", "apply", "limit_range_requests", "runtime_class_overhead"]


@dataclass(frozen=True, slots=True)
class PodDefaults:
    """The fill-ins of one namespace: container default requests (quantity text) and the pod
    overhead of each RuntimeClass by name."""

    requests: Mapping[str, str] = field(default_factory=dict)
    overheads: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.requests or self.overheads)


def _milli(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    try:
        return quantities.parse_milli(value)
    except quantities.QuantityError:
        return None


def limit_range_requests(limit_ranges: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """The default request per resource that LimitRanges give a container, the largest where
    several name it. ``defaultRequest`` as stored; an object written without the apiserver's
    defaulting falls back as it would (``default``, then ``min``, per resource). Unreadable values
    are skipped: the LimitRanger would refuse such an object anyway."""
    best: dict[str, tuple[int, str]] = {}
    for lr in limit_ranges:
        spec = lr.get("spec")
        items = spec.get("limits") if isinstance(spec, Mapping) else None
        for item in items if isinstance(items, list) else []:
            if not isinstance(item, Mapping) or item.get("type") != "Container":
                continue
            chosen: dict[str, object] = {}
            for key in ("min", "default", "defaultRequest"):  # later wins, as the defaulting
                found = item.get(key)
                if isinstance(found, Mapping):
                    chosen.update({str(r): v for r, v in found.items()})
            for resource, value in chosen.items():
                milli = _milli(value)
                if milli is not None and milli >= 0 and milli > best.get(resource, (-1, ""))[0]:
                    best[resource] = (milli, str(value))
    return {r: text for r, (_, text) in sorted(best.items())}


def runtime_class_overhead(runtime_class: Mapping[str, Any]) -> dict[str, str]:
    """A RuntimeClass's ``overhead.podFixed`` (empty when it has none)."""
    overhead = runtime_class.get("overhead")
    fixed = overhead.get("podFixed") if isinstance(overhead, Mapping) else None
    if not isinstance(fixed, Mapping):
        return {}
    return {str(r): str(v) for r, v in fixed.items() if _milli(v) is not None}


def _containers(spec: Mapping[str, Any]) -> Iterable[tuple[str, int, Obj]]:
    for field_name in ("initContainers", "containers"):
        listed = spec.get(field_name)
        for i, container in enumerate(listed if isinstance(listed, list) else []):
            if isinstance(container, dict):
                yield field_name, i, container


def _sticky_requests(frozen: Mapping[str, Any] | None) -> dict[tuple[str, object], Mapping[str, Any]] | None:
    """``(list, container name) -> requests`` of the admitted unit's template, an empty map for a
    container it names without readable requests; None when its spec cannot be read (then nothing
    is taken for new)."""
    spec = frozen.get("spec") if isinstance(frozen, Mapping) else None
    if not isinstance(spec, Mapping):
        return None
    out: dict[tuple[str, object], Mapping[str, Any]] = {}
    for field_name, _, container in _containers(spec):
        resources = container.get("resources")
        requests = resources.get("requests") if isinstance(resources, Mapping) else None
        name = container.get("name")
        if isinstance(name, str):
            out[(field_name, name)] = requests if isinstance(requests, Mapping) else {}
    return out


def apply(
    template: Mapping[str, Any], defaults: PodDefaults, *, frozen: Mapping[str, Any] | None = None
) -> Mapping[str, Any]:
    """``template`` (a pod template's scheduling view) with what the apiserver would fill in, or
    the very same object when nothing is (callers compare with ``is``). ``frozen`` is the same
    pod set's template on a unit that holds an admission: then only what it already carries is
    filled in, never the current defaults. Shapes it cannot read are left alone for the request
    parser to report."""
    spec = template.get("spec")
    if not isinstance(spec, Mapping):
        return template
    sticky = _sticky_requests(frozen) if frozen is not None else None
    out: Obj | None = None
    frozen_spec = frozen.get("spec") if isinstance(frozen, Mapping) else None

    def writable() -> Obj:
        nonlocal out
        if out is None:
            out = copy.deepcopy(dict(template))
        return out

    for field_name, i, container in _containers(spec):
        resources = container.get("resources")
        if resources is not None and not isinstance(resources, Mapping):
            continue
        requests = (resources or {}).get("requests") or {}
        limits = (resources or {}).get("limits") or {}
        if not isinstance(requests, Mapping) or not isinstance(limits, Mapping):
            continue
        raw_name = container.get("name")
        name = raw_name if isinstance(raw_name, str) else None  # a list or a map cannot be a key
        source: Mapping[str, Any]
        if frozen is None or (sticky is not None and (field_name, name) not in sticky):
            source = defaults.requests  # queued, or a container the admitted template did not name
        elif sticky is not None and isinstance(name, str):
            source = sticky[(field_name, name)]
        else:
            source = {}
        missing = {r: v for r, v in source.items() if r not in requests and r not in limits}
        if missing:
            target = writable()["spec"][field_name][i]
            if not isinstance(target.get("resources"), dict):  # absent or null
                target["resources"] = {}
            if not isinstance(target["resources"].get("requests"), dict):
                target["resources"]["requests"] = {}
            target["resources"]["requests"].update(missing)
    runtime_class = spec.get("runtimeClassName")
    if isinstance(runtime_class, str) and not spec.get("overhead"):
        if frozen is not None and not (
            isinstance(frozen_spec, Mapping) and frozen_spec.get("runtimeClassName") != runtime_class
        ):
            overhead = frozen_spec.get("overhead") if isinstance(frozen_spec, Mapping) else None
        else:  # queued, or a class other than the one admitted
            overhead = defaults.overheads.get(runtime_class)
        if isinstance(overhead, Mapping) and overhead:
            writable()["spec"]["overhead"] = dict(overhead)
    return out if out is not None else template
