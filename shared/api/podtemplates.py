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
* pod-level resources (``spec.resources``, the ``PodLevelResources`` feature, on by default since
  Kubernetes 1.34): a pod-level request of cpu, memory or a ``hugepages-*`` resource replaces what
  the containers add up to (the API requires it to be at least that much). A pod-level limit
  without a request stands for the request the apiserver defaults from it: the containers' sum
  where they ask for that resource (cpu and memory only), else the limit;
* ``overhead`` (RuntimeClass) is added last.

Ignoring the pod level would charge the containers' sum while the kube-scheduler reserves the
pod-level request: a namespace user could then run pods far larger than their quota charge.

Pure: standard library and ``shared.api.quantities`` only. Bad quantities raise
:class:`~shared.api.quantities.QuantityError` naming the field path; ``shared.api.parsing`` turns that into a
recorded problem instead of letting one bad object stop the reconcile loop.
"""

from __future__ import annotations

from collections.abc import Mapping

from koord_queue.shared.api import quantities
from koord_queue.shared.api.quantities import QuantityError, Resources

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


#: Answers of :func:`pod_requests` by what it reads of a spec (see :func:`_requests_key`). The same
#: template is reduced about a dozen times in a job's life (its unit built and kept in step, the
#: unit parsed at every event, the pods planned), always with the same answer; an entry is a few
#: hundred bytes, and the table is emptied when full rather than kept in order.
_REQUESTS_SEEN: dict[tuple[object, ...], Resources] = {}
_REQUESTS_SEEN_MAX = 1024


def _requests_key(spec: Mapping[str, object]) -> tuple[object, ...] | None:
    """Everything :func:`pod_requests` reads of ``spec``, as text: the containers' ``resources``,
    the init containers' ``restartPolicy``, the pod-level ``resources`` and ``overhead``. None for
    a spec whose container lists are not lists of objects (left to the full check, which names the
    problem)."""
    parts: list[object] = []
    for field in ("containers", "initContainers"):
        raw = spec.get(field)
        if raw is None:
            parts.append(None)
            continue
        if not isinstance(raw, list) or not all(isinstance(c, Mapping) for c in raw):
            return None
        parts.append(tuple(repr((c.get("resources"), c.get("restartPolicy"))) for c in raw))
    return (*parts, repr(spec.get("resources")), repr(spec.get("overhead")))


def pod_requests(spec: Mapping[str, object] | None, *, path: str = "spec") -> Resources:
    """Return the resources one pod of ``spec`` needs, in milli-units, keys sorted, zeros dropped.

    Raises :class:`QuantityError` (with the field path) on a malformed quantity or structure.
    Answers are remembered by what they depend on (not the path, which only names errors; errors
    are never remembered), and each caller gets its own copy.
    """
    if not isinstance(spec, Mapping):
        return _pod_requests(spec, path)
    key = _requests_key(spec)
    known = _REQUESTS_SEEN.get(key) if key is not None else None
    if known is None:
        known = _pod_requests(spec, path)
        if key is not None:
            if len(_REQUESTS_SEEN) >= _REQUESTS_SEEN_MAX:
                _REQUESTS_SEEN.clear()
            _REQUESTS_SEEN[key] = known
    return dict(known)


def _pod_requests(spec: Mapping[str, object] | None, path: str) -> Resources:
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
    result.update(_pod_level_requests(spec, result, path))
    overhead = _mapping(spec.get("overhead"), f"{path}.overhead")
    if overhead:
        result = quantities.add(result, quantities.parse_resource_list(overhead, path=f"{path}.overhead"))
    return {name: value for name, value in result.items() if value != 0}


#: Resources a pod-level request may name (``resourcehelper.IsSupportedPodLevelResource``):
#: these, and every ``hugepages-<size>``.
_POD_LEVEL_RESOURCES = frozenset({"cpu", "memory"})
_HUGEPAGES_PREFIX = "hugepages-"


def _pod_level(name: str) -> bool:
    return name in _POD_LEVEL_RESOURCES or name.startswith(_HUGEPAGES_PREFIX)


def _pod_level_requests(spec: Mapping[str, object], containers: Mapping[str, int], path: str) -> Resources:
    """What the pod level asks for, per resource it names (see the module docstring): its request,
    else the request the apiserver defaults from its limit (``SetDefaults_Pod``'s
    ``defaultPodRequests``). Resources the pod level may not name are left to the containers."""
    where = f"{path}.resources"
    resources = _mapping(spec.get("resources"), where)
    if not resources:
        return {}
    requests = quantities.parse_resource_list(
        _mapping(resources.get("requests"), f"{where}.requests"), path=f"{where}.requests"
    )
    limits = quantities.parse_resource_list(
        _mapping(resources.get("limits"), f"{where}.limits"), path=f"{where}.limits"
    )
    out: dict[str, int] = {}
    for name, value in limits.items():
        if not _pod_level(name) or name in requests:
            continue
        overcommitted = not name.startswith(_HUGEPAGES_PREFIX)
        out[name] = containers[name] if overcommitted and name in containers else value
    out.update((name, value) for name, value in requests.items() if _pod_level(name))
    for name, value in out.items():
        if value < 0:
            raise QuantityError(f"{where}.requests[{name}]: must be greater than or equal to 0")
    return dict(sorted(out.items()))


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
    "resources",
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
