"""The hostile tenant's attacks on what only an administrator may do to the queue as a whole
(``chaos/tenant_release.py``): every try is a server-side dry run on the right object, a refusal
is recorded as refused and an acceptance as a breach (docs/operations.md#uninstall)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from chaos import tenant_release as release
from chaos.tenant_common import Sent
from koord_queue.shared import kube


class FakeKube:
    """Notes each request instead of sending it."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, dict[str, Any]]] = []

    async def request(self, method: str, path: str, **kw: Any) -> kube.Obj:
        self.sent.append((method, path, kw))
        return {}


class FakeAttacker:
    def __init__(self, answer: str) -> None:
        self.mallory = FakeKube()
        self.answer = answer
        self.records: list[tuple[str, str, str]] = []

    def record(
        self, attack: str, r: int, target: str, outcome: str, detail: str, seconds: float | None = None
    ) -> None:
        self.records.append((attack, target, outcome))

    async def send(self, call: Callable[[], Awaitable[kube.Obj]], *, rbac_allows: bool = True) -> Sent:
        assert not rbac_allows
        await call()
        return Sent(self.answer, message="forbidden")


def run(answer: str) -> FakeAttacker:
    t = FakeAttacker(answer)
    asyncio.run(release.release_attacks(t, 1))  # type: ignore[arg-type]
    return t


def test_every_try_is_a_dry_run_on_an_admin_object() -> None:
    t = run("refused")
    paths = [(method, path) for method, path, _ in t.mallory.sent]
    assert paths == [
        ("PATCH", "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/koord-queue/queues/chaos-mallory"),
        ("DELETE", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/koord-queue"),
        (
            "DELETE",
            "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/koord-queue-admission-gate",
        ),
        ("PATCH", "/apis/apps/v1/namespaces/koord-queue/deployments/koord-queue-reconciler"),
    ]
    assert all(kw["query"] == {"dryRun": "All"} for _, _, kw in t.mallory.sent)
    assert t.mallory.sent[0][2]["body"] == {"metadata": {"annotations": {"koord-queue/stopped": "true"}}}
    assert {outcome for _, _, outcome in t.records} == {"refused"}


def test_an_accepted_try_is_a_breach() -> None:
    t = run("accepted")
    assert [a for a, _, outcome in t.records if outcome == "SUCCEEDED"] == [
        release.STOP,
        release.OUT_OF_THE_WAY,
        release.OUT_OF_THE_WAY,
        release.OUT_OF_THE_WAY,
    ]


def test_the_attacks_are_in_the_report() -> None:
    from chaos.tenant import ATTACKS

    assert set(release.ATTACKS) <= set(ATTACKS)
