"""``make run``: the whole system on an embedded local control plane, in the foreground.

Starts the e2e-profile control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok fake
nodes), installs the CRDs (ours and the test CRDs of the foreign job kinds, so TFJobs, RayJobs and the
rest can be tried), then the webhook and the reconciler when they are available, writes the admin
kubeconfig to ``.local/kubeconfig`` and prints one line ``READY kubeconfig=<path>``. SIGINT or
SIGTERM stops every process it started. Every log is under ``.local/``.

Environment: ``KWOK_NODES`` (default 2; 0 leaves pods Pending and unbound), ``KWOK_NODE_CPU``
(default 8), ``KWOK_NODE_MEMORY`` (default 32Gi), ``KWOK_POD_DURATION`` (seconds a Job pod runs on a
fake node before it succeeds; default 30), ``KWOK_GPU_POOLS`` (GPU node pools beside those nodes, e.g.
``h100:4x8:taint,a100:4x8,l4:4x4``: name:NODESxGPUS[:taint], each pool's nodes and its
ElasticQuotaProfile; see testenv/pools.py and docs/pools.md).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

from testenv import binaries, pools, system
from testenv.cluster import LocalCluster
from testenv.processes import ClusterError

LOCAL = binaries.PROJECT_ROOT / ".local"


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, str(default))
    try:
        value = int(raw)
    except ValueError:
        raise SystemExit(f"{name} must be a whole number, got {raw!r}") from None
    if value < 0:
        raise SystemExit(f"{name} must not be negative, got {value}")
    return value


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, str(default))
    try:
        return float(raw)
    except ValueError:
        raise SystemExit(f"{name} must be a number of seconds, got {raw!r}") from None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="koord-queue-localcluster",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=LOCAL,
        help="where the cluster state, kubeconfig and logs go (default .local/)",
    )
    parser.add_argument(
        "--no-system",
        action="store_true",
        help="start only the control plane, without the webhook and the reconciler",
    )
    args = parser.parse_args(argv)
    try:
        gpu_pools = pools.parse(os.environ.get(pools.ENV_VAR, ""))
    except ValueError as err:
        raise SystemExit(str(err)) from None

    workdir: Path = args.workdir.resolve()
    cluster_dir = workdir / "cluster"
    shutil.rmtree(cluster_dir, ignore_errors=True)
    workdir.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    started = time.monotonic()
    cluster = LocalCluster(
        profile="e2e",
        workdir=cluster_dir,
        nodes=_env_int("KWOK_NODES", 2),
        node_cpu=os.environ.get("KWOK_NODE_CPU", "8"),
        node_memory=os.environ.get("KWOK_NODE_MEMORY", "32Gi"),
        pod_duration_s=_env_float("KWOK_POD_DURATION", 30.0),
    )
    processes: system.Processes | None = None
    try:
        cluster.start()
        system.install_crds(cluster)
        pools.create(cluster, gpu_pools)
        kubeconfig = workdir / "kubeconfig"
        shutil.copyfile(cluster.kubeconfig, kubeconfig)
        kubeconfig.chmod(0o600)
        if not args.no_system:
            processes = system.start(cluster, logdir=workdir)
            reconciler = next((c for c in processes.components if c.name == "reconciler"), None)
            if reconciler is not None and "visibility" in reconciler.ports:
                # kubectl get --raw /apis/visibility.koord-queue.x-k8s.io/v1alpha1/... works locally.
                system.register_visibility(cluster, port=reconciler.ports["visibility"])
        print(f"control plane up in {time.monotonic() - started:.1f}s; logs in {workdir}", file=sys.stderr)
        print(f"READY kubeconfig={kubeconfig}", flush=True)
        while not stop.wait(1.0):
            if processes is not None:
                processes.check()
            for component in cluster.components:
                if not component.alive():
                    raise ClusterError(f"{component.name} exited:\n{component.tail()}")
    except ClusterError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    finally:
        if processes is not None:
            processes.stop()
        cluster.stop()
        print("stopped", file=sys.stderr)


if __name__ == "__main__":
    main()
