"""The observer's own reading of what etcd stores: Kubernetes quantities, a pod's request, and the
views of QueueUnits, ElasticQuotas, Pods and Jobs (with the fields read from the protobuf-stored
kinds), all pure.

Written again here rather than taken from ``shared.api`` on purpose: :mod:`chaos.observer` checks
the product with code that shares none of its parsing, so a bug there cannot hide itself (the
module docstring of :mod:`chaos.observer` says why). A module of its own so that the observer and
:mod:`chaos.guarantee_watch` both build on the views without importing each other.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import ROUND_UP, Context, Decimal, InvalidOperation, localcontext
from typing import Any, Final

from chaos import k8sproto
from koord_queue.shared.api import names

TERMINAL = frozenset({"Succeed", "Failed"})
V1_DEQUEUED = frozenset({"Dequeued", "Reserved", "Running", "SchedReady", "SchedSucceed"})
DEFAULT_POD_SET = names.DEFAULT_REQUIREMENT_PODSET

# --- quantities (our own parser, deliberately not shared.api.quantities) ------------------------------

_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<exp>[eE][+-]?[0-9]+)|(?P<suffix>[KMGTPE]i|[numkMGTPE]))?"
)
_SUFFIX = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    **{s: Decimal(2) ** (10 * (i + 1)) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
}


def milli(value: object) -> int | None:
    """A Kubernetes quantity in milli-units, rounded away from zero; None when unreadable."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value * 1000
    text = repr(value) if isinstance(value, float) else value
    if not isinstance(text, str):
        return None
    match = _QUANTITY.fullmatch(text)
    if match is None:
        return None
    with localcontext(Context(prec=2000)):
        try:
            number = Decimal(match["number"])
            if match["exp"]:
                exponent = int(match["exp"][1:])
                if abs(exponent) > 1000:
                    return None
                number = number.scaleb(exponent)
            else:
                number *= _SUFFIX[match["suffix"] or ""]
            result = int((number * 1000).to_integral_value(rounding=ROUND_UP))
        except (InvalidOperation, ValueError, OverflowError):
            return None
    return -result if match["sign"] == "-" else result


def resource_list(raw: object) -> tuple[dict[str, int], bool]:
    """``{name: milli}`` and whether every entry was readable."""
    if not isinstance(raw, Mapping):
        return {}, raw is None
    out: dict[str, int] = {}
    ok = True
    for name, value in raw.items():
        parsed = milli(value)
        if parsed is None or not isinstance(name, str):
            ok = False
            continue
        out[name] = parsed
    return out, ok


def add_resources(a: Mapping[str, int], b: Mapping[str, int], sign: int = 1) -> dict[str, int]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + sign * v
    return out


def pod_request(spec: object) -> tuple[dict[str, int], bool]:
    """What one pod asks the scheduler for: containers (+ sidecars) summed, each init container
    next to the sidecars started before it, the maximum of both, plus overhead."""
    if not isinstance(spec, Mapping):
        return {}, spec is None
    ok = True

    def requests(container: object) -> dict[str, int]:
        nonlocal ok
        resources = container.get("resources") if isinstance(container, Mapping) else None
        if not isinstance(resources, Mapping):
            return {}
        req, ok_req = resource_list(resources.get("requests"))
        lim, ok_lim = resource_list(resources.get("limits"))
        ok = ok and ok_req and ok_lim
        return {**lim, **req}

    steady: dict[str, int] = {}
    for container in spec.get("containers") or []:
        steady = add_resources(steady, requests(container))
    sidecars: dict[str, int] = {}
    peak: dict[str, int] = {}
    for container in spec.get("initContainers") or []:
        req = requests(container)
        if isinstance(container, Mapping) and container.get("restartPolicy") == "Always":
            sidecars = add_resources(sidecars, req)
            continue
        step = add_resources(sidecars, req)
        peak = {k: max(peak.get(k, 0), step.get(k, 0)) for k in peak.keys() | step.keys()}
    steady = add_resources(steady, sidecars)
    total = {k: max(steady.get(k, 0), peak.get(k, 0)) for k in steady.keys() | peak.keys()}
    overhead, ok_overhead = resource_list(spec.get("overhead"))
    return add_resources(total, overhead), ok and ok_overhead


