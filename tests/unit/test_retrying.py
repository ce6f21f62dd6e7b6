"""The retry policies keep the schedules the hand-written loops had (docs/architecture.md#retries),
and no product module computes a back-off of its own any more.

Each wait is checked against the formula the loop it replaced used; the runs go through a fake
``shared.retrying.sleep`` that records the waits instead of taking them.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Final

import pytest
from tenacity import AsyncRetrying, RetryCallState

from koord_queue.shared import kube, retrying
from tests.unit import retry_waits

ROOT: Final = Path(__file__).resolve().parents[2]
#: the product's folders; the pure decision modules that compute user-facing requeue times (not
#: retries) are left out by name
PRODUCT: Final = ("shared", "webhook", "reconciler", "certs")
NOT_RETRIES: Final = ("shared/api/conditions.py", "shared/jobs/running_timeout.py")

TRANSPORT = kube.KubeError(0, "ClientConnectorError", "connection refused")
UNAVAILABLE = kube.KubeError(503, "ServiceUnavailable", "etcd leader changed")
NOT_FOUND = kube.NotFound(404, "NotFound", "gone")
CONFLICT = kube.Conflict(409, "Conflict", "the object has been modified")


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    return retry_waits.record(monkeypatch, limit=100)


def wait_at(policy_wait: object, attempt: int) -> float:
    state = RetryCallState(retry_object=AsyncRetrying(), fn=None, args=(), kwargs={})
    state.attempt_number = attempt
    assert callable(policy_wait)
    result = policy_wait(state)
    assert isinstance(result, float | int)
    return float(result)


async def run(policy: AsyncRetrying, errors: list[BaseException]) -> int:
    """Run ``policy`` over a call that raises ``errors`` in turn, then succeeds; returns the tries."""
    tries = 0
    async for attempt in policy:
        with attempt:
            tries += 1
            if errors:
                raise errors.pop(0)
    return tries


# --- the schedules -------------------------------------------------------------------------------


@pytest.mark.parametrize("u", [0.5, 0.6, 0.75, 0.99, 1.0])
def test_the_watch_backoff_is_the_informers_equal_jitter_capped_at_10s(
    monkeypatch: pytest.MonkeyPatch, u: float
) -> None:
    # today's loop: delay = min(10.0, 0.2 * 2 ** min(attempt, 10)) * random.uniform(0.5, 1.0)
    # tenacity draws uniform(0, h) for the random half; map that draw onto the old factor u.
    monkeypatch.setattr(random, "uniform", lambda low, high: low + (2 * u - 1) * (high - low))
    for attempt in range(1, 30):
        before = min(10.0, 0.2 * 2 ** min(attempt, 10)) * u
        assert wait_at(retrying.WATCH_WAIT, attempt) == pytest.approx(before), attempt
    assert wait_at(retrying.WATCH_WAIT, 1) == pytest.approx(0.4 * u)
    assert wait_at(retrying.WATCH_WAIT, 60) == pytest.approx(10.0 * u)


def test_the_watch_backoff_jitters_between_half_and_all_of_its_step() -> None:
    draws = [wait_at(retrying.WATCH_WAIT, 4) for _ in range(500)]
    assert 1.6 <= min(draws) < 1.8 and 3.0 < max(draws) <= 3.2  # step 3.2 s: within [1.6, 3.2]


def test_the_outcome_backoff_doubles_from_half_a_second_to_4s() -> None:
    for attempt in range(1, 30):
        before = min(0.25 * 2 ** min(attempt, 5), 4.0)  # today's loop
        assert wait_at(retrying.OUTCOME_WAIT, attempt) == before, attempt


# --- what is retried, and what is not ----------------------------------------------------------


async def test_the_watch_backoff_retries_api_errors_but_not_a_missing_kind(waits: list[float]) -> None:
    seen: list[int] = []
    policy = retrying.watch_backoff(lambda state: seen.append(state.attempt_number))
    assert await run(policy, [TRANSPORT, UNAVAILABLE, kube.KubeError(403, "Forbidden", "")]) == 4
    assert seen == [1, 2, 3] and len(waits) == 3
    with pytest.raises(kube.NotFound):
        await run(retrying.watch_backoff(lambda state: None), [TRANSPORT, NOT_FOUND])
    with pytest.raises(ValueError):
        await run(retrying.watch_backoff(lambda state: None), [ValueError("a bug")])
    assert len(waits) == 4  # one more, before the NotFound; none for the bug


async def test_start_over_makes_the_next_failure_wait_like_the_first(
    waits: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(random, "uniform", lambda low, high: high)
    tries = 0
    async for attempt in retrying.watch_backoff(lambda state: None):
        with attempt:
            tries += 1
            if tries == 4:
                retrying.start_over(attempt.retry_state)  # a watch event arrived
            if tries < 6:
                raise TRANSPORT
    assert waits == pytest.approx([0.4, 0.8, 1.6, 0.4, 0.8])


async def test_the_outcome_backoff_never_gives_up_and_stops_at_not_found(waits: list[float]) -> None:
    assert await run(retrying.outcome_backoff(), [UNAVAILABLE] * 40) == 41
    assert waits == [min(0.5 * 2**i, 4.0) for i in range(40)]
    with pytest.raises(kube.NotFound):
        await run(retrying.outcome_backoff(), [TRANSPORT, NOT_FOUND])


async def test_steady_waits_the_same_each_time_and_retries_only_what_it_names(waits: list[float]) -> None:
    assert await run(retrying.steady(2.0, lambda state: None), [TRANSPORT, CONFLICT, NOT_FOUND]) == 4
    assert waits == [2.0, 2.0, 2.0]
    with pytest.raises(kube.Conflict):
        await run(retrying.steady(30.0, lambda state: None, errors=kube.NotFound), [NOT_FOUND, CONFLICT])
    assert waits == [2.0, 2.0, 2.0, 30.0]


async def test_a_conflict_is_sent_again_at_once_and_nothing_else_is(waits: list[float]) -> None:
    assert await run(retrying.on_conflict(3), [CONFLICT, CONFLICT]) == 3
    with pytest.raises(kube.Conflict):
        await run(retrying.on_conflict(3), [CONFLICT] * 3)
    assert await run(retrying.on_conflict(), [CONFLICT] * 50) == 51
    with pytest.raises(kube.KubeError):
        await run(retrying.on_conflict(), [UNAVAILABLE])
    assert set(waits) == {0.0}


async def test_before_sleep_sees_the_failure_and_the_wait(waits: list[float]) -> None:
    told: list[tuple[BaseException | None, float]] = []
    policy = retrying.steady(1.0, lambda state: told.append((retrying.failure(state), retrying.delay(state))))
    await run(policy, [UNAVAILABLE])
    assert told == [(UNAVAILABLE, 1.0)]


# --- no back-off by hand -----------------------------------------------------------------------

#: an exponential by hand (``2 **``, ``** attempt``, ``math.pow``/``exp2``) near a sleep or a timer
HAND_BACKOFF: Final = re.compile(r"2 \*\*|\*\* *\(?(attempt|tries|retries|n)\b|math\.(pow|exp2)\(")
WAITS: Final = re.compile(r"\bsleep\(|call_later\(|wait_for\(")


def product_files() -> list[Path]:
    files = [path for folder in PRODUCT for path in sorted((ROOT / folder).rglob("*.py"))]
    return [path for path in files if str(path.relative_to(ROOT)) not in NOT_RETRIES]


def test_no_product_module_computes_a_backoff_by_hand() -> None:
    found = []
    for path in product_files():
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines):
            if not HAND_BACKOFF.search(line.split("#", 1)[0]):
                continue
            near = lines[max(0, number - 8) : number + 9]
            if any(WAITS.search(other) for other in near):
                found.append(f"{path.relative_to(ROOT)}:{number + 1}: {line.strip()}")
    assert not found, "use a policy of shared/retrying.py (docs/architecture.md#retries):\n" + "\n".join(
        found
    )


def test_the_hand_backoff_check_finds_the_loops_it_replaced() -> None:
    informer = "delay = min(10.0, 0.2 * 2 ** min(attempt, 10)) * random.uniform(0.5, 1.0)"
    writes = "await asyncio.sleep(min(0.25 * 2 ** min(attempt, 5), 4.0))"
    assert HAND_BACKOFF.search(informer) and HAND_BACKOFF.search(writes) and WAITS.search(writes)
    assert any(path.name == "informer.py" for path in product_files())
    assert not any(str(path).endswith(NOT_RETRIES) for path in product_files())
