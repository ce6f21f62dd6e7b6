"""What the webhook knows of the native gang hand-off (docs/compatibility.md#native-gang-hand-off).

The webhook makes no API calls (docs/architecture.md#decision-6-a-stateless-scoped-webhook), so it
does not look for the Workload API itself: the reconciler does (discovery, at start-up) and publishes
what it found in the ConfigMap ``koord-queue/koord-queue-native-gangs``, key ``workloadAPI``, which
the webhook Deployment mounts (optional volume). :class:`PublishedState` reads that file, at most
once per ``interval`` seconds, and says "served" only while it holds exactly
``scheduling.k8s.io/v1alpha1``: a missing, empty or other file means no ``workloadRef`` is stamped.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from koord_queue.shared.core import workloadref

log = logging.getLogger(__name__)


class PublishedState:
    """A :class:`shared.core.workloadref.ServedProbe` over the reconciler's published file."""

    def __init__(self, path: Path, *, interval: float = 10.0) -> None:
        self.path = path
        self.interval = interval
        self._served = False
        self._read_at: float | None = None

    def served(self) -> bool:
        now = time.monotonic()
        if self._read_at is None or now - self._read_at >= self.interval:
            self._read_at = now
            self._refresh()
        return self._served

    def _refresh(self) -> None:
        try:
            text = self.path.read_text().strip()
        except OSError:
            text = ""
        served = text == workloadref.WORKLOAD_API_VERSION
        if served != self._served:
            if served:
                log.info("native gang hand-off: %s is served; stamping workloadRef on gang templates", text)
            else:
                log.warning(
                    "native gang hand-off: the reconciler has not published %s as served (%s); "
                    "no workloadRef is stamped",
                    workloadref.WORKLOAD_API_VERSION,
                    self.path,
                )
        self._served = served
