"""The servers' retry policies, built from tenacity (docs/architecture.md#retries).

Every retry and back-off of the webhook, the reconciler and the certificate manager is one of these
policies; none is written out by hand (``tests/unit/test_retrying.py`` checks both). Each policy says
which errors it retries, how long it waits between tries and when it gives up; the caller says what
is logged before each wait (``before_sleep``), since only it knows what failed.

Only the servers import this module: tenacity is a server dependency, and the kubectl plugin, which
shares ``shared.kube`` with them, must run without it (``tests/unit/test_import_root.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    retry_if_not_exception_type,
    stop_after_attempt,
    stop_never,
    wait_exponential,
    wait_fixed,
    wait_none,
    wait_random_exponential,
)
from tenacity.wait import wait_base

from koord_queue.shared import kube

BeforeSleep = Callable[[RetryCallState], Awaitable[None] | None]

#: A list or watch that failed in transit: ``d = min(10, 0.4 * 2 ** (n - 1))`` seconds before try
#: ``n + 1``, scaled by a random factor in ``[0.5, 1)`` ("equal jitter": half of ``d`` fixed, half
#: random), so informers that lost the same apiserver do not come back in step: the fixed half
#: (``wait_exponential``) plus a uniform draw of up to as much again (``wait_random_exponential``).
WATCH_WAIT = wait_exponential(multiplier=0.2, max=5.0) + wait_random_exponential(multiplier=0.2, max=5.0)

#: Reading back an admission whose write failed in transit: 0.5, 1, 2, then every 4 seconds.
OUTCOME_WAIT = wait_exponential(multiplier=0.5, max=4.0)


async def sleep(seconds: float) -> None:
    """Every policy's wait: one name for tests to replace, so they count the waits without taking
    them (the policies look it up at each wait, hence their ``lambda``)."""
    await asyncio.sleep(seconds)


def failure(state: RetryCallState) -> BaseException | None:
    """The error of the try that just failed (for ``before_sleep`` messages)."""
    return state.outcome.exception() if state.outcome is not None else None


def delay(state: RetryCallState) -> float:
    """The wait before the next try (for ``before_sleep`` messages)."""
    return state.next_action.sleep if state.next_action is not None else 0.0


def _until_not_found(wait: wait_base, before_sleep: BeforeSleep | None) -> AsyncRetrying:
    """Every API error but ``NotFound`` retried for ever, ``wait`` apart."""
    return AsyncRetrying(
        sleep=lambda seconds: sleep(seconds),
        retry=retry_if_exception_type(kube.KubeError) & retry_if_not_exception_type(kube.NotFound),
        wait=wait,
        stop=stop_never,
        before_sleep=before_sleep,
    )


def watch_backoff(before_sleep: BeforeSleep) -> AsyncRetrying:
    """An informer's list and watch (``reconciler/informer.py``): every API error but ``NotFound``
    (a kind that is not installed, which the caller waits for at a steady pace) is retried for ever
    with :data:`WATCH_WAIT`. The caller starts the count again when a watch event arrives
    (:func:`start_over`)."""
    return _until_not_found(WATCH_WAIT, before_sleep)


def start_over(state: RetryCallState) -> None:
    """The call is working again (a watch delivered an event): its next failure waits as long as the
    first one."""
    state.attempt_number = 1


def outcome_backoff(before_sleep: BeforeSleep | None = None) -> AsyncRetrying:
    """Reading back a write whose fate is unknown: every API error but ``NotFound`` (the object is
    gone, which answers the question) is retried for ever with :data:`OUTCOME_WAIT`; no limit, since
    a limit would turn "unknown" into "not written"."""
    return _until_not_found(OUTCOME_WAIT, before_sleep)


def steady(
    seconds: float,
    before_sleep: BeforeSleep,
    *,
    errors: type[BaseException] | tuple[type[BaseException], ...] = kube.KubeError,
) -> AsyncRetrying:
    """Retry ``errors`` (by default every API error) for ever, ``seconds`` apart: for work that must
    be done before anything else makes sense (publishing a ConfigMap the webhook reads, issuing the
    serving certificate) and whose failure says nothing about how long to wait."""
    return AsyncRetrying(
        sleep=lambda seconds: sleep(seconds),
        retry=retry_if_exception_type(errors),
        wait=wait_fixed(seconds),
        stop=stop_never,
        before_sleep=before_sleep,
    )


def on_conflict(attempts: int | None = None) -> AsyncRetrying:
    """Send an optimistic write again at once after a ``409 Conflict``, ``attempts`` times in all
    (``None``: until it lands). The try itself re-reads what it needs: a conflict means someone else
    wrote first, and waiting would not make our copy any fresher. Other errors are not retried; after
    the last conflict, that ``Conflict`` is raised."""
    return AsyncRetrying(
        sleep=lambda seconds: sleep(seconds),
        retry=retry_if_exception_type(kube.Conflict),
        wait=wait_none(),
        stop=stop_never if attempts is None else stop_after_attempt(attempts),
        reraise=True,
    )
