"""The pure half of the reconciler's metrics access check (shared/core/access.py,
docs/operations.md#metrics): reading the header, the review bodies and answers, and the verdict
cache. The reviews against a real API server are in tests/e2e/test_metrics.py."""

from __future__ import annotations

import pytest

from koord_queue.shared.core import access


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc.def", "abc.def"),
        ("bearer   abc ", "abc"),
        (None, None),
        ("", None),
        ("Basic dXNlcjpwYXNz", None),
        ("Bearer", None),
        ("Bearer a b", None),
    ],
)
def test_bearer_token(header: str | None, token: str | None) -> None:
    assert access.bearer_token(header) == token


def test_reviews_carry_the_user_and_the_url() -> None:
    answer = {
        "status": {
            "authenticated": True,
            "user": {
                "username": "system:serviceaccount:monitoring:prometheus",
                "uid": "u-1",
                "groups": ["system:serviceaccounts", "system:authenticated"],
                "extra": {"authentication.kubernetes.io/pod-name": ["prom-0"]},
            },
        }
    }
    user = access.reviewed_user(answer)
    assert user is not None and user.username.endswith(":prometheus")
    review = access.access_review(user)
    assert review["kind"] == "SubjectAccessReview"
    assert review["spec"] == {
        "user": "system:serviceaccount:monitoring:prometheus",
        "uid": "u-1",
        "groups": ["system:serviceaccounts", "system:authenticated"],
        "extra": {"authentication.kubernetes.io/pod-name": ["prom-0"]},
        "nonResourceAttributes": {"path": "/metrics", "verb": "get"},
    }
    assert access.token_review("t") == {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": "t"},
    }


@pytest.mark.parametrize(
    "status",
    [
        {},
        {"authenticated": False, "user": {"username": "x"}},
        {"authenticated": "true", "user": {"username": "x"}},
        {"authenticated": True, "user": {}},
        {"authenticated": True},
    ],
)
def test_a_token_not_plainly_accepted_names_no_user(status: dict[str, object]) -> None:
    assert access.reviewed_user({"status": status}) is None


def test_only_an_allowed_and_not_denied_review_allows() -> None:
    user = access.UserInfo("alice")
    assert access.access_verdict(user, {"status": {"allowed": True}}).outcome is access.Outcome.ALLOWED
    for status in ({}, {"allowed": False}, {"allowed": True, "denied": True}, {"allowed": "yes"}):
        verdict = access.access_verdict(user, {"status": status})
        assert verdict.outcome is access.Outcome.FORBIDDEN and "alice" in verdict.reason


def test_the_cache_keeps_verdicts_briefly_and_is_bounded() -> None:
    cache = access.VerdictCache(allowed_ttl_s=60, denied_ttl_s=10, max_entries=3)
    allowed = access.Verdict(access.Outcome.ALLOWED, "ok")
    forbidden = access.Verdict(access.Outcome.FORBIDDEN, "no")
    cache.put("a", allowed, now=0)
    cache.put("f", forbidden, now=0)
    assert cache.get("a", now=59) is allowed and cache.get("f", now=9) is forbidden
    assert cache.get("f", now=10) is None and cache.get("a", now=60) is None
    assert len(cache) == 0
    cache.put("scraper", allowed, now=100)
    for i in range(10):  # a flood of fresh tokens
        cache.put(f"t{i}", forbidden, now=100)
    assert cache.get("t9", now=100) is forbidden and cache.get("t0", now=100) is None
    # Refusals evict refusals only: the scraper's allowed verdict outlives the flood.
    assert len(cache) == 4 and cache.get("scraper", now=100) is allowed
    # A verdict that changes kind moves: the old one does not linger in the other map.
    cache.put("scraper", forbidden, now=101)
    assert cache.get("scraper", now=101) is forbidden and len(cache) == 3  # 3 refusals at most
    cache.put("busy", access.TOO_MANY, now=101)  # never cached: the next try may review
    assert cache.get("busy", now=101) is None


def test_the_review_budget_refills_at_its_rate_and_never_waits() -> None:
    budget = access.ReviewBudget(rate=10, burst=3)
    assert [budget.take(now=0) for _ in range(4)] == [True, True, True, False]
    assert budget.take(now=0.05) is False  # half a review refilled
    assert budget.take(now=0.1) is True
    assert [budget.take(now=100) for _ in range(4)] == [True, True, True, False]  # capped at the burst


def test_the_cache_key_is_not_the_token() -> None:
    key = access.token_digest("secret-token")
    assert "secret-token" not in key and key == access.token_digest("secret-token")