# --- views ------------------------------------------------------------------------------------------


def as_map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def as_int(value: object, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


@dataclass(slots=True)
class UnitView:
    key: str
    namespace: str
    quota: str | None
    counts: dict[str, int]
    per_pod: dict[str, dict[str, int]]
    replicas: dict[str, int]
    reclaim: bool
    phase: str
    message: str
    active: bool
    consumer: tuple[str, str, str] | None
    unreadable: bool
    held: dict[str, int]
    #: ``spec.priority`` and the creation time (epoch seconds): the queue's order
    priority: int = 0
    created: float = 0.0
    #: ``status.lastAllocateTime`` (epoch seconds), when admitted
    allocated: float | None = None
    #: per admission: the pods the job extension reports running, and a pending reclaim's replicas
    running: dict[str, int] = field(default_factory=dict)
    reclaiming: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(max(0, n) for n in self.replicas.values())

    @property
    def consumer_kind(self) -> str:
        return self.consumer[0] if self.consumer is not None else ""

    @property
    def waiting(self) -> bool:
        """The unit competes for admission (docs/compatibility.md#phase-predicates, read here on
        its own): unfinished, not backing off, no reclaim in progress, not dequeued the legacy way
        (a dequeued phase without admissions), and some pod set still short of its count."""
        if self.phase in TERMINAL or self.phase == "TimeoutBackoff" or self.reclaim:
            return False
        if not self.replicas and self.phase in V1_DEQUEUED:
            return False
        return any(self.replicas.get(name, 0) < count for name, count in self.counts.items())

    @property
    def remaining(self) -> dict[str, int]:
        """What the unit still asks for: per pod set, its missing replicas x per-pod request."""
        out: dict[str, int] = {}
        for name, count in self.counts.items():
            missing = count - max(0, self.replicas.get(name, 0))
            if missing > 0:
                out = add_resources(out, {r: v * missing for r, v in self.per_pod.get(name, {}).items()})
        return {r: v for r, v in out.items() if v}


def parse_unit(raw: Mapping[str, Any]) -> UnitView:
    meta, spec, status = as_map(raw.get("metadata")), as_map(raw.get("spec")), as_map(raw.get("status"))
    labels = as_map(meta.get("labels"))
    quota = labels.get(names.QUOTA_NAME_LABEL) or labels.get(names.QUOTA_NAME_LABEL_FALLBACK) or None
    counts: dict[str, int] = {}
    per_pod: dict[str, dict[str, int]] = {}
    unreadable = False
    for item in spec.get("podSet") or []:
        item = as_map(item)
        name = item.get("name") or "main"
        counts[str(name)] = max(0, as_int(item.get("count"), 1))
        request, ok = pod_request(as_map(item.get("template")).get("spec"))
        per_pod[str(name)] = request
        unreadable = unreadable or not ok
    if not counts:
        request, ok = resource_list(spec.get("request"))
        if request:
            counts[DEFAULT_POD_SET], per_pod[DEFAULT_POD_SET] = 1, request
        unreadable = unreadable or not ok
    replicas: dict[str, int] = {}
    running: dict[str, int] = {}
    reclaiming: dict[str, int] = {}
    reclaim = False
    admission_resources: dict[str, dict[str, int]] = {}
    admissions = [as_map(a) for a in status.get("admissions") or []]
    for adm in admissions:
        name = str(adm.get("name") or "")
        replicas[name] = replicas.get(name, 0) + as_int(adm.get("replicas"))
        running[name] = running.get(name, 0) + as_int(adm.get("running"))
        admission_resources[name] = resource_list(adm.get("resources"))[0]
        reclaim = reclaim or adm.get("reclaimState") is not None
        if adm.get("reclaimState") is not None:
            reclaiming[name] = reclaiming.get(name, 0) + as_int(
                as_map(adm.get("reclaimState")).get("replicas")
            )
    phase = str(status.get("phase") or "")
    held: dict[str, int] = {}
    if phase not in TERMINAL:
        if not admissions and phase in V1_DEQUEUED:
            held = resource_list(spec.get("resource"))[0]
        for name, n in replicas.items():
            own = {r: v * max(n, 0) for r, v in per_pod.get(name, {}).items()}
            for r, v in admission_resources.get(name, {}).items():
                own[r] = max(own.get(r, 0), v)
            held = add_resources(held, own)
    held = {r: v for r, v in held.items() if v}
    ref = as_map(spec.get("consumerRef"))
    namespace = str(meta.get("namespace") or "")
    consumer = None
    if ref.get("kind") and ref.get("name"):
        consumer = (str(ref["kind"]), str(ref.get("namespace") or namespace), str(ref["name"]))
    return UnitView(
        key=f"{namespace}/{meta.get('name', '')}",
        namespace=namespace,
        quota=str(quota) if quota else None,
        counts=counts,
        per_pod=per_pod,
        replicas=replicas,
        reclaim=reclaim,
        phase=phase,
        message=str(status.get("message") or ""),
        active=spec.get("active") is not False,
        consumer=consumer,
        unreadable=unreadable,
        held=held,
        priority=as_int(spec.get("priority")),
        created=_epoch(meta.get("creationTimestamp")) or 0.0,
        allocated=_epoch(status.get("lastAllocateTime")),
        running=running,
        reclaiming=reclaiming,
    )


def _epoch(value: object) -> float | None:
    """An RFC 3339 time as epoch seconds; None when absent or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass(slots=True)
class QuotaView:
    name: str
    max: dict[str, int]
    parent: str
    shrunk_at: float = -1e9
    #: ``spec.min`` (docs/compatibility.md#quota-guarantees): guaranteed below a parent quota
    min: dict[str, int] = field(default_factory=dict)
    #: unused ``min`` is lent to siblings unless ``allow-lent-resource: "false"``
    lends: bool = True


@dataclass(slots=True)
class PodView:
    key: str
    unit: str | None
    job: str | None
    bound: bool
    gated: bool
    terminal: bool
    deleting: bool
    namespace: str = ""
    #: UID of the job this pod is provably a pod of (:func:`job_link_uids`), as a tuple: empty, or
    #: the UID in its controller reference (assigned by the apiserver to the owner, so in the pod's
    #: own namespace it is that job; a copied UID elsewhere matches nothing)
    owner_uids: tuple[str, ...] = ()
    #: what the pod asks the scheduler for (our own arithmetic over its containers)
    request: dict[str, int] = field(default_factory=dict)

    @property
    def live(self) -> bool:
        return not self.terminal and not self.deleting

    @property
    def schedulable(self) -> bool:
        """Not finished, and either bound (being deleted too: it runs for its grace period) or
        free to be bound (no admission gate, not being deleted): it takes node resources."""
        return not self.terminal and (self.bound or (not self.gated and not self.deleting))


#: The labels the Job controller selects its pods by (``spec.selector`` of a Job without
#: ``manualSelector``), with the Job's UID as value.
JOB_SELECTOR_LABELS = ("batch.kubernetes.io/controller-uid", "controller-uid")


def job_link_uids(meta: Mapping[str, Any], unit: str | None) -> tuple[str, ...]:
    """The UID of the job a pod is provably a pod of, the rule of docs/compatibility.md#pod-gating
    written again here (the observer never imports the product's ``podlinks``): its *controller*
    reference (``controller: true``) carries the UID; a plain owner reference proves nothing, since
    anyone who may read a job can copy its UID into a pod of their own. And the link must be one the
    system acts on: the pod names a unit (the annotation the product counts it by, frozen from the
    pod's birth by the policy ``koord-queue-pod-links``), or it carries the Job controller's own
    selector label with that UID (how the Job controller tells its pods: it lets go of a pod that
    claims it as controller without matching its selector). A tenant's own pod with a controller
    reference to another team's Job and neither link (the refused annotate-an-existing-pod attack of
    the full run of 2026-12-04, RELIABILITY.md) is counted by nobody: it is her bare pod."""
    owners = [as_map(o) for o in meta.get("ownerReferences") or []]
    controller = next((o for o in owners if o.get("controller") is True), None)
    uid = str(controller.get("uid") or "") if controller is not None else ""
    if not uid:
        return ()
    labels = as_map(meta.get("labels"))
    if unit or any(labels.get(label) == uid for label in JOB_SELECTOR_LABELS):
        return (uid,)
    return ()


def parse_pod(raw: Mapping[str, Any]) -> PodView:
    meta, spec, status = as_map(raw.get("metadata")), as_map(raw.get("spec")), as_map(raw.get("status"))
    namespace = str(meta.get("namespace") or "")
    unit = as_map(meta.get("annotations")).get(names.RELATED_QUEUEUNIT_ANNOTATION) or None
    owners = [as_map(o) for o in meta.get("ownerReferences") or []]
    job = next((f"{namespace}/{o.get('name')}" for o in owners if o.get("kind") == "Job"), None)
    gates = [g.get("name") for g in spec.get("schedulingGates") or [] if isinstance(g, Mapping)]
    return PodView(
        key=f"{namespace}/{meta.get('name', '')}",
        unit=str(unit) if unit else None,
        job=job,
        bound=bool(spec.get("nodeName")),
        gated=names.ADMISSION_GATE in gates,
        terminal=status.get("phase") in ("Succeeded", "Failed"),
        deleting=bool(meta.get("deletionTimestamp")),
        namespace=namespace,
        owner_uids=job_link_uids(meta, str(unit) if unit else None),
        request=pod_request(spec)[0],
    )


@dataclass(slots=True)
class JobView:
    key: str
    managed: bool
    suspended: bool
    finished: str  # "", "Complete" or "Failed"
    deleting: bool
    succeeded: int = 0
    reason: str = ""
    uid: str = ""
    parallelism: int | None = None
    completions: int | None = None
    #: a controller owner reference names a kind of a group that queues jobs: a claim to be the
    #: child of a queued parent, which the product lets in unsuspended with its pods born gated
    claims_parent: bool = False

    @property
    def namespace(self) -> str:
        return self.key.partition("/")[0]

    @property
    def needed(self) -> int:
        """Pods the Job still wants at once: ``min(parallelism, completions - succeeded)``
        (parallelism defaults to 1); none once it has finished."""
        if self.finished:
            return 0
        wanted = 1 if self.parallelism is None else max(0, self.parallelism)
        if self.completions is not None:
            wanted = min(wanted, max(0, self.completions - self.succeeded))
        return wanted


#: API groups whose jobs create batch Jobs as their children (a claim the product resolves).
PARENT_GROUPS: Final = frozenset(
    {"kubeflow.org", "jobset.x-k8s.io", "ray.io", "argoproj.io", "sparkoperator.k8s.io"}
)


def claims_parent(meta: Mapping[str, Any]) -> bool:
    """Whether a controller owner reference of ``meta`` names a kind of :data:`PARENT_GROUPS`."""
    return any(
        isinstance(ref, Mapping)
        and ref.get("controller") is True
        and str(ref.get("apiVersion") or "").partition("/")[0] in PARENT_GROUPS
        for ref in meta.get("ownerReferences") or []
    )


def parse_job(raw: Mapping[str, Any]) -> JobView:
    meta, spec, status = as_map(raw.get("metadata")), as_map(raw.get("spec")), as_map(raw.get("status"))
    labels = as_map(meta.get("labels"))
    ended = [
        c
        for c in status.get("conditions") or []
        if c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
    ]
    finished = str(ended[0]["type"]) if ended else ""
    reason = str(ended[0].get("reason") or "") if ended else ""
    return JobView(
        key=f"{meta.get('namespace', '')}/{meta.get('name', '')}",
        managed=bool(labels.get(names.QUOTA_NAME_LABEL) or labels.get(names.QUOTA_NAME_LABEL_FALLBACK)),
        suspended=bool(spec.get("suspend")),
        finished=str(finished),
        deleting=bool(meta.get("deletionTimestamp")),
        succeeded=as_int(status.get("succeeded")),
        reason=reason,
        uid=str(meta.get("uid") or ""),
        parallelism=as_int(spec["parallelism"]) if isinstance(spec.get("parallelism"), int) else None,
        completions=as_int(spec["completions"]) if isinstance(spec.get("completions"), int) else None,
        claims_parent=claims_parent(meta),
    )


# --- the extra fields usage-mismatch reads from the protobuf-stored kinds ------------------------


def _quantities(data: bytes) -> tuple[str, str]:
    """A ``map<string, Quantity>`` entry: the name (1) and the quantity's string (2 -> 1)."""
    name = text = ""
    for number, item in k8sproto.fields(data):
        if number == 1:
            name = k8sproto._text(item)
        elif number == 2:
            text = next((k8sproto._text(v) for n, v in k8sproto.fields(k8sproto._bytes(item)) if n == 1), "")
    return name, text


def _container(data: bytes) -> dict[str, Any]:
    """``Container``: resources (8: limits 1, requests 2) and restartPolicy (24)."""
    out: dict[str, Any] = {"resources": {"limits": {}, "requests": {}}}
    for number, item in k8sproto.fields(data):
        if number == 8:
            for n, v in k8sproto.fields(k8sproto._bytes(item)):
                if n in (1, 2):
                    name, text = _quantities(k8sproto._bytes(v))
                    out["resources"]["limits" if n == 1 else "requests"][name] = text
        elif number == 24:
            out["restartPolicy"] = k8sproto._text(item)
    return out


def pod_spec_resources(value: bytes) -> dict[str, Any]:
    """The request-bearing fields of a stored Pod's spec: containers (2), initContainers (20) and
    overhead (32), in the shape :func:`pod_request` reads."""
    out: dict[str, Any] = {"containers": [], "initContainers": [], "overhead": {}}
    for number, item in k8sproto.fields(k8sproto._unwrap(value)):
        if number != 2:
            continue
        for n, v in k8sproto.fields(k8sproto._bytes(item)):
            if n == 2:
                out["containers"].append(_container(k8sproto._bytes(v)))
            elif n == 20:
                out["initContainers"].append(_container(k8sproto._bytes(v)))
            elif n == 32:
                name, text = _quantities(k8sproto._bytes(v))
                out["overhead"][name] = text
    return out


def job_spec_counts(value: bytes) -> dict[str, int]:
    """A stored Job's ``spec.parallelism`` (1) and ``spec.completions`` (2), when set."""
    out: dict[str, int] = {}
    for number, item in k8sproto.fields(k8sproto._unwrap(value)):
        if number != 2:
            continue
        for n, v in k8sproto.fields(k8sproto._bytes(item)):
            if n in (1, 2) and isinstance(v, int):
                out["parallelism" if n == 1 else "completions"] = v
    return out


def decode_pod(value: bytes) -> dict[str, Any]:
    raw = k8sproto.pod(value)
    raw["spec"].update(pod_spec_resources(value))
    return raw


def decode_job(value: bytes) -> dict[str, Any]:
    raw = k8sproto.job(value)
    raw["spec"].update(job_spec_counts(value))
    return raw
