"""Admission checks: which checks a unit must pass, and what their states mean
(docs/compatibility.md#admission-checks).

A Queue lists checks (``spec.admissionChecks``), each with an optional label selector matched
against the QueueUnit labels. A unit that matches at least one check is admitted to ``Reserved``
(quota held, job not released) instead of ``Dequeued``; an external controller then writes each
check's state, and this module turns those states into the next phase:

1. the first check, in list order, in ``Rejected`` or ``Retry`` -> ``TimeoutBackoff``,
   "admission check failed";
2. every check ``Ready`` -> ``Dequeued``, "all admission checks success";
3. otherwise (some ``Pending``) the unit stays ``Reserved``.

koord-queue never reads AdmissionCheck objects; it only copies names. Label selectors live here
because admission checks are their only user in the core. Pure: standard library only, no clock
(``now`` is RFC 3339 text passed in).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from koord_queue.shared.api.names import AdmissionCheckState, Message, Phase

__all__ = [
    "CHECK_REMOVED_MESSAGE",
    "CheckOutcome",
    "CheckState",
    "LabelSelector",
    "QueueAdmissionCheck",
    "Requirement",
    "checks_for_admission",
    "evaluate",
    "matched_checks",
    "next_phase",
    "parse_selector",
]

#: Message of a unit's check that the queue no longer lists (sic, upstream's spelling).
CHECK_REMOVED_MESSAGE = "AdmisssionCheck is removed from queue"
_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})


@dataclass(frozen=True, slots=True)
class CheckState:
    """One ``status.admissionChecks`` entry (kueue ``AdmissionCheckState``)."""

    name: str
    state: str
    message: str = ""
    last_transition_time: str = ""


@dataclass(frozen=True, slots=True)
class Requirement:
    """One ``matchExpressions`` entry; ``operator`` is In, NotIn, Exists or DoesNotExist."""

    key: str
    operator: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.operator == "In":
            return present and labels[self.key] in self.values
        if self.operator == "NotIn":
            return not present or labels[self.key] not in self.values
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        return False  # an unknown operator never matches (and was reported as a problem)


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """``metav1.LabelSelector``: every ``matchLabels`` pair and every expression must hold.

    An empty selector matches everything, as in Kubernetes.
    """

    match_labels: Mapping[str, str] = field(default_factory=dict)
    expressions: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        for key, value in self.match_labels.items():
            if labels.get(key) != value:
                return False
        return all(req.matches(labels) for req in self.expressions)


@dataclass(frozen=True, slots=True)
class QueueAdmissionCheck:
    """``Queue.spec.admissionChecks[i]``; ``selector=None`` matches every unit."""

    name: str
    selector: LabelSelector | None = None

    def matches(self, labels: Mapping[str, str]) -> bool:
        return self.selector is None or self.selector.matches(labels)


def parse_selector(raw: object, *, path: str = "labelSelector") -> tuple[LabelSelector, list[str]]:
    """Parse a label selector; returns it with the problems found. Never raises.

    Malformed parts are reported and made to match nothing (an unknown operator, In/NotIn without
    values), so a typo in a selector never silently widens it.
    """
    problems: list[str] = []
    mapping = raw if isinstance(raw, Mapping) else {}
    if raw is not None and not isinstance(raw, Mapping):
        problems.append(f"{path}: expected an object, got {type(raw).__name__}")
    labels_raw = mapping.get("matchLabels") or {}
    match_labels: dict[str, str] = {}
    if isinstance(labels_raw, Mapping):
        for key, value in labels_raw.items():
            if isinstance(key, str) and isinstance(value, str):
                match_labels[key] = value
            else:
                problems.append(f"{path}.matchLabels.{key}: expected a string value")
                match_labels[str(key)] = "\x00"  # matches no real label value
    else:
        problems.append(f"{path}.matchLabels: expected an object")
    expressions: list[Requirement] = []
    exprs_raw = mapping.get("matchExpressions") or []
    if not isinstance(exprs_raw, list):
        problems.append(f"{path}.matchExpressions: expected a list")
        exprs_raw = []
    for i, item in enumerate(exprs_raw):
        where = f"{path}.matchExpressions[{i}]"
        item_map = item if isinstance(item, Mapping) else {}
        key = item_map.get("key")
        operator = item_map.get("operator")
        values_raw = item_map.get("values") or []
        values = (
            frozenset(v for v in values_raw if isinstance(v, str)) if isinstance(values_raw, list) else None
        )
        if not isinstance(key, str) or not key:
            problems.append(f"{where}.key: must be a non-empty string")
        if not isinstance(operator, str) or operator not in _OPERATORS:
            problems.append(f"{where}.operator: unsupported operator {operator!r}")
            operator = "Invalid"
        elif operator in ("In", "NotIn") and not values:
            problems.append(f"{where}.values: must be non-empty for operator {operator}")
            operator = "Invalid"
        expressions.append(Requirement(key=str(key), operator=str(operator), values=values or frozenset()))
    return LabelSelector(match_labels=match_labels, expressions=tuple(expressions)), problems


def matched_checks(queue_checks: Sequence[QueueAdmissionCheck], labels: Mapping[str, str]) -> tuple[str, ...]:
    """Names of the queue's checks whose selector matches ``labels``, in queue order, no duplicates."""
    out: list[str] = []
    for check in queue_checks:
        if check.name and check.name not in out and check.matches(labels):
            out.append(check.name)
    return tuple(out)


