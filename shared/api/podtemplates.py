"""Per-pod resource requests of a pod spec, the unit every quota decision is made of.

A QueueUnit pod set says "``count`` pods like this template"; quota is charged per pod, so the
template must be reduced to one resource list once, when the unit is parsed (``shared.api.parsing``). The
rules follow Kubernetes' ``resourcehelper.PodRequests`` so that what we reserve is what the
kube-scheduler will later account for the same pods:

* each container asks for ``requests[r]``, falling back to ``limits[r]`` per resource (the API
  server defaults requests from limits; upstream Koord-Queue copies limits into requests when it
  builds pod sets, docs/compatibility.md#queueunit-construction);
* regular containers are summed;
* init containers run one at a time before them, so the pod needs the maximum of that sum and each
  init container; restartable init containers (sidecars, ``restartPolicy: Always``) keep running,
  so they are added to the sum and to every later init container;
* ``overhead`` (RuntimeClass) is added last.

Pure: standard library and ``shared.api.quantities`` only. Bad quantities raise
:class:`~shared.api.quantities.QuantityError` naming the field path; ``shared.api.parsing`` turns that into a
recorded problem instead of letting one bad object stop the reconcile loop.
"""

from __future__ import annotations

from collections.abc import Mapping

from shared.api import quantities
from shared.api.quantities import QuantityError, Resources

__all__ = ["container_requests", "pod_requests", "scheduling_template"]


def _mapping(value: object, path: str) -> Mapping[str, object]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise QuantityError(f"{path}: expected an object, got {type(value).__name__}")
    return value


def container_requests(container: Mapping[str, object], *, path: str = "container") -> Resources:
    """One container's effective requests: ``requests[r]`` else ``limits[r]``, per resource."""
    resources = _mapping(container.get("resources"), f"{path}.resources")
    limits = quantities.parse_resource_list(
        _mapping(resources.get("limits"), f"{path}.resources.limits"), path=f"{path}.resources.limits"
    )
    requests = quantities.parse_resource_list(
        _mapping(resources.get("requests"), f"{path}.resources.requests"),
        path=f"{path}.resources.requests",
    )
    merged = dict(limits)
    merged.update(requests)
    for name in sorted(merged):
        if merged[name] < 0:
            raise QuantityError(f"{path}.resources.requests[{name}]: must be greater than or equal to 0")
    return {name: merged[name] for name in sorted(merged)}


def _containers(spec: Mapping[str, object], field: str, path: str) -> list[Mapping[str, object]]:
    raw = spec.get(field)
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise QuantityError(f"{path}.{field}: expected a list, got {type(raw).__name__}")
    out: list[Mapping[str, object]] = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping):
            raise QuantityError(f"{path}.{field}[{i}]: expected an object, got {type(item).__name__}")
        out.append(item)
    return out


def _max(a: Mapping[str, int], b: Mapping[str, int]) -> Resources:
    return {name: max(a.get(name, 0), b.get(name, 0)) for name in sorted(a.keys() | b.keys())}


def pod_requests(spec: Mapping[str, object] | None, *, path: str = "spec") -> Resources:
    """Return the resources one pod of ``spec`` needs, in milli-units, keys sorted, zeros dropped.

    Raises :class:`QuantityError` (with the field path) on a malformed quantity or structure.
    """
    if spec is None:
        return {}
    if not isinstance(spec, Mapping):
        raise QuantityError(f"{path}: expected an object, got {type(spec).__name__}")
    total: Resources = {}
    for i, container in enumerate(_containers(spec, "containers", path)):
        total = quantities.add(total, container_requests(container, path=f"{path}.containers[{i}]"))
    init_peak: Resources = {}
    sidecars: Resources = {}
    for i, container in enumerate(_containers(spec, "initContainers", path)):
        own = container_requests(container, path=f"{path}.initContainers[{i}]")
        if container.get("restartPolicy") == "Always":
            total = quantities.add(total, own)
            sidecars = quantities.add(sidecars, own)
            during = sidecars
        else:
            during = quantities.add(own, sidecars)
        init_peak = _max(init_peak, during)
    result = _max(total, init_peak)
    overhead = _mapping(spec.get("overhead"), f"{path}.overhead")
    if overhead:
        result = quantities.add(result, quantities.parse_resource_list(overhead, path=f"{path}.overhead"))
    return {name: value for name, value in result.items() if value != 0}


#: Pod-spec fields that decide where and whether a pod can be placed: what a QueueUnit's pod-set
#: template keeps of the job's template. Everything else (images, commands, env, volumes, probes)
#: only inflates the unit: a copied template was 3.9 KB of a unit's JSON, and the apiserver's cost of
#: every later status write grows with the whole object (decode, schema, managedFields, encode).
SCHEDULING_FIELDS = (
    "affinity",
    "nodeName",
    "nodeSelector",
    "overhead",
    "priority",
    "priorityClassName",
    "resourceClaims",
    "runtimeClassName",
    "schedulerName",
    "schedulingGates",
    "tolerations",
    "topologySpreadConstraints",
)
#: Container fields the per-pod request rule reads (``restartPolicy`` marks sidecars).
CONTAINER_FIELDS = ("name", "resources", "restartPolicy")


def scheduling_template(
    template: Mapping[str, object], *, metadata: tuple[str, ...] = ("labels",)
) -> dict[str, object]:
    """The part of a pod template that quota and placement decisions read.

    Containers keep their name and resources (and ``restartPolicy`` for init containers), so
    :func:`pod_requests` gives the same answer on the result as on the original; of the metadata
    the maps named in ``metadata`` stay (labels, for selectors). Values that are not of the
    expected shape are kept as they are, so a bad template still fails where the whole one would.
    """
    out: dict[str, object] = {}
    meta = template.get("metadata")
    if isinstance(meta, Mapping):
        kept = {k: dict(meta[k]) for k in metadata if isinstance(meta.get(k), Mapping) and meta[k]}
        if kept:
            out["metadata"] = kept
    spec = template.get("spec")
    if not isinstance(spec, Mapping):
        if spec is not None:
            out["spec"] = spec
        return out
    slim: dict[str, object] = {}
    for field in ("initContainers", "containers"):
        containers = spec.get(field)
        if isinstance(containers, list):
            slim[field] = [
                {k: c[k] for k in CONTAINER_FIELDS if k in c} if isinstance(c, Mapping) else c
                for c in containers
            ]
        elif containers is not None:
            slim[field] = containers
    for field in SCHEDULING_FIELDS:
        if field in spec:
            slim[field] = spec[field]
    out["spec"] = slim
    return out
