"""Native gang hand-off, the reconciler's half (docs/compatibility.md#native-gang-hand-off).

With ``nativeGangHandoff: true`` in the component configuration:

* :func:`detect` (start-up): asks discovery whether the cluster serves the Workload API
  ``scheduling.k8s.io/v1alpha1``. When it does not (or serves Workloads only in another version),
  the hand-off is refused: an error names the API and the feature gates it needs, and nothing is
  stamped or created; the rest of the system runs as without the switch;
* :func:`publish` (leader): writes what was found into the ConfigMap ``koord-queue-native-gangs``
  of the install namespace (key ``workloadAPI``; docs/operations.md#install-namespace), the only
  thing the webhook reads to decide whether it stamps ``spec.workloadRef`` on gang templates
  (``webhook.nativegangs``); with the switch off the ConfigMap is deleted, so a webhook still told
  to look stops stamping;
* :func:`before_ungate` (each admitted unit, before its pods lose the admission gate): creates the
  unit's ``Workload`` (``shared.core.workloadref.workload_for``), owned by the job, so that
  kube-scheduler finds it as soon as the pods reach its queue. A failure to create it fails the
  pass (the pods stay gated; the pass is retried).

The detection lives in the module-level :data:`STATE` (set once by ``reconciler.main``), so the
job extensions need no new constructor argument.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Final

from tenacity import RetryCallState

from koord_queue.shared import kube, retrying
from koord_queue.shared.api.parsing import parse_unit
from koord_queue.shared.core import workloadref
from koord_queue.shared.jobs.base import JobAdapter
from koord_queue.shared.jobs.podplan import PodView

log = logging.getLogger(__name__)

WORKLOADS: Final = kube.Resource(
    workloadref.WORKLOAD_GROUP, workloadref.WORKLOAD_VERSION, workloadref.WORKLOAD_PLURAL, "Workload"
)
CONFIG_MAPS: Final = kube.Resource("", "v1", "configmaps", "ConfigMap")
#: Workloads known to exist, remembered up to this many (then forgotten and checked again).
_REMEMBERED: Final = 50_000


@dataclass
class Handoff:
    """What start-up decided: the switch, whether the API is served, and what else was found."""

    enabled: bool = False
    served: bool = False
    #: another version serving ``workloads`` (e.g. ``scheduling.k8s.io/v1beta1``), for the message
    other: str | None = None
    #: ``namespace/name/job uid`` of the Workloads created or found
    known: set[str] = field(default_factory=set)

    @property
    def active(self) -> bool:
        return self.enabled and self.served


STATE = Handoff()


async def _resources(client: kube.Kube, group_version: str) -> kube.Obj | None:
    try:
        return await client.request("GET", f"/apis/{group_version}")
    except kube.NotFound:
        return None


async def detect(client: kube.Kube, *, enabled: bool) -> Handoff:
    """Decide the hand-off for this process (and store it in :data:`STATE`); logs the refusal."""
    state = Handoff(enabled=enabled)
    if enabled:
        state.served = workloadref.served_in(await _resources(client, workloadref.WORKLOAD_API_VERSION))
        if not state.served:
            group = await _resources(client, workloadref.WORKLOAD_GROUP)
            for version in (group or {}).get("versions") or []:
                gv = str(version.get("groupVersion", "")) if isinstance(version, dict) else ""
                if (
                    gv
                    and gv != workloadref.WORKLOAD_API_VERSION
                    and workloadref.served_in(await _resources(client, gv))
                ):
                    state.other = gv
                    break
            log.error("%s", workloadref.refusal(state.other))
        else:
            log.info(
                "native gang hand-off on: %s Workloads are served; gangs are placed all-or-nothing "
                "by kube-scheduler",
                workloadref.WORKLOAD_API_VERSION,
            )
    STATE.enabled, STATE.served, STATE.other = state.enabled, state.served, state.other
    STATE.known.clear()
    return state


async def publish(client: kube.Kube, state: Handoff, namespace: str) -> None:
    """Write the decision where the webhook reads it (the ConfigMap in ``namespace``, the install
    namespace), retried until it is written; with the switch off, remove a ConfigMap left from a
    run with it on (one attempt)."""
    name = workloadref.STATE_CONFIGMAP
    if not state.enabled:
        with contextlib.suppress(kube.KubeError):
            await client.delete(CONFIG_MAPS, name, namespace=namespace)
        return

    def failed(state: RetryCallState) -> None:
        log.warning("ConfigMap %s/%s: %s; will retry", namespace, name, retrying.failure(state))

    async for attempt in retrying.steady(2.0, failed):
        with attempt:
            await _write(client, state, namespace, name)


async def _write(client: kube.Kube, state: Handoff, namespace: str, name: str) -> None:
    data = {
        workloadref.STATE_KEY: workloadref.WORKLOAD_API_VERSION if state.served else "",
        "detail": "served" if state.served else workloadref.refusal(state.other),
    }
    async for attempt in retrying.on_conflict():  # created or replaced meanwhile: compare again
        with attempt:
            try:
                current = await client.get(CONFIG_MAPS, name, namespace=namespace)
            except kube.NotFound:
                body = {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {
                        "name": name,
                        "namespace": namespace,
                        "labels": {"app.kubernetes.io/part-of": "koord-queue"},
                    },
                    "data": data,
                }
                await client.create(CONFIG_MAPS, body, namespace=namespace)
                return
            if (current.get("data") or {}) != data:
                await client.replace(CONFIG_MAPS, name, {**current, "data": data}, namespace=namespace)


async def before_ungate(
    client: kube.Kube, job: kube.Obj, adapter: JobAdapter, unit: kube.Obj, ungate: list[PodView]
) -> None:
    """Make sure the unit's Workload exists before ``ungate`` pods are released (no-op when the
    hand-off is not active, nothing is released, or the unit has no gang)."""
    if not ungate or not STATE.active:
        return
    parsed = parse_unit(unit)
    groups = workloadref.gang_pod_groups(parsed)
    if not groups:
        return
    job_uid = str((job.get("metadata") or {}).get("uid") or "")
    key = f"{parsed.namespace}/{parsed.name}/{job_uid}"
    if key in STATE.known:
        return
    body = workloadref.workload_for(parsed.name, parsed.namespace, job, adapter, groups)
    try:
        await client.create(WORKLOADS, body, namespace=parsed.namespace)
        log.info("Workload %s/%s created for its gang pod sets", parsed.namespace, parsed.name)
    except kube.Conflict:
        existing = await client.get(WORKLOADS, parsed.name, namespace=parsed.namespace)
        refs = (existing.get("metadata") or {}).get("ownerReferences") or []
        owners = {str(ref.get("uid")) for ref in refs if isinstance(ref, dict)}
        if job_uid not in owners:
            # A predecessor's (same name, older job): garbage collection deletes it; until then
            # the pods wait gated rather than being placed by another job's pod groups.
            raise kube.KubeError(
                409, "AlreadyExists", f"Workload {parsed.namespace}/{parsed.name} belongs to another job"
            ) from None
    except kube.NotFound:
        log.error("%s", workloadref.refusal(None))
        raise
    if len(STATE.known) >= _REMEMBERED:
        STATE.known.clear()
    STATE.known.add(key)