def _entry(name: str, state: str, message: str, ltt: str) -> dict[str, object]:
    return {"name": name, "state": state, "lastTransitionTime": ltt, "message": message, "podSetUpdates": []}


def checks_for_admission(
    queue_checks: Sequence[QueueAdmissionCheck],
    labels: Mapping[str, str],
    existing: Sequence[CheckState],
    *,
    now: str,
) -> list[dict[str, object]]:
    """The ``status.admissionChecks`` list to write when a unit is admitted to ``Reserved``.

    Upstream's ``setAdmissionCheck``: matched checks already on the unit are reset to ``Pending``
    with an empty message and no pod-set updates; newly matched checks are appended as
    ``Pending``; checks the unit carries but the queue no longer matches become ``Ready`` with
    :data:`CHECK_REMOVED_MESSAGE`. ``lastTransitionTime`` moves only when the state changes.
    """
    matched = matched_checks(queue_checks, labels)
    out: list[dict[str, object]] = []
    seen: set[str] = set()
    for check in existing:
        if check.name in seen:
            continue
        seen.add(check.name)
        if check.name in matched:
            state, message = AdmissionCheckState.PENDING.value, ""
        else:
            state, message = AdmissionCheckState.READY.value, CHECK_REMOVED_MESSAGE
        ltt = check.last_transition_time if check.state == state and check.last_transition_time else now
        out.append(_entry(check.name, state, message, ltt))
    for name in matched:
        if name not in seen:
            out.append(_entry(name, AdmissionCheckState.PENDING.value, "", now))
    return out


@dataclass(frozen=True, slots=True)
class CheckOutcome:
    """The phase and ``status.message`` a Reserved unit moves to."""

    phase: Phase
    message: str
    failed_check: str | None = None


def evaluate(checks: Sequence[CheckState]) -> CheckOutcome | None:
    """Apply the rules of docs/compatibility.md#admission-checks to a unit's check states; ``None``
    means "stay Reserved"."""
    for check in checks:
        if check.state in (AdmissionCheckState.REJECTED, AdmissionCheckState.RETRY):
            return CheckOutcome(Phase.TIMEOUT_BACKOFF, Message.CHECK_FAILED, failed_check=check.name)
    if all(check.state == AdmissionCheckState.READY for check in checks):
        return CheckOutcome(Phase.DEQUEUED, Message.CHECKS_READY)
    return None


def next_phase(phase: str, checks: Sequence[CheckState]) -> CheckOutcome | None:
    """Only units in ``Reserved`` are evaluated (upstream's QueueUnitController filter)."""
    if phase != Phase.RESERVED:
        return None
    return evaluate(checks)
