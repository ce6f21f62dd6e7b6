"""The API client's client-side rate limit (QPS and burst, like client-go's).

A token bucket of its own, apart from ``shared.kube`` because it knows nothing of the API: every
request and watch the client sends takes one token first.
"""

from __future__ import annotations

import asyncio
import time


class RateLimiter:
    """Token bucket: ``qps`` tokens per second, at most ``burst`` banked (client-go semantics)."""

    def __init__(self, *, qps: float, burst: int) -> None:
        self.qps = qps
        self.burst = max(1, burst)
        self._tokens = float(self.burst)
        self._stamp = time.monotonic()
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        if self.qps <= 0:
            return
        async with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.qps)
            self._stamp = now
            if self._tokens < 1:
                await asyncio.sleep((1 - self._tokens) / self.qps)
                self._tokens = 1.0
                self._stamp = time.monotonic()
            self._tokens -= 1
