"""The harness's watch record (``tests.kube.Recorder``) is only read once it has caught up.

A test that waited on something else (kubectl, a GET) and then reads a watch's record races that
watch; these tests hold the record to its promise on a real etcd and kube-apiserver: after
``sync`` it has the API's current version of every object and every deletion, after ``until`` the
version asked for, and leaving the block leaves nothing out. Secrets are the resource because no
controller runs in the integration control plane to write them behind the test's back.
"""

from __future__ import annotations

import json

import pytest

from koord_queue.shared import kube as kq
from testenv.cluster import LocalCluster
from tests import kube

pytestmark = pytest.mark.integration


def kubectl_json(cluster: LocalCluster, *args: str) -> dict[str, object]:
    out: dict[str, object] = json.loads(kube.kubectl(cluster, *args, "-o", "json").stdout)
    return out


def secret(name: str, value: str) -> str:
    return json.dumps(
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": {"v": value}}
    )


async def test_sync_holds_every_current_version_and_every_deletion_made_while_the_loop_was_blocked(
    integration_cluster: LocalCluster, namespace_in: str
) -> None:
    cluster, ns = integration_cluster, namespace_in
    async with kube.Recorder(cluster, kq.SECRETS, namespace=ns) as record:
        # kubectl runs synchronously: the event loop, and with it the watch, is blocked throughout.
        for i in range(8):
            kube.kubectl(cluster, "apply", "-n", ns, "-f", "-", input_text=secret(f"s{i}", "one"))
        for i in range(0, 8, 2):
            kube.kubectl(cluster, "apply", "-n", ns, "-f", "-", input_text=secret(f"s{i}", "two"))
        for i in range(0, 8, 4):
            kube.kubectl(cluster, "delete", "-n", ns, "secret", f"s{i}")
        await record.sync()
        listed = kubectl_json(cluster, "get", "secrets", "-n", ns)["items"]
        assert isinstance(listed, list)
        for item in listed:
            name = item["metadata"]["name"]
            assert (
                record.versions(name)[-1]["metadata"]["resourceVersion"]
                == item["metadata"]["resourceVersion"]
            )
        deleted = sorted(o["metadata"]["name"] for kind, o in record.seen if kind == "DELETED")
        assert deleted == ["s0", "s4"]
        # Each object's versions in etcd order: created, then changed, then (for some) deleted.
        assert [len(record.versions(f"s{i}")) for i in range(8)] == [3, 1, 2, 1, 3, 1, 2, 1]


async def test_until_returns_the_first_matching_version_and_names_the_history_when_none_comes(
    integration_cluster: LocalCluster, namespace_in: str
) -> None:
    cluster, ns = integration_cluster, namespace_in
    async with kube.Recorder(cluster, kq.SECRETS, namespace=ns) as record:
        kube.kubectl(cluster, "apply", "-n", ns, "-f", "-", input_text=secret("s", "one"))
        kube.kubectl(cluster, "apply", "-n", ns, "-f", "-", input_text=secret("s", "two"))
        kube.kubectl(cluster, "apply", "-n", ns, "-f", "-", input_text=secret("s", "three"))
        second = await record.until("s", lambda o: o.get("data", {}).get("v") == "dHdv", what="v=two")
        assert second is record.versions("s")[1]
        with pytest.raises(AssertionError, match="waiting for s: v=four in the watch"):
            await record.until(
                "s", lambda o: o.get("data", {}).get("v") == "Zm91cg==", what="v=four", timeout=1
            )


async def test_leaving_the_block_records_what_was_written_just_before(
    integration_cluster: LocalCluster, namespace_in: str
) -> None:
    cluster, ns = integration_cluster, namespace_in
    async with kube.Recorder(cluster, kq.SECRETS, namespace=ns) as record:
        for i in range(5):
            kube.kubectl(cluster, "apply", "-n", ns, "-f", "-", input_text=secret("last", str(i)))
    current = kubectl_json(cluster, "get", "secret", "last", "-n", ns)
    assert (
        record.versions("last")[-1]["metadata"]["resourceVersion"] == current["metadata"]["resourceVersion"]
    )
    assert len(record.versions("last")) == 5


async def test_sync_does_not_wait_for_objects_untouched_since_the_record_began_but_for_their_deletion(
    integration_cluster: LocalCluster, namespace_in: str
) -> None:
    cluster, ns = integration_cluster, namespace_in
    for name in ("before", "kept"):
        kube.kubectl(cluster, "apply", "-n", ns, "-f", "-", input_text=secret(name, "one"))
    async with kube.Recorder(cluster, kq.SECRETS, namespace=ns) as record:
        await record.sync(timeout=10)  # holds "kept" and "before" without a change to either
        assert record.seen == []
        kube.kubectl(cluster, "delete", "-n", ns, "secret", "before")
        await record.sync(timeout=10)
        assert [(kind, o["metadata"]["name"]) for kind, o in record.seen] == [("DELETED", "before")]
