"""The API client's credentials against the real kube-apiserver (docs/development.md#api-client).

A kubeconfig whose user is an ``exec`` credential plugin (a script printing an ExecCredential that
holds a real ServiceAccount token from the TokenRequest API) drives the real ``kubectl koord-queue``,
which then acts as that ServiceAccount and only as it: its namespace is listed, every namespace is
refused by RBAC for that user. The pod's view (``KUBERNETES_SERVICE_HOST``/``PORT``, the mounted
token and CA) is rebuilt in a directory and the API server says who we are. A whole plugin command
runs without importing kubernetes-asyncio; leader election's kubernetes-asyncio client, built on
demand, carries the same credentials.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from koord_queue.shared import kube, kubeconfig
from koord_queue.shared.api import names
from testenv import binaries, scraping
from testenv.cluster import LocalCluster
from tests import kube as kube_harness

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
SELF_REVIEWS = kube.Resource(
    "authentication.k8s.io", "v1", "selfsubjectreviews", "SelfSubjectReview", namespaced=False
)


def exec_kubeconfig(cluster: LocalCluster, directory: Path, token: str) -> Path:
    """A kubeconfig whose user is an exec plugin (a script in ``directory``) handing out ``token``."""
    script = directory / "credential-plugin"
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {"token": token},
    }
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{json.dumps(credential)}\nEOF\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    config["users"] = [
        {
            "name": "sa",
            "user": {
                "exec": {
                    "apiVersion": "client.authentication.k8s.io/v1",
                    "command": "./credential-plugin",  # relative to the kubeconfig
                    "interactiveMode": "Never",
                }
            },
        }
    ]
    config["contexts"][0]["context"]["user"] = "sa"
    path = directory / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def plugin(kubeconfig_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "NO_COLOR": "1"}
    command = [str(binaries.kubectl()), "koord-queue", f"--kubeconfig={kubeconfig_path}", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=60, check=False)


async def who(client: kube.Kube) -> str:
    review = await client.create(
        SELF_REVIEWS, {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    )
    return str(review["status"]["userInfo"]["username"])


async def test_the_plugin_lists_as_the_service_account_an_exec_plugin_names(
    integration_cluster: LocalCluster, namespace_in: str, tmp_path: Path
) -> None:
    token = scraping.service_account_token(integration_cluster, namespace_in, "lister")
    user = f"system:serviceaccount:{namespace_in}:lister"
    reader = {"apiGroups": [names.GROUP], "resources": ["queueunits"], "verbs": ["get", "list"]}
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "rules": [reader]}
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "lister"},
        "subjects": [{"kind": "ServiceAccount", "name": "lister", "namespace": namespace_in}],
    }
    docs = [{**doc, "metadata": {"name": "lister", "namespace": namespace_in}} for doc in (role, binding)]
    kube_harness.kubectl(integration_cluster, "apply", "-f", "-", input_text=yaml.safe_dump_all(docs))
    path = exec_kubeconfig(integration_cluster, tmp_path, token)

    mine = plugin(path, "list", "-n", namespace_in, "-o", "json")
    assert mine.returncode == 0, mine.stderr
    assert json.loads(mine.stdout)["items"] == []
    everywhere = plugin(path, "list", "-A")
    assert everywhere.returncode == 4, everywhere.stderr
    assert 'verb "list" on resource "queueunits"' in everywhere.stderr

    client = await kube.Kube.connect(kubeconfig=str(path))
    try:
        assert await who(client) == user
        # leader election's client, built on demand, asks the same plugin
        from kubernetes_asyncio import client as k8s

        review = await k8s.AuthenticationV1Api(client.api_client).create_self_subject_review(
            k8s.V1SelfSubjectReview(api_version="authentication.k8s.io/v1", kind="SelfSubjectReview")
        )
        assert review.status.user_info.username == user
    finally:
        await client.close()


async def test_in_cluster_credentials_from_the_mounted_files(
    integration_cluster: LocalCluster, namespace_in: str, tmp_path: Path
) -> None:
    token = scraping.service_account_token(integration_cluster, namespace_in, "in-pod")
    (tmp_path / "token").write_text(token)
    (tmp_path / "ca.crt").write_bytes(integration_cluster.ca_pem)
    env = {
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(integration_cluster.apiserver_port),
    }
    settings = await kubeconfig.load(None, environ=env, service_account_dir=tmp_path)
    client = kube.Kube(settings, qps=0, burst=1, user_agent="test")
    try:
        assert await who(client) == f"system:serviceaccount:{namespace_in}:in-pod"
    finally:
        await client.close()


def test_a_whole_plugin_command_does_not_import_kubernetes_asyncio(integration_cluster: LocalCluster) -> None:
    probe = textwrap.dedent(
        f"""
        import io, json, sys
        from koord_queue.cli.main import main
        out = io.StringIO()
        args = ["--kubeconfig", {str(integration_cluster.kubeconfig)!r}, "list", "-A", "-o", "json"]
        status = main(args, out=out)
        assert status == 0, status
        json.loads(out.getvalue())
        loaded = sorted(m for m in sys.modules if m.startswith("kubernetes_asyncio"))
        assert not loaded, loaded
        """
    )
    answer: Any = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert answer.returncode == 0, answer.stderr
