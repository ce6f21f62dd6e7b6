"""Session fixtures: a real control plane per layer, started once and shared by namespace.

``integration_cluster`` is etcd + kube-apiserver; ``e2e_cluster`` adds the controller-manager, the
scheduler and kwok fake nodes. Each starts lazily on first use and installs our CRDs and the test-only
CRDs of the foreign job kinds. ``make test`` runs the layers as separate pytest invocations, so a
session never pays for both.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from testenv import system
from testenv.cluster import LocalCluster
from tests import kube, tenancy
from tests.scenario import Scenario, scenario


def _start(profile: str, tmp: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster(
        profile=profile,  # type: ignore[arg-type]
        workdir=tmp,
        nodes=int(os.environ.get("KWOK_NODES", "2")),
        pod_duration_s=float(os.environ.get("KWOK_POD_DURATION", "3")),
    )
    cluster.start()
    try:
        system.install_crds(cluster)
        yield cluster
    except BaseException:
        print(cluster.logs())
        raise
    finally:
        cluster.stop()


# docs/development.md#test-tiers: the suite draws the same examples on every run, so `make test`
# passes or fails the same way on every clone; `HYPOTHESIS_PROFILE=explore` draws fresh ones to
# look for new failures.
settings.register_profile("deterministic", derandomize=True, database=None)
settings.register_profile("explore", max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))


@pytest.fixture(scope="session")
def integration_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    yield from _start("integration", tmp_path_factory.mktemp("integration-cp"))


@pytest.fixture(scope="session")
def e2e_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    yield from _start("e2e", tmp_path_factory.mktemp("e2e-cp"))


@pytest.fixture
async def namespace_in(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """A fresh namespace in whichever cluster the test uses; deleted afterwards."""
    cluster: LocalCluster = request.getfixturevalue(
        "e2e_cluster" if request.node.get_closest_marker("e2e") else "integration_cluster"
    )
    name = f"t-{uuid.uuid4().hex[:8]}"
    async with kube.client(cluster) as api:
        await kube.create_namespace(api, name)
        yield name
        await kube.delete_namespace(api, name)


def _system(cluster: LocalCluster, logdir: Path) -> Iterator[system.Processes]:
    processes = system.start(cluster, logdir=logdir)
    try:
        yield processes
    finally:
        processes.stop()
        for component in ("webhook", "reconciler"):
            log = logdir / f"{component}.log"
            if log.exists():
                print(f"--- {component} log (tail) ---")
                print("\n".join(log.read_text(errors="replace").splitlines()[-80:]))


@pytest.fixture(scope="session")
def system_e2e(
    e2e_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[system.Processes]:
    """The webhook and the reconciler running against the e2e control plane."""
    yield from _system(e2e_cluster, tmp_path_factory.mktemp("system-e2e"))


@pytest.fixture(scope="session")
def system_integration(
    integration_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[system.Processes]:
    """The webhook and the reconciler running against the integration control plane."""
    yield from _system(integration_cluster, tmp_path_factory.mktemp("system-integration"))


@pytest.fixture
async def alice_in(
    integration_cluster: LocalCluster, system_integration: system.Processes, namespace_in: str
) -> AsyncIterator[Scenario]:
    """A scenario in a fresh namespace where ``alice`` holds a namespace user's rights
    (``tests/tenancy.py``), with the system running: the stage of the hostile-tenant tests."""
    tenancy.grant(integration_cluster, namespace_in, tenancy.ALICE)
    async with scenario(integration_cluster, namespace_in) as it:
        yield it
