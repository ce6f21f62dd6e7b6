"""``make demo``: the preemption example (docs/compatibility.md#preemption-example), live, against the
system ``make run`` runs.

Start the system with no fake nodes first (``KWOK_NODES=0 make run``), so the low-priority job's pod
cannot be bound and stays reclaimable; then ``make demo`` in a second terminal. The demo applies
the example of the Queue-Level Preemption guide (quota team-a with 2 CPU, PriorityClasses, the two
Jobs), prints ``kubectl koord-queue list`` (the plugin) and the events each time something changes,
the quota (``kubectl koord-queue quotas``) and why the preempted job waits (``explain``), and
finally adds a fake node with room, on which the high-priority job runs while the reclaimed
low-priority pod stays gated. Everything lives in namespace ``koord-queue-demo``, deleted at the start.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from testenv import binaries, kwok, story

NS = "koord-queue-demo"


class Kubectl:
    def __init__(self, kubeconfig: Path) -> None:
        self.base = [str(binaries.kubectl()), f"--kubeconfig={kubeconfig}"]
        self.kubeconfig = kubeconfig

    def plugin(self, *args: str) -> str:
        """``kubectl koord-queue ARGS``: kubectl finds the plugin the package installs next to this
        Python (``.venv/bin/kubectl-koord_queue``)."""
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        result = subprocess.run(
            [*self.base[:1], "koord-queue", f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=env,
        )
        return result.stdout if result.returncode == 0 else result.stderr

    def __call__(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        result = subprocess.run(
            [*self.base, *args], input=stdin, capture_output=True, text=True, timeout=60, check=False
        )
        if check and result.returncode != 0:
            raise SystemExit(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout


def show(k: Kubectl, last: list[str]) -> None:
    """Print the queue units and the events when they changed since the last call."""
    units = k.plugin("list", "-n", NS)
    events = k(
        "get",
        "events",
        "-n",
        NS,
        "--sort-by=.eventTime",
        "-o",
        "custom-columns=OBJECT:.involvedObject.name,REASON:.reason,TYPE:.type,MESSAGE:.message",
        check=False,
    )
    snapshot = units + events
    if last and last[0] == snapshot:
        return
    last[:] = [snapshot]
    print(f"\n--- {time.strftime('%H:%M:%S')} kubectl koord-queue list -n {NS}")
    print(units.rstrip() or "(none yet)")
    print("--- events")
    print("\n".join(events.rstrip().splitlines()[-12:]) or "(none yet)")
    sys.stdout.flush()


def watch_until(k: Kubectl, done: object, *, timeout: float, what: str) -> None:
    last: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        show(k, last)
        if callable(done) and done():
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up after {timeout:.0f}s waiting for {what}")
        time.sleep(0.5)


def phase(k: Kubectl, name: str) -> str:
    out = k("get", "queueunit", name, "-n", NS, "-o", "jsonpath={.status.phase}", check=False)
    return out.strip()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="make demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kubeconfig", type=Path, default=binaries.PROJECT_ROOT / ".local" / "kubeconfig")
    args = parser.parse_args(argv)
    if not args.kubeconfig.exists():
        raise SystemExit(f"{args.kubeconfig} not found: start the system first with `KWOK_NODES=0 make run`")
    k = Kubectl(args.kubeconfig)
    nodes = json.loads(k("get", "nodes", "-o", "json"))["items"]
    if nodes:
        print(
            "note: fake nodes exist, so the low-priority pod may be bound at once and is then never "
            "reclaimed (running pods never are). Start with `KWOK_NODES=0 make run` to see the story."
        )
    k("delete", "namespace", NS, "--ignore-not-found", "--wait=true")
    k("create", "namespace", NS)
    print("1. quota team-a (2 CPU, wait-for-pods-running, enable-queueunit-preemption) and PriorityClasses")
    k("apply", "-f", "-", stdin=story.PRIORITY_CLASSES)
    k("apply", "-f", "-", stdin=story.quota(NS))
    print("2. low-priority-job: admitted, resumed; its pod cannot be bound (no node has room)")
    k("apply", "-f", "-", stdin=story.job("low", NS))
    watch_until(
        k, lambda: phase(k, "low-priority-job") == "Dequeued", timeout=60, what="low-priority-job Dequeued"
    )
    print(f"\n$ kubectl koord-queue quotas -n {NS}")
    print(k.plugin("quotas", "-n", NS).rstrip())
    print(
        "\n3. high-priority-job: the quota is full, so the low unit is marked for reclaim, its unbound pod is"
        " deleted, and the high unit is admitted in a later cycle"
    )
    k("apply", "-f", "-", stdin=story.job("high", NS))
    watch_until(
        k, lambda: phase(k, "high-priority-job") == "Dequeued", timeout=60, what="high-priority-job Dequeued"
    )
    print(
        '\n$ kubectl get queueunit low-priority-job -o jsonpath=\'{.status.phase}{"\\t"}'
        '{.status.admissions[0].replicas}{"\\t"}{.status.admissions[0].reclaimState.replicas}{"\\n"}\''
    )
    print(
        k(
            "get",
            "queueunit",
            "low-priority-job",
            "-n",
            NS,
            "-o",
            'jsonpath={.status.phase}{"\\t"}{.status.admissions[0].replicas}{"\\t"}'
            '{.status.admissions[0].reclaimState.replicas}{"\\n"}',
        )
    )
    print(f"\n$ kubectl koord-queue explain low-priority-job -n {NS}   # why the preempted job waits now")
    print(k.plugin("explain", "low-priority-job", "-n", NS).rstrip())
    print("\n4. a node with room appears: the high job's pod is bound and runs; the low pod stays gated")
    k("apply", "-f", "-", stdin=json.dumps(kwok.node("demo-roomy", cpu="4", memory="16Gi")))
    k(
        "patch",
        "node",
        "demo-roomy",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": kwok.node("demo-roomy", cpu="4", memory="16Gi")["status"]}),
    )

    def high_running() -> bool:
        out = k("get", "pods", "-n", NS, "-l", "job-name=high-priority-job", "-o", "json")
        return any(p["status"].get("phase") == "Running" for p in json.loads(out)["items"])

    watch_until(k, high_running, timeout=60, what="the high-priority pod Running")
    print(k("get", "pods", "-n", NS, "-o", "wide"))
    print("done: the story of the Queue-Level Preemption guide, end to end.")


if __name__ == "__main__":
    main()
