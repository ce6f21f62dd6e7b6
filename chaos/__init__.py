"""Chaos and hostile-input testing of the whole system on the local control plane (RELIABILITY.md).

``python -m chaos.run [--quick]`` starts an e2e control plane (etcd, kube-apiserver,
controller-manager, scheduler, kwok), the webhook and the reconciler, drives a sustained mixed load
through them, injects faults (:mod:`chaos.faults`) and hostile input, lets a hostile namespace user
attack the queue meanwhile (:mod:`chaos.tenant`), and has an independent
observer (:mod:`chaos.observer`) replay every change of the QueueUnits, ElasticQuotas, Jobs and Pods
*straight from etcd*, in revision order, checking the invariants at every version. The report is a
table on stdout and ``chaos/results.json``; the exit status is non-zero on any violation.
"""
