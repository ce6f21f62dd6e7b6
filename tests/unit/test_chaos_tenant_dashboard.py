"""The hostile tenant's attacks through the dashboard (``chaos/tenant_dashboard.py``, docs/dashboard.md):
the plugin's real server on a real socket, over plain HTTP with the session cookie, in front of a
stand-in API server that refuses a user outside her namespace as RBAC would. Every refusal is
refused; a dashboard that serves another namespace, or a guard that lets another origin write, is
a breach; a control request not served, or an API server failing, leaves the try unjudged.

What the real API server refuses is tried against the local control plane by the chaos run itself
(``make chaos QUICK=1``, RELIABILITY.md#hostile-tenant)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

from chaos import tenant_dashboard as dashboard
from chaos.tenant_common import NAMESPACE
from koord_queue.dashboard.guard import Guard
from koord_queue.shared import kube


class FakeApiServer:
    """Answers as the API server answers a user bound to ``allowed`` namespaces (None: all);
    nothing exists, so a read is empty and a unit looked for is not found."""

    def __init__(self, allowed: frozenset[str] | None, units: tuple[str, ...] = ()) -> None:
        self.allowed = allowed
        #: names the admin's list of the other namespace's QueueUnits answers (for the target)
        self.units = units

    def _check(self, path: str = "", namespace: str | None = None) -> None:
        found = re.search(r"/namespaces/([^/]+)/", path)
        ns = namespace or (found.group(1) if found else None)
        if self.allowed is not None and ns not in self.allowed:
            raise kube.KubeError(
                403,
                "Forbidden",
                'queueunits.scheduling.x-k8s.io is forbidden: User "mallory" cannot list resource '
                f'"queueunits" in API group "scheduling.x-k8s.io" in the namespace "{ns}"',
            )

    async def request(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        self._check(path)
        return {"items": [], "metadata": {"resourceVersion": "1"}}

    async def list(
        self, res: kube.Resource, *, namespace: str | None = None, **_: Any
    ) -> tuple[list[Any], str]:
        self._check(namespace=namespace)
        return [{"metadata": {"name": name}} for name in self.units], "1"

    async def get(self, res: kube.Resource, name: str, *, namespace: str | None = None, **_: Any) -> Any:
        self._check(namespace=namespace)
        raise kube.NotFound(404, "NotFound", f"{name} not found")

    async def watch(self, *_: Any, **__: Any) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        await asyncio.Event().wait()
        yield "BOOKMARK", {}


class FakeAttacker:
    def __init__(self, mallory: FakeApiServer, admin: FakeApiServer) -> None:
        self.mallory, self.admin = mallory, admin
        self.records: dict[str, tuple[str, str, str]] = {}

    def record(
        self, attack: str, r: int, target: str, outcome: str, detail: str, seconds: float | None = None
    ) -> None:
        self.records[attack] = (outcome, detail, target)

    async def _read(self, call: Any) -> Any:
        """As the tenant reads: a list answers its items."""
        result = await call()
        return result[0] if isinstance(result, tuple) else result


def run(mallory: frozenset[str] | None, units: tuple[str, ...] = ()) -> dict[str, tuple[str, str, str]]:
    t = FakeAttacker(FakeApiServer(mallory), FakeApiServer(None, units))
    asyncio.run(dashboard.dashboard_attacks(t, 0))  # type: ignore[arg-type]
    return t.records


def test_another_namespace_and_another_origin_are_refused() -> None:
    records = run(frozenset({NAMESPACE}))
    outcome, detail, _ = records[dashboard.READ_OTHER]
    assert outcome == "refused", detail
    assert detail == "page: 403, units: 403, one unit: 403, hold: 403"
    outcome, detail, _ = records[dashboard.CROSS_ORIGIN]
    assert outcome == "refused", detail
    assert "no cookie: 401" in detail and "her page's fetch: 403" in detail and "rebound Host: 403" in detail


def test_her_target_is_a_real_unit_of_the_other_namespace_when_there_is_one() -> None:
    assert run(frozenset({NAMESPACE}), ("borrow-0003-1", "borrow-0001-0"))[dashboard.READ_OTHER][2] == (
        f"{dashboard.OTHER_NAMESPACE} (unit borrow-0001-0)"
    )
    assert dashboard.NO_SUCH_JOB in run(frozenset({NAMESPACE}))[dashboard.READ_OTHER][2]


def test_a_dashboard_that_serves_another_namespace_is_a_breach() -> None:
    outcome, detail, _ = run(None)[dashboard.READ_OTHER]  # an API server that refuses her nothing
    assert outcome == "SUCCEEDED" and "page: 200" in detail


def test_a_guard_that_lets_another_origin_write_is_a_breach(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Guard, "origin_ok", lambda self, request: True)
    outcome, detail, _ = run(frozenset({NAMESPACE}))[dashboard.CROSS_ORIGIN]
    # The request without an Origin reached the API server as the admin (404: no such unit, nothing
    # held); her page's fetch is still refused, by its Sec-Fetch-Site.
    assert outcome == "SUCCEEDED" and "no Origin: 404" in detail and "her page's fetch: 403" in detail


def test_an_unserved_control_or_a_failing_api_server_decides_nothing() -> None:
    assert dashboard.judge({"page": 403}, refused=(403,), control=403)[0] == "skipped"
    assert dashboard.judge({"page": 403, "units": 502}, refused=(403,), control=200)[0] == "skipped"
    assert dashboard.judge({"page": 403, "units": 403}, refused=(403,), control=200)[0] == "refused"
    assert dashboard.judge({"page": 200}, refused=(403,), control=200)[0] == "SUCCEEDED"


def test_the_attacks_are_in_the_report() -> None:
    from chaos.tenant import ATTACKS

    assert set(dashboard.ATTACKS) <= set(ATTACKS)
