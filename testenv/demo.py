"""``make demo``: the seed's queue-level preemption story, live, against the system ``make run`` runs.

Start the system with no fake nodes first (``KWOK_NODES=0 make run``), so the low-priority job's pod
cannot be bound and stays reclaimable; then ``make demo`` in a second terminal. The demo applies
the example of the Queue-Level Preemption guide (quota team-a with 2 CPU, PriorityClasses, the two
Jobs), prints ``kubectl get queueunit`` and the events each time something changes, and finally adds
a fake node with room, on which the high-priority job runs while the reclaimed low-priority pod
stays gated. Everything lives in namespace ``koord-queue-demo``, deleted at the start.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from testenv import binaries, kwok

NS = "koord-queue-demo"

QUOTA = f"""
apiVersion: scheduling.sigs.k8s.io/v1alpha1
kind: ElasticQuota
metadata:
  name: team-a
  namespace: {NS}
  labels:
    quota.scheduling.koordinator.sh/parent: ""
    quota.scheduling.koordinator.sh/is-parent: "false"
    koord-queue/queue-policy: Priority
  annotations:
    koord-queue/wait-for-pods-running: "true"
    koord-queue/enable-queueunit-preemption: "true"
spec:
  min: {{cpu: "2", memory: 8Gi}}
  max: {{cpu: "2", memory: 8Gi}}
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {{name: low-priority}}
value: 100
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {{name: high-priority}}
value: 1000
"""

JOB = """
apiVersion: batch/v1
kind: Job
metadata:
  name: {level}-priority-job
  namespace: {ns}
  labels:
    quota.scheduling.koordinator.sh/name: team-a
spec:
  suspend: true
  template:
    spec:
      priorityClassName: {level}-priority
      containers:
        - name: main
          image: busybox:stable
          command: ["/bin/sh", "-c", "sleep 3600"]
          resources:
            requests:
              cpu: "2"
            limits:
              cpu: "2"
      restartPolicy: Never
"""


class Kubectl:
    def __init__(self, kubeconfig: Path) -> None:
        self.base = [str(binaries.kubectl()), f"--kubeconfig={kubeconfig}"]

    def __call__(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        result = subprocess.run(
            [*self.base, *args], input=stdin, capture_output=True, text=True, timeout=60, check=False
        )
        if check and result.returncode != 0:
            raise SystemExit(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout


def show(k: Kubectl, last: list[str]) -> None:
    """Print the queue units and the events when they changed since the last call."""
    units = k("get", "queueunit", "-n", NS, "-o", "wide", check=False)
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
    print(f"\n--- {time.strftime('%H:%M:%S')} kubectl get queueunit -n {NS} -o wide")
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
    k("apply", "-f", "-", stdin=QUOTA)
    print("2. low-priority-job: admitted, resumed; its pod cannot be bound (no node has room)")
    k("apply", "-f", "-", stdin=JOB.format(level="low", ns=NS))
    watch_until(
        k, lambda: phase(k, "low-priority-job") == "Dequeued", timeout=60, what="low-priority-job Dequeued"
    )
    print(
        "\n3. high-priority-job: the quota is full, so the low unit is marked for reclaim, its unbound pod is"
        " deleted, and the high unit is admitted in a later cycle"
    )
    k("apply", "-f", "-", stdin=JOB.format(level="high", ns=NS))
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
