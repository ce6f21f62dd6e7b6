"""The install namespace is honoured everywhere (docs/operations.md#install-namespace): the pure
decisions, the flags of both processes and of the plugin, the plugin's reads and writes, and the
manifests that tell the processes where they run. The real control plane side is
tests/e2e/test_install_namespace.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from koord_queue.cli import client as cli_client
from koord_queue.cli import completion
from koord_queue.cli import main as cli_main
from koord_queue.reconciler import main as reconciler_main
from koord_queue.reconciler.quotas import QUEUES, QuotaBindingSync, QuotaQueueSync
from koord_queue.shared import kube
from koord_queue.shared.api import names
from koord_queue.shared.core import mandatory
from koord_queue.webhook import main as webhook_main
from testenv import system

HOME = "platform-queue"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_outside_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sets the environment it is about; none inherits one from the shell."""
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    monkeypatch.delenv(cli_client.NAMESPACE_ENV, raising=False)


# --- the core ----------------------------------------------------------------------------------


def test_the_install_namespace_is_never_one_where_queueing_is_mandatory() -> None:
    queueing = mandatory.MandatoryQueueing(enabled=True, component_namespace=HOME)
    assert mandatory.excluded_namespaces(HOME) == {"kube-system", HOME}
    assert not queueing.applies(HOME, {})
    assert not queueing.applies("kube-system", {})
    # Installed elsewhere, a namespace that happens to be called koord-queue is an ordinary one.
    assert queueing.applies(names.COMPONENT_NAMESPACE, {})
    assert not mandatory.MandatoryQueueing(enabled=True).applies(names.COMPONENT_NAMESPACE, {})


# --- the reconciler ----------------------------------------------------------------------------


def test_the_reconciler_follows_its_pods_namespace_into_every_namespace_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("POD_NAMESPACE", HOME)
    args = reconciler_main.parse_args([])
    assert args.namespace == HOME
    assert args.visibility_namespace == args.leader_election_namespace == args.webhook_namespace == HOME
    # The mandatory-queueing rule leaves that namespace out.
    assert reconciler_main._settings(args).mandatory_queueing.component_namespace == HOME


def test_the_reconciler_flag_wins_over_the_pod_namespace_and_each_flag_over_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "ignored")
    args = reconciler_main.parse_args([f"--namespace={HOME}", "--leader-election-namespace=leases"])
    assert args.namespace == args.visibility_namespace == args.webhook_namespace == HOME
    assert args.leader_election_namespace == "leases"
    assert reconciler_main.parse_args([]).namespace == "ignored"
    monkeypatch.delenv("POD_NAMESPACE")
    assert reconciler_main.parse_args([]).namespace == names.COMPONENT_NAMESPACE


