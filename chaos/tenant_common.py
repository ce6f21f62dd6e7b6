"""What the hostile tenant's attack modules share with ``chaos.tenant``: her namespaces and the
resources she writes, the readings of pods and units every judge makes, and the tenant itself as
an interface (:class:`Attacker`), so an attack module never imports ``chaos.tenant``, which imports
the attack modules to list their attacks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from chaos import load
from koord_queue.shared import kube
from koord_queue.shared.api import names, quantities

#: Mallory's own namespace; its quota (same name) is bound to it by living there.
NAMESPACE: Final = "chaos-mallory"
QUOTA: Final = "chaos-mallory"
#: Her second namespace, where queueing is mandatory (docs/operations.md#mandatory-queueing).
MANDATORY_NAMESPACE: Final = "chaos-mallory-queued"
#: How long an accepted attack is watched for its harm (or its repair).
WATCH_S: Final = 6.0
UNDO_S: Final = 30.0

JOBS = load.JOBS
UNITS = load.UNITS
QUOTAS = load.QUOTA_RESOURCE
WORKFLOWS = kube.Resource("argoproj.io", "v1alpha1", "workflows", "Workflow")


@dataclass
class Sent:
    """What became of one request: ``accepted`` (with the stored object), ``refused`` or ``gone``
    (with the message), ``changed`` (the target changed since it was read: 409 on our
    resourceVersion), ``exists`` (a create answered AlreadyExists: no decision to judge)."""

    status: str
    obj: kube.Obj = field(default_factory=dict)
    message: str = ""


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def gated(spec: object) -> bool:
    gates = (spec or {}).get("schedulingGates") if isinstance(spec, Mapping) else None
    return any(isinstance(g, Mapping) and g.get("name") == names.ADMISSION_GATE for g in gates or [])


def is_admitted_unit(unit: Mapping[str, Any]) -> bool:
    status = unit.get("status") or {}
    phase = status.get("phase")
    replicas = sum(int(a.get("replicas") or 0) for a in status.get("admissions") or [])
    return replicas > 0 and phase not in ("Succeed", "Failed")


def runs(pod: Mapping[str, Any]) -> bool:
    """The pod runs or may start: not finished, and bound (terminating or not) or out of the
    admission gate and not being deleted. Read from the pod alone."""
    spec = pod.get("spec") or {}
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    if spec.get("nodeName"):
        return True
    return not gated(spec) and not _meta(pod).get("deletionTimestamp")


def held_cpu_milli(unit: Mapping[str, Any]) -> int:
    """CPU a unit holds: admitted replicas of each pod set times the CPU its template's containers
    ask for (the chaos jobs have no init containers, pod-level requests or overhead)."""
    per_pod: dict[str, int] = {}
    for pod_set in (unit.get("spec") or {}).get("podSet") or []:
        milli = 0
        for c in ((pod_set.get("template") or {}).get("spec") or {}).get("containers") or []:
            cpu = ((c.get("resources") or {}).get("requests") or {}).get("cpu")
            with contextlib.suppress(quantities.QuantityError, TypeError):
                milli += quantities.parse_milli(cpu) if cpu is not None else 0
        per_pod[str(pod_set.get("name"))] = milli
    return sum(
        int((a or {}).get("replicas") or 0) * per_pod.get(str((a or {}).get("name")), 0)
        for a in (unit.get("status") or {}).get("admissions") or []
    )


class Attacker(Protocol):
    """The tenant as an attack sees it (``chaos.tenant.Tenant``): the harness's admin client and
    mallory's, her writes retried through faults, reads, her own job's unit and pods, and the record
    of outcomes."""

    admin: kube.Kube
    mallory: kube.Kube | None

    def record(
        self, attack: str, r: int, target: str, outcome: str, detail: str, seconds: float | None = None
    ) -> None: ...
    async def send(self, call: Callable[[], Awaitable[kube.Obj]], *, rbac_allows: bool = True) -> Sent: ...
    async def _read(self, call: Callable[[], Awaitable[Any]]) -> Any: ...
    async def _own_unit(self, name: str) -> kube.Obj: ...
    async def _own_pods(self, job: str) -> list[kube.Obj]: ...
    async def _own_job_admitted(self, attack: str, r: int, body: kube.Obj) -> kube.Obj | None: ...
