"""The preemption example's objects (docs/compatibility.md#preemption-example), written once.

``make demo`` (``testenv.demo``) applies them to the running system and the e2e story
(``tests/e2e/test_preemption_story.py``) to its own control plane: quota ``team-a`` with 2 CPU,
``wait-for-pods-running`` and preemption on, the PriorityClasses ``low-priority`` (100) and
``high-priority`` (1000), and one 2-CPU Job per class. Each is YAML text for ``kubectl apply -f -``.
"""

from __future__ import annotations

from typing import Final, Literal

_QUOTA: Final = """
apiVersion: scheduling.sigs.k8s.io/v1alpha1
kind: ElasticQuota
metadata:
  name: team-a
  namespace: {ns}
  labels:
    quota.scheduling.koordinator.sh/parent: ""
    quota.scheduling.koordinator.sh/is-parent: "false"
    koord-queue/queue-policy: Priority
  annotations:
    koord-queue/wait-for-pods-running: "true"
    koord-queue/enable-queueunit-preemption: "true"
spec:
  min:
    cpu: "2"
    memory: 8Gi
  max:
    cpu: "2"
    memory: 8Gi
"""

PRIORITY_CLASSES: Final = """
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata:
  name: low-priority
value: 100
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata:
  name: high-priority
value: 1000
"""

_JOB: Final = """
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


def quota(namespace: str) -> str:
    """The ElasticQuota ``team-a`` in ``namespace``."""
    return _QUOTA.format(ns=namespace)


def job(level: Literal["low", "high"], namespace: str) -> str:
    """The Job ``<level>-priority-job`` in ``namespace``, of PriorityClass ``<level>-priority``."""
    return _JOB.format(level=level, ns=namespace)
