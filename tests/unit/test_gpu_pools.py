"""``KWOK_GPU_POOLS`` (testenv/pools.py): the pools ``make run``, the pool e2e tests and the pool
benchmark build, read from one string; and the node and profile objects made from them."""

from __future__ import annotations

import json

import pytest

from testenv import pools


def test_the_documented_example_reads_as_three_pools() -> None:
    got = pools.parse("h100:4x8:taint, a100:4x8,l4:4x4")
    assert got == (
        pools.Pool("h100", 4, 8, tainted=True),
        pools.Pool("a100", 4, 8),
        pools.Pool("l4", 4, 4),
    )
    assert [p.product for p in got] == ["NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB", "NVIDIA-L4"]
    assert got[0].total_gpus == 32 and got[0].root_quota == "h100-root"


def test_blank_is_no_pool_and_an_unknown_gpu_gets_a_product_of_its_name() -> None:
    assert pools.parse("") == () and pools.parse(" , ") == ()
    assert pools.parse("b200:1x8")[0].product == "NVIDIA-B200"


@pytest.mark.parametrize(
    "text",
    [
        "h100",
        "h100:4",
        "h100:4x",
        "h100:x8",
        "h100:4x8:tainted",
        "h100:4x8:taint:x",
        "H100:1x1",
        "a_b:1x1",
        "h100:1x1,h100:2x2",
        ":1x1",
    ],
)
def test_a_malformed_item_is_refused_by_name(text: str) -> None:
    with pytest.raises(ValueError, match=pools.ENV_VAR):
        pools.parse(text)


def test_a_tainted_pools_node_carries_labels_taint_and_gpus() -> None:
    pool = pools.Pool("h100", 2, 8, tainted=True)
    node = pools.node(pool, 1, cpu="32", memory="256Gi")
    meta = node["metadata"]
    assert meta["name"] == "kwok-h100-1"
    assert meta["annotations"]["kwok.x-k8s.io/node"] == "fake"  # kwok manages it
    assert meta["labels"][pools.PRODUCT_LABEL] == "NVIDIA-H100-80GB-HBM3"
    assert meta["labels"][pools.POOL_LABEL] == "h100"
    assert node["spec"]["taints"] == [
        {"key": pools.PRODUCT_LABEL, "value": "NVIDIA-H100-80GB-HBM3", "effect": "NoSchedule"}
    ]
    assert node["status"]["allocatable"] == {"cpu": "32", "memory": "256Gi", "pods": "110", pools.GPU: "8"}
    assert node["status"]["capacity"] == node["status"]["allocatable"]
    assert "taints" not in pools.node(pools.Pool("l4", 1, 4), 0, cpu="8", memory="32Gi")["spec"]


def test_the_profile_selects_the_pools_nodes_and_counts_gpus() -> None:
    pool = pools.Pool("a100", 4, 8)
    body = pools.profile(pool)
    assert body["kind"] == "ElasticQuotaProfile" and body["apiVersion"] == "quota.koordinator.sh/v1alpha1"
    assert body["metadata"]["name"] == "a100" and body["metadata"]["namespace"] == pools.NAMESPACE
    keys = json.loads(body["metadata"]["annotations"][pools.RESOURCE_KEYS_ANNOTATION])
    assert keys == ["cpu", "memory", "nvidia.com/gpu"]
    assert body["spec"]["quotaName"] == "a100-root"
    labels = pools.node(pool, 0, cpu="1", memory="1Gi")["metadata"]["labels"]
    selector = body["spec"]["nodeSelector"]["matchLabels"]
    assert selector.items() <= labels.items()
