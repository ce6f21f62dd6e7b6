"""Hostile-tenant attacks on what only an administrator may do to the queue as a whole: stop a
queue, or take the queue out of the way the uninstall does (docs/compatibility.md#stopping-a-queue,
docs/operations.md#uninstall).

A tenant who could stop a sibling team's queue would keep it from being admitted; one who could
delete the webhook configurations or the gate policy's binding, or scale the reconciler to zero,
would run her jobs unqueued or freeze everyone's. Mallory (``chaos.tenant``) tries each round, as a
server-side dry run where the write would harm the run should it pass:

``stop-a-queue``
    the annotation ``koord-queue/stopped: "true"`` on her own quota's Queue (a dry run);
``take-the-queue-out-of-the-way``
    the mutating webhook configuration and the admission gate's policy binding deleted, and the
    reconciler's Deployment scaled to zero (all dry runs).

RBAC must refuse every one: Queues, webhook configurations, policies and the component's
Deployment are not a namespace user's to write.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Final

from chaos.tenant_common import QUOTA, Attacker
from koord_queue.shared import kube
from koord_queue.shared.api import names
from testenv import system

STOP: Final = "stop-a-queue"
OUT_OF_THE_WAY: Final = "take-the-queue-out-of-the-way"
#: attack -> the defence expected to stop it (merged into ``chaos.tenant.ATTACKS``, the report's table).
ATTACKS: Final[dict[str, str]] = {
    STOP: "RBAC: Queues are read-only for namespace users (user roles); only an administrator stops "
    "a queue (kubectl koord-queue stop)",
    OUT_OF_THE_WAY: "RBAC: webhook configurations, admission policies and their bindings, and the "
    "reconciler's Deployment are cluster-admin objects; only an administrator uninstalls",
}
QUEUES: Final = kube.Resource(names.GROUP, names.VERSION, names.QUEUE_PLURAL, "Queue")
_ADMISSION: Final = "admissionregistration.k8s.io"
WEBHOOKS: Final = kube.Resource(
    _ADMISSION, "v1", "mutatingwebhookconfigurations", "MutatingWebhookConfiguration", namespaced=False
)
BINDINGS: Final = kube.Resource(
    _ADMISSION, "v1", "validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding", False
)
DEPLOYMENTS: Final = kube.Resource("apps", "v1", "deployments", "Deployment")
DRY_RUN: Final = {"dryRun": "All"}
Call = Callable[[], Awaitable[kube.Obj]]


def _dry(m: kube.Kube, method: str, path: str, patch: kube.Obj | None = None) -> Call:
    """``method`` on ``path`` as a server-side dry run (a merge patch when ``patch`` is given)."""
    content = kube.MERGE_PATCH if patch is not None else None
    return functools.partial(m.request, method, path, body=patch, query=DRY_RUN, content_type=content)


def tries(m: kube.Kube) -> dict[str, list[tuple[str, Call]]]:
    """Per attack, what mallory sends (each a dry run): ``(what, call)``."""
    ns = system.NAMESPACE  # where the chaos run installs the system
    stop = {"metadata": {"annotations": {names.STOPPED_ANNOTATION: "true"}}}
    return {
        STOP: [("annotate", _dry(m, "PATCH", QUEUES.path(ns, QUOTA), stop))],
        OUT_OF_THE_WAY: [
            ("delete webhook", _dry(m, "DELETE", WEBHOOKS.path(None, "koord-queue"))),
            ("delete gate binding", _dry(m, "DELETE", BINDINGS.path(None, "koord-queue-admission-gate"))),
            (
                "scale reconciler",
                _dry(m, "PATCH", DEPLOYMENTS.path(ns, "koord-queue-reconciler"), {"spec": {"replicas": 0}}),
            ),
        ],
    }


async def release_attacks(t: Attacker, r: int) -> None:
    """The module's attacks for round ``r``: every try must be refused."""
    m = t.mallory
    assert m is not None
    for attack, calls in tries(m).items():
        for what, call in calls:
            sent = await t.send(call, rbac_allows=False)
            if sent.status == "refused":
                t.record(attack, r, what, "refused", sent.message)
            elif sent.status == "accepted":
                t.record(attack, r, what, "SUCCEEDED", "accepted: a namespace user wrote it (a dry run)")
            else:
                t.record(attack, r, what, "skipped", sent.message)
