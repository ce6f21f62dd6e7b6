"""bench/bench_kueue.py ``--pools N``: Kueue's N flavors and our N pools hold the same cpu in the same
places, and without the option Kueue gets exactly the objects it got before the option existed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bench import bench_kueue as bk

ba = bk.ba
GROUP_VERSION = "kueue.x-k8s.io/v1beta2"


class RecordingClient:
    """Stands in for ``kube.Kube``: records every create, in order."""

    def __init__(self) -> None:
        self.created: list[tuple[str, dict[str, Any], str | None]] = []

    async def create(self, res: Any, obj: dict[str, Any], *, namespace: str | None = None) -> dict[str, Any]:
        self.created.append((res.plural, obj, namespace))
        return obj


def kueue_objects(cfg: ba.RunConfig, pool_count: int) -> list[tuple[str, dict[str, Any], str | None]]:
    client = RecordingClient()
    asyncio.run(bk.setup_queues(client, cfg, pool_count))  # type: ignore[arg-type]
    return client.created


def test_without_pools_kueue_gets_the_objects_it_always_got() -> None:
    cfg = ba.RunConfig(mode="comparable", jobs=100, quotas=2, probe_jobs=40)
    got = kueue_objects(cfg, 0)
    cpu = [f"{s * ba.CPU_PER_JOB_MILLI}m" for s in [*cfg.slots, 40]]
    names = ["bench-q000", "bench-q001", "bench-probe"]
    flavor = {"apiVersion": GROUP_VERSION, "kind": "ResourceFlavor", "metadata": {"name": "default-flavor"}}
    queues = []
    for name, nominal in zip(names, cpu, strict=True):
        group = {
            "coveredResources": ["cpu"],
            "flavors": [{"name": "default-flavor", "resources": [{"name": "cpu", "nominalQuota": nominal}]}],
        }
        spec = {"namespaceSelector": {}, "resourceGroups": [group]}
        cq = {"apiVersion": GROUP_VERSION, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec}
        lq = {
            "apiVersion": GROUP_VERSION,
            "kind": "LocalQueue",
            "metadata": {"name": name},
            "spec": {"clusterQueue": name},
        }
        queues += [("clusterqueues", cq, None), ("localqueues", lq, ba.NS)]
    assert got[0][0] == "namespaces"
    assert got[1] == ("resourceflavors", flavor, None)
    assert [o["metadata"]["name"] for r, o, _ in got[2:5]] == ["p10", "p50", "p100"]
    assert got[5:] == queues
    # byte for byte: the same keys in the same order
    assert [repr(o) for _, o, _ in got[5:]] == [repr(o) for _, o, _ in queues]


@pytest.mark.parametrize(("jobs", "quotas", "pool_count"), [(1000, 10, 3), (7, 3, 2), (50, 5, 4)])
def test_kueue_flavors_and_our_pool_quotas_split_every_queue_alike(
    jobs: int, quotas: int, pool_count: int
) -> None:
    cfg = ba.RunConfig(mode="comparable", jobs=jobs, quotas=quotas, probe_jobs=40)
    created = kueue_objects(cfg, pool_count)
    flavors = [o for r, o, _ in created if r == "resourceflavors"]
    assert [f["metadata"]["name"] for f in flavors] == [f"pool-{i}" for i in range(pool_count)]
    for i, flavor in enumerate(flavors):
        assert flavor["spec"]["nodeLabels"]["koord-queue.io/pool"] == f"pool-{i}"
    ours = {q["metadata"]["name"]: q for q in bk.our_pool_quotas(cfg, pool_count)}
    profiles = {p.name: p for p in bk.pool_list(pool_count)}
    queues = [o for r, o, _ in created if r == "clusterqueues"]
    assert len(queues) == quotas + 1
    for cq in queues:
        name = cq["metadata"]["name"]
        (group,) = cq["spec"]["resourceGroups"]
        kueue_split = [(f["name"], f["resources"][0]["nominalQuota"]) for f in group["flavors"]]
        team = ours[name]
        routes = [r.strip() for r in team["metadata"]["annotations"]["koord-queue/pool-quotas"].split(",")]
        assert "quota.scheduling.koordinator.sh/parent" not in team["metadata"]["labels"]  # outside the trees
        ours_split = []
        for route in routes:
            quota = ours[route]
            parent = quota["metadata"]["labels"]["quota.scheduling.koordinator.sh/parent"]
            pool = next(p for p in profiles.values() if p.root_quota == parent)
            assert quota["spec"]["min"] == quota["spec"]["max"]
            ours_split.append((pool.name, quota["spec"]["max"]["cpu"]))
        assert ours_split == kueue_split  # same pools, same order, same cpu each
        total = sum(bk.parse_milli(cpu) for _, cpu in kueue_split)
        assert bk.parse_milli(team["spec"]["max"]["cpu"]) == total
        slots = total // ba.CPU_PER_JOB_MILLI
        shares = [bk.parse_milli(cpu) // ba.CPU_PER_JOB_MILLI for _, cpu in kueue_split]
        assert max(shares) - min(shares) <= 1 and shares == sorted(shares, reverse=True)
        assert slots in [*cfg.slots, cfg.probe_jobs]
    # every pool's node holds all its quotas: the roots never limit what Kueue's flavors do not
    node_cpu = bk.parse_milli(bk.pool_node_cpu(cfg, pool_count))
    for i in range(pool_count):
        held = sum(
            bk.parse_milli(q["spec"]["max"]["cpu"]) for n, q in ours.items() if n.endswith(f"-pool-{i}")
        )
        assert held <= node_cpu


def test_ours_in_pools_swaps_the_set_up_for_the_run_only() -> None:
    before = (ba.setup_quotas, ba.wait_queues, ba.Runner)
    with bk.ours_in_pools(3):
        assert ba.Runner is bk.PoolCountingRunner
        assert ba.setup_quotas is not before[0] and ba.wait_queues is not before[1]
    assert (ba.setup_quotas, ba.wait_queues, ba.Runner) == before
    with pytest.raises(RuntimeError), bk.ours_in_pools(2):
        raise RuntimeError("a failed run")
    assert (ba.setup_quotas, ba.wait_queues, ba.Runner) == before


def unit(name: str, phase: str, pool: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"phase": phase, "pool": pool}}


def workload(job: str, admitted: bool, flavor: str) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": [{"type": "Admitted", "status": "True" if admitted else "False"}]}
    if admitted:
        status["admission"] = {"podSetAssignments": [{"name": "main", "flavors": {"cpu": flavor}}]}
    return {
        "metadata": {"name": f"job-{job}-wl", "ownerReferences": [{"kind": "Job", "name": job}]},
        "status": status,
    }


def test_admissions_are_counted_once_per_unit_by_pool_and_by_flavor() -> None:
    cfg = ba.RunConfig(mode="full", jobs=3, quotas=1)  # full mode: no finishing timer to schedule
    ours = bk.PoolCountingRunner(cfg, client=None)  # type: ignore[arg-type]
    for obj in [
        unit("job-00000", "Pending", ""),
        unit("job-00000", "Dequeued", "pool-1"),
        unit("job-00000", "Succeed", "pool-1"),
        unit("job-00001", "Dequeued", "pool-0"),
        unit("job-00002", "Dequeued", "pool-1"),
    ]:
        ours.observe(obj)
    assert ours.summary()["admitted_by_pool"] == {"pool-0": 1, "pool-1": 2}
    kueue = bk.KueueRunner(cfg, client=None)  # type: ignore[arg-type]
    for obj in [
        workload("job-00000", False, ""),
        workload("job-00000", True, "pool-2"),
        workload("job-00000", True, "pool-2"),
        workload("job-00001", True, "pool-0"),
    ]:
        kueue.observe(obj)
    assert kueue.summary()["admitted_by_pool"] == {"pool-0": 1, "pool-2": 1}
