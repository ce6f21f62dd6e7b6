"""The pod gate: hold pods that carry ``koord-queue/gated-pod`` behind the admission gate (pure).

Most job kinds are held through their pod templates: the job webhook adds the scheduling gate
``koord-queue/admission`` to every template, so every pod the job's controller creates starts gated. A
SparkApplication has no pod template: the Spark operator builds the driver pod from ``spec.driver`` and
the driver builds the executors from ``spec.executor``, and the stock operator ignores the suspend
annotation and does so at once. The job webhook therefore labels those pods instead
(``spec.driver.labels`` / ``spec.executor.labels``, copied onto the pods), and this webhook, called by
the apiserver on pod CREATE for pods carrying the label (``objectSelector``, ``failurePolicy: Fail``),
adds the gate to each of them. A gated pod is never scheduled; the reconciler removes the gate from at
most the admitted number of pods per pod set
(docs/architecture.md#decision-5-gate-pods-reclaim-only-unbound-ones). The hold thus depends on neither
the operator nor anything it does with the suspend annotation.

The label's value is not read: the label being there is what gates, so a value set elsewhere (a
user's ``sparkConf`` entry for the same label) cannot switch the gate off. A labelled pod created
already bound to a node (``spec.nodeName``) would bypass the scheduler and so the gate; it is
refused with a message saying why.

:func:`review` takes the AdmissionReview body (the envelope is checked by
``shared.admission.decisions.parse_review``, so a malformed body raises ``MalformedReview`` exactly as for
the job webhooks) and returns the full answer; :func:`decide` answers an already parsed request.
"""

from __future__ import annotations

from typing import Any, Final

from koord_queue.shared.admission import validation
from koord_queue.shared.admission.decisions import (
    REVIEW_API_VERSION,
    AdmissionRequest,
    allow,
    deny,
    parse_review,
    patched,
)
from koord_queue.shared.api import names
from koord_queue.shared.jobs import base
from koord_queue.shared.jobs.base import JobSpecError
from koord_queue.shared.jobs.patches import PatchBuilder

_POD: Final = ("v1", "Pod")
_GATES: Final = ("spec", "schedulingGates")
_GATE: Final = {"name": names.ADMISSION_GATE}


def review(body: object) -> dict[str, Any]:
    """A full AdmissionReview answer to ``body``; raises ``MalformedReview`` only."""
    response = decide(parse_review(body))
    return {"apiVersion": REVIEW_API_VERSION, "kind": "AdmissionReview", "response": response}


def decide(request: AdmissionRequest) -> dict[str, Any]:
    """The ``response`` part: a JSON Patch adding the gate, a refusal, or allowed unchanged.

    Anything but the CREATE of a labelled pod is allowed untouched, so a mis-scoped webhook
    configuration can never change an unrelated object.
    """
    pod = request.obj
    if (
        request.operation != "CREATE"
        or request.sub_resource
        or (request.api_version, request.kind) != _POD
        or pod is None
        or names.GATED_POD_LABEL not in base.labels_of(pod)
    ):
        return allow(request.uid)
    if base.dig(pod, "spec", "nodeName"):
        detail = (
            f"a pod labelled {names.GATED_POD_LABEL} is held by the scheduling gate "
            f"{names.ADMISSION_GATE} until koord-queue admits its job; it cannot be created bound "
            "to a node, which would bypass the scheduler and the gate"
        )
        return deny(request.uid, [validation.forbidden("spec.nodeName", detail)])
    builder = PatchBuilder(pod)
    try:
        builder.append_unique(_GATES, _GATE, key="name")
    except JobSpecError as err:
        return deny(request.uid, [validation.from_spec_error(err)])
    return patched(request.uid, builder.ops) if builder.ops else allow(request.uid)
