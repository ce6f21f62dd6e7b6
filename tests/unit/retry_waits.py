"""The waits the retry policies (``shared.retrying``) ask for, recorded instead of slept, so a test
of a back-off runs at once and can assert the schedule (docs/architecture.md#retries)."""

from __future__ import annotations

from typing import Any

import pytest

from koord_queue.shared import retrying

__all__ = ["UNIT", "Enough", "record"]

#: a waiting QueueUnit as the API returns it (the retried writes' subject)
UNIT: dict[str, Any] = {
    "apiVersion": "scheduling.x-k8s.io/v1alpha1",
    "kind": "QueueUnit",
    "metadata": {"name": "u", "namespace": "ns", "resourceVersion": "5"},
    "spec": {"queue": "q", "podSet": [{"name": "main", "count": 1, "template": {}}]},
    "status": {"phase": "Enqueued"},
}


class Enough(Exception):
    """Ends a run that would retry for ever: not an API error, so no policy retries it."""


def record(monkeypatch: pytest.MonkeyPatch, limit: int | None = None) -> list[float]:
    """Replace the policies' sleep with one that notes each wait; past ``limit`` waits it raises
    :class:`Enough`."""
    taken: list[float] = []

    async def noted(seconds: float) -> None:
        taken.append(seconds)
        if limit is not None and len(taken) >= limit:
            raise Enough

    monkeypatch.setattr(retrying, "sleep", noted)
    return taken