class Recording:
    """An API client that answers every read with nothing and records where each request went."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str | None]] = []

    async def list(self, res: kube.Resource, namespace: str | None = None, **_: Any) -> tuple[list[Any], str]:
        self.calls.append(("list", res.plural, namespace))
        return [], "1"

    async def get(self, res: kube.Resource, name: str, namespace: str | None = None, **_: Any) -> kube.Obj:
        self.calls.append(("get", res.plural, namespace))
        raise kube.NotFound(404, "NotFound", f"{name} not found")

    async def create(self, res: kube.Resource, body: kube.Obj, namespace: str | None = None) -> kube.Obj:
        self.calls.append(("create", res.plural, namespace))
        assert body["metadata"].get("namespace", namespace) == namespace
        return body

    async def patch(
        self, res: kube.Resource, name: str, patch: kube.Obj, namespace: str | None = None, **_: Any
    ) -> kube.Obj:
        self.calls.append(("patch", res.plural, namespace))
        return {"metadata": {"name": name, "namespace": namespace}}

    async def delete(self, res: kube.Resource, name: str, namespace: str | None = None, **_: Any) -> None:
        self.calls.append(("delete", res.plural, namespace))


class NoEvents:
    def record(self, *args: Any, **kwargs: Any) -> None:
        pass


def quota(name: str, namespace: str) -> kube.Obj:
    return {
        "apiVersion": names.QUOTA_API_VERSION,
        "kind": "ElasticQuota",
        "metadata": {"name": name, "namespace": namespace, "uid": f"{namespace}-{name}"},
        "spec": {"min": {"cpu": "1"}, "max": {"cpu": "1"}},
    }


def test_the_queue_of_a_quota_is_created_and_looked_for_in_the_install_namespace() -> None:
    api = Recording()
    team = quota("team-a", "team-a")
    queues: dict[str, kube.Obj] = {}
    sync = QuotaQueueSync(
        api,  # type: ignore[arg-type]
        quotas=lambda: {"team-a/team-a": team},
        queues=lambda: queues,
        events=NoEvents(),  # type: ignore[arg-type]
        namespace=HOME,
    )
    assert sync.missing_queues() == ["team-a"]
    asyncio.run(sync.sync("team-a"))
    assert ("create", names.QUEUE_PLURAL, HOME) in api.calls
    assert all(ns == HOME for _, plural, ns in api.calls if plural == names.QUEUE_PLURAL), api.calls
    # A Queue of that name in another namespace (a tenant's) does not count as the quota's Queue.
    queues[f"{names.COMPONENT_NAMESPACE}/team-a"] = {"metadata": {"name": "team-a"}}
    assert sync.missing_queues() == ["team-a"]
    queues[f"{HOME}/team-a"] = {"metadata": {"name": "team-a", "namespace": HOME}}
    assert sync.missing_queues() == []


def test_the_quota_binding_configmap_is_written_in_the_install_namespace() -> None:
    api = Recording()
    sync = QuotaBindingSync(api, quotas=lambda: [], enforce=True, namespace=HOME)  # type: ignore[arg-type]
    asyncio.run(sync.sync())
    assert api.calls and all(ns == HOME for _, _, ns in api.calls), api.calls


# --- the webhook -------------------------------------------------------------------------------


def test_the_webhook_lets_only_the_reconciler_of_its_own_namespace_resume_jobs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config, _ = webhook_main.parse_config([])
    assert config.admission.reconciler_username == names.reconciler_username(names.COMPONENT_NAMESPACE)
    monkeypatch.setenv("POD_NAMESPACE", HOME)
    config, _ = webhook_main.parse_config([])
    assert config.admission.reconciler_username == f"system:serviceaccount:{HOME}:koord-queue-reconciler"
    config, _ = webhook_main.parse_config(["--reconciler-username=someone"])
    assert config.admission.reconciler_username == "someone"


# --- the manifests -----------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["manifests/reconciler.yaml", "manifests/webhook.yaml"])
def test_both_deployments_are_told_their_namespace_by_the_downward_api(path: str) -> None:
    docs = [d for d in yaml.safe_load_all((ROOT / path).read_text()) if d and d["kind"] == "Deployment"]
    assert len(docs) == 1
    container = docs[0]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container.get("env", [])}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    # No flag pins the namespace or the reconciler's username to koord-queue.
    assert not [a for a in container.get("args", []) if "koord-queue:" in a or a.startswith("--namespace")]


def test_the_local_system_moves_every_place_that_names_the_namespace() -> None:
    docs = [
        {
            "kind": "RoleBinding",
            "metadata": {"namespace": "koord-queue"},
            "subjects": [
                {"kind": "ServiceAccount", "name": "koord-queue-reconciler", "namespace": "koord-queue"}
            ],
        },
        {
            "kind": "ValidatingAdmissionPolicy",
            "spec": {
                "matchConditions": [
                    {
                        "expression": "request.userInfo.username != "
                        "'system:serviceaccount:koord-queue:koord-queue-reconciler'"
                    }
                ],
                "namespaceSelector": {
                    "matchExpressions": [
                        {
                            "key": "kubernetes.io/metadata.name",
                            "operator": "NotIn",
                            "values": ["kube-system", "koord-queue"],
                        }
                    ]
                },
                "paramRef": {"name": "koord-queue-quota-bindings", "namespace": "koord-queue"},
            },
        },
    ]
    moved = system.in_namespace(docs, HOME)
    assert moved[0]["metadata"]["namespace"] == moved[0]["subjects"][0]["namespace"] == HOME
    spec = moved[1]["spec"]
    assert HOME in spec["matchConditions"][0]["expression"] and ":koord-queue:" not in str(spec)
    assert spec["namespaceSelector"]["matchExpressions"][0]["values"] == ["kube-system", HOME]
    assert spec["paramRef"] == {"name": "koord-queue-quota-bindings", "namespace": HOME}
    assert system.in_namespace(docs, names.COMPONENT_NAMESPACE) == docs


# --- the plugin --------------------------------------------------------------------------------


def test_the_plugin_namespace_comes_from_the_flag_else_the_environment_else_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert cli_client.component_namespace(None) == names.COMPONENT_NAMESPACE
    monkeypatch.setenv(cli_client.NAMESPACE_ENV, "from-env")
    assert cli_client.component_namespace(None) == "from-env"
    assert cli_client.component_namespace(HOME) == HOME


@pytest.mark.parametrize(
    "argv",
    [
        ["--koord-queue-namespace", HOME, "list"],
        ["list", f"--koord-queue-namespace={HOME}"],
        ["stop", "team-a", "--koord-queue-namespace", HOME],
    ],
)
def test_the_plugin_flag_is_global(argv: list[str]) -> None:
    assert cli_main.parser().parse_args(argv).koord_queue_namespace == HOME


def test_the_plugin_help_names_the_flag_and_its_environment_variable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        cli_main.parser().parse_args(["--help"])
    text = capsys.readouterr().out
    assert "--koord-queue-namespace" in text and cli_client.NAMESPACE_ENV in text


def test_every_component_read_and_write_of_the_plugin_goes_to_the_install_namespace() -> None:
    api = Recording()
    reader = cli_client.Reader(api, HOME)  # type: ignore[arg-type]
    got = cli_client.Gathered()

    async def everything() -> None:
        await reader.queues(got)
        await reader.settings(got)
        await reader.server_version()
        await reader.patch_queue("team-a", {"metadata": {}})

    asyncio.run(everything())
    assert [c[:2] for c in api.calls] == [
        ("list", "queues"),
        ("get", "configmaps"),
        ("get", "deployments"),
        ("patch", "queues"),
    ]
    assert {ns for _, _, ns in api.calls} == {HOME}
    # The configuration's absence says where it was looked for, and how to look elsewhere.
    assert any(f"{HOME}/koord-queue-config not found" in u for u in got.unknowns)
    assert any("--koord-queue-namespace" in u for u in got.unknowns)


def test_completion_offers_the_flag_and_knows_it_takes_a_value() -> None:
    assert "--koord-queue-namespace" in completion.candidates(["--"])
    assert completion.candidates(["--koord-queue-namespace", ""]) == []
    assert completion._positional(["--koord-queue-namespace", HOME, "stop"]) == ["stop"]


def test_the_queue_resource_is_namespaced() -> None:
    """Guard for the above: a Queue path names its namespace, so a list in HOME is a list in HOME."""
    assert QUEUES.path(HOME) == f"/apis/{names.API_VERSION}/namespaces/{HOME}/queues"
