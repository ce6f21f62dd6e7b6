"""Every name the Koord-Queue compatible API fixes: groups, kinds, labels, annotations, phases,
condition types, event reasons and user-facing messages.

They live in one module because compatibility is the contract
(docs/architecture.md#decision-1-a-compatible-api): a typo in a label key silently breaks a user's
existing YAML, so every other module imports the name from here instead of spelling it again. Texts
marked "sic" keep upstream's spelling on purpose.
"""

from __future__ import annotations

import enum
from typing import Final

# --- API groups and versions -------------------------------------------------------------------

GROUP: Final = "scheduling.x-k8s.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
QUEUE_PLURAL: Final = "queues"
QUEUEUNIT_PLURAL: Final = "queueunits"

QUOTA_GROUP: Final = "scheduling.sigs.k8s.io"
QUOTA_VERSION: Final = "v1alpha1"
QUOTA_API_VERSION: Final = f"{QUOTA_GROUP}/{QUOTA_VERSION}"
QUOTA_PLURAL: Final = "elasticquotas"

#: The default install namespace: where the component runs and keeps every Queue (auto-created from
#: ElasticQuotas or hand-made) and its ConfigMaps. Only a default: the reconciler and the webhook take
#: theirs from ``--namespace`` (the pod's namespace, from the downward API), the kubectl plugin from
#: ``--koord-queue-namespace``; the code below them is handed that namespace
#: (docs/operations.md#install-namespace).
COMPONENT_NAMESPACE: Final = "koord-queue"
#: The reconciler's ServiceAccount (manifests/rbac/reconciler.yaml), in the install namespace.
RECONCILER_SERVICE_ACCOUNT: Final = "koord-queue-reconciler"


def reconciler_username(namespace: str) -> str:
    """The user the reconciler acts as when installed in ``namespace``: the only one the webhook and
    the admission policies let resume a queued job."""
    return f"system:serviceaccount:{namespace}:{RECONCILER_SERVICE_ACCOUNT}"


#: The implicit root of the quota tree; never checked itself.
ROOT_QUOTA: Final = "koordinator-root-quota"
#: Event source component name.
CONTROLLER_AGENT: Final = "koord-queue-controller"

# --- Labels ------------------------------------------------------------------------------------

QUOTA_NAME_LABEL: Final = "quota.scheduling.koordinator.sh/name"
QUOTA_NAME_LABEL_FALLBACK: Final = "alibabacloud.com/quota-name"
QUOTA_PARENT_LABEL: Final = "quota.scheduling.koordinator.sh/parent"
QUEUE_POLICY_LABEL: Final = "koord-queue/queue-policy"
PREEMPTIBLE_LABEL: Final = "quota.scheduling.alibabacloud.com/preemptible"
OVERSOLD_TYPE_ANNOTATION: Final = "quota.scheduling.koordinator.sh/actual-quota-oversold-type"

# --- Job and QueueUnit annotations ---------------------------------------------------------------

SUSPEND_ANNOTATION: Final = "scheduling.x-k8s.io/suspend"
PRIORITY_ANNOTATION: Final = "scheduling.x-k8s.io/priority"
#: Ours, on a ``batch/v1`` Job: the fewest pods it may start with (partial admission,
#: docs/compatibility.md#gangs-and-partial-admission); becomes the unit pod set's ``minCount``.
JOB_MIN_PARALLELISM_ANNOTATION: Final = "koord-queue/job-min-parallelism"
ACTIVE_ANNOTATION: Final = "scheduling.x-k8s.io/active"
MAX_EXEC_TIME_ANNOTATION: Final = "scheduling.x-k8s.io/max-exec-time-seconds"
MIN_RESOURCES_ANNOTATION: Final = "koord-queue/min-resources"
JOB_HAS_ENQUEUED_ANNOTATION: Final = "koord-queue/job-has-enqueued"
JOB_ENQUEUE_TIMESTAMP_ANNOTATION: Final = "koord-queue/job-enqueue-timestamp"
JOB_DEQUEUE_TIMESTAMP_ANNOTATION: Final = "koord-queue/job-dequeue-timestamp"
RELATED_QUEUEUNIT_ANNOTATION: Final = "koord-queue/related-queueunit"
RELATED_PODSET_ANNOTATION: Final = "koord-queue/related-podset-name"

#: The scheduling gate the webhook adds to managed pod templates
#: (docs/architecture.md#decision-5-gate-pods-reclaim-only-unbound-ones).
ADMISSION_GATE: Final = "koord-queue/admission"
#: Pod label marking pods that must be created behind :data:`ADMISSION_GATE` by the pod webhook
#: (``shared.admission.podgate``). For kinds without a pod template the webhook could gate (SparkApplication:
#: the operator builds the pods from ``spec.driver``/``spec.executor``), the job's webhook puts this
#: label where the operator copies labels from, so the pods are held whatever the operator does.
GATED_POD_LABEL: Final = "koord-queue/gated-pod"
#: The Job controller's finalizer on each pod it tracks. A tracked pod deleted by anyone but the Job
#: controller counts as a failure against ``backoffLimit``; reclaim removes it first (see
#: ``reconciler.job_pods``), the way the Job controller does for pods it deletes itself.
JOB_TRACKING_FINALIZER: Final = "batch.kubernetes.io/job-tracking"
#: Name of the suspend template Argo Workflows get (docs/compatibility.md#argo-workflow).
WORKFLOW_SUSPEND_TEMPLATE: Final = "koord-queue-suspend"
#: Pseudo pod set used when a unit has a request but no pod sets.
DEFAULT_REQUIREMENT_PODSET: Final = "koord-queue/default-requirement"

# --- Queue annotations (docs/compatibility.md#queue-annotations) ----------------------------------

QUEUE_ANNOTATION_PREFIX: Final = "koord-queue/"
WAIT_FOR_PODS_RUNNING_ANNOTATION: Final = "koord-queue/wait-for-pods-running"
ENABLE_PREEMPTION_ANNOTATION: Final = "koord-queue/enable-queueunit-preemption"
MAX_DEPTH_ANNOTATION: Final = "koord-queue/max-depth"
#: ``namespace``: the queue orders units of equal priority by their namespace's decayed usage
#: (docs/compatibility.md#fair-order-inside-a-queue).
FAIR_ORDER_ANNOTATION: Final = "koord-queue/fair-order"
FAIR_ORDER_NAMESPACE: Final = "namespace"
PRIORITY_THRESHOLD_ANNOTATION: Final = "koord-queue/priority-threshold"
QUEUE_ITEMS_REFRESH_ANNOTATION: Final = "koord-queue/queue-items-refresh-interval"
DISABLE_SHOW_QUEUE_ITEMS_ANNOTATION: Final = "koord-queue/disable-show-queue-items"
QUEUE_ARGS_ANNOTATION: Final = "koord-queue/queue-args"
#: ``"true"``: an administrator stopped the queue; it admits nothing until the annotation is
#: removed or false, and its waiting units keep their places (docs/compatibility.md#stopping-a-queue).
STOPPED_ANNOTATION: Final = "koord-queue/stopped"

DEFAULT_QUEUE_PRIORITY: Final = 1000
DEFAULT_PRIORITY_THRESHOLD: Final = 4


class QueuePolicy(enum.StrEnum):
    """Policies a Queue may use. FIFO and Round exist upstream only as names and fail."""

    PRIORITY = "Priority"
    BLOCK = "Block"
    INTELLIGENT = "Intelligent"


class Phase(enum.StrEnum):
    """QueueUnit phases (docs/compatibility.md#phases). ``""`` counts as pending and is not a member."""

    ENQUEUED = "Enqueued"
    RESERVED = "Reserved"
    DEQUEUED = "Dequeued"
    RUNNING = "Running"
    SUCCEED = "Succeed"
    FAILED = "Failed"
    SCHED_READY = "SchedReady"
    SCHED_SUCCEED = "SchedSucceed"
    SCHED_FAILED = "SchedFailed"
    TIMEOUT_BACKOFF = "TimeoutBackoff"
    PREEMPTED = "Preempted"  # legacy, recognised but never written


class ConditionType(enum.StrEnum):
    QUOTA_RESERVED = "QuotaReserved"
    ADMITTED = "Admitted"
    PODS_READY = "PodsReady"
    FINISHED = "Finished"
    EVICTED = "Evicted"


class EventReason(enum.StrEnum):
    SCHEDULED = "Scheduled"
    FAILED_SCHEDULING = "FailedScheduling"
    PREEMPTED = "Preempted"
    RECLAIMED = "Reclaimed"
    QUEUE_NOT_FOUND = "QueueNotFound"
    ADD_QUEUE_FAIL = "AddQueueFail"
    RESUME = "Resume"
    DEACTIVATED = "Deactivated"
    MAX_EXEC_TIME_EXCEEDED = "MaximumExecutionTimeExceeded"
    #: Ours: a managed job ran without the reconciler's admission and was held again.
    HELD_UNADMITTED = "HeldUnadmitted"
    #: Ours: a pod of a managed job lost its scheduling gate without admission and was deleted.
    UNADMITTED_POD_DELETED = "UnadmittedPodDeleted"
    #: Ours, on the job: a released pod naming its unit that the job does not own was deleted.
    ESCAPED_POD_DELETED = "EscapedPodDeleted"
    #: Ours, on the job: a pod naming its unit stays gated, not proven the job's or too large.
    POD_KEPT_GATED = "PodKeptGated"
    #: Ours, on the job: bound pods run beyond what its unit's admission holds (not charged).
    PODS_BEYOND_ADMISSION = "PodsBeyondAdmission"
    #: Ours, on a Workflow (Normal): a pod stays gated until its running pods leave room in the
    #: reservation (docs/compatibility.md#argo-workflow).
    POD_WAITS_FOR_RESERVATION = "PodWaitsForReservation"
    #: Ours, on the job: pods it was admitted with changed size; held and queued again.
    ADMITTED_JOB_RESIZED = "AdmittedJobResized"
    #: Ours, on the job: it waits in its queue (quota, position when it first had to wait).
    QUEUED = "Queued"
    #: Ours, on the job: admitted after it waited (``Preempted`` is recorded on the job too).
    ADMITTED = "Admitted"
    #: Ours, on the job: queueing is mandatory in its namespace and it had no quota label; it was
    #: labelled with the namespace's default quota (docs/operations.md#mandatory-queueing).
    DEFAULT_QUOTA = "DefaultQuota"
    #: Ours, on the job: queueing is mandatory in its namespace, it has no quota label and no quota
    #: resolves for the namespace; it stays held.
    NO_DEFAULT_QUOTA = "NoDefaultQuota"


class AdmissionCheckState(enum.StrEnum):
    PENDING = "Pending"
    READY = "Ready"
    RETRY = "Retry"
    REJECTED = "Rejected"


class Message:
    """``status.message`` texts (docs/compatibility.md#status-messages), exact."""

    ENQUEUED: Final = "Enqueued"
    ADOPTED: Final = "Deuqueued"  # sic
    DEQUEUED: Final = "Dequeued because schedule successfully"
    RESERVED: Final = "Reserved resources success, waiting admission checks to be ready"
    SCHED_READY: Final = "Waiting scheduler to schedule this queueUnit"
    CHECKS_READY: Final = "all admission checks success"
    CHECK_FAILED: Final = "admission check failed"
    RECLAIMING: Final = "Waiting job extension to reclaim resources."
    BLOCKED_BY_HIGHER: Final = "job is block by others with high priority"
    BACKOFF_RUNNING_TIMEOUT: Final = "Backoff due to running timeout"
    BACKOFF_NO_PODS: Final = "Backoff due to no pods after admission"
    ENQUEUED_AFTER_BACKOFF: Final = "Enqueued because backoff timeout"
    ENQUEUED_AFTER_PREEMPTED: Final = "Enqueued after preempted"
    JOB_PENDING: Final = "Job is in Pending state"
    RUNNING: Final = "Running"
    SUCCEEDED: Final = "Succeeded"
    FAILED: Final = "Failed"
    DEACTIVATED: Final = "Evicted because the queue unit is deactivated"
    MAX_EXEC_EXCEEDED: Final = "Evicted because the maximum execution time was exceeded"
    #: Ours: a unit queued again because its job changed the size of pods it was admitted with
    #: (docs/compatibility.md#admitted-pod-size); the pod sets' names follow.
    RESIZED_PREFIX: Final = "Evicted because the job changed the resource requests of its admitted pod set(s)"
    NO_MORE_IN_QUEUE: Final = "no more queueUnit allowed to schedule in this queue"
    PREEMPT_FAILED_SUFFIX: Final = "; preempt failed"
    PREEMPT_SUCCEED_SUFFIX: Final = "; preempt succeed"
    SCHEDULED_EVENT: Final = "dequeue success"
    #: Ours, not upstream's: a unit with no quota label belongs to no queue
    #: (docs/compatibility.md#s29-unit-without-a-quota-label: no phase, no event), but it should not
    #: wait without a word saying why.
    NO_QUOTA_LABEL: Final = (
        f"not queued: the unit has no quota label ({QUOTA_NAME_LABEL} or {QUOTA_NAME_LABEL_FALLBACK}),"
        " so it belongs to no queue"
    )

    #: Ours: the Warning event on a job that ran without having been admitted (see EventReason).
    HELD_UNADMITTED: Final = (
        "the job was running without having been admitted by koord-queue (released by someone "
        "else, or started before it was labelled); it is suspended and queued like a new job"
    )

    @staticmethod
    def unadmitted_pod_deleted(pod: str) -> str:
        return (
            f"deleted unbound pod {pod}: it was out of its scheduling gate {ADMISSION_GATE} but the "
            "job holds no admission for it (the admission was given back, or the gate was removed "
            "past the queue); its controller creates a gated replacement"
        )

    @staticmethod
    def pod_kept_gated(pod: str, why: str) -> str:
        return (
            f"pod {pod} names this job's QueueUnit but stays behind its scheduling gate "
            f"{ADMISSION_GATE}: {why}; only a pod controlled by the job (or by its own "
            "RayCluster, driver or child Job) that fits its job's admission is released"
        )

    @staticmethod
    def pod_waits_for_reservation(pod: str, why: str) -> str:
        return (
            f"pod {pod} stays behind its scheduling gate {ADMISSION_GATE} for now: {why}; the "
            "pods of a job admitted for a reservation (koord-queue/min-resources) run only while "
            "their summed requests fit it"
        )

    @staticmethod
    def pods_beyond_admission(pod_set: str, pods: list[str]) -> str:
        return (
            f"pod set {pod_set} has {len(pods)} bound pod(s) beyond what its QueueUnit's admission "
            f"holds ({', '.join(pods)}); koord-queue never grows an admission to fit pods it finds "
            "running, so they are not charged to the quota: they got past the queue (a pod bound "
            "outside the scheduler, or the door bypassed); delete them or the job"
        )

    @staticmethod
    def escaped_pod_deleted(pod: str) -> str:
        return (
            f"deleted pod {pod}: it names this job's QueueUnit and was out of its scheduling gate "
            f"{ADMISSION_GATE}, but the job does not own it (a label its controller selects pods by, "
            "or its owner reference, was changed); outside its job it would run outside the quota"
        )

    @staticmethod
    def queue_not_exist(queue: str) -> str:
        return f"queue {queue} is not exist"

    @staticmethod
    def queue_stopped(queue: str) -> str:
        return f"queue {queue} is stopped by an administrator; nothing is admitted until it is resumed"

    @staticmethod
    def queue_not_found_event(queue: str, namespace: str, name: str) -> str:
        return f"queue {queue} not found for queueUnit {namespace}/{name}"

    @staticmethod
    def limited(quota: str, resource: str) -> str:
        return f"limited quotaName:{quota}, limited resKey:{resource},"  # sic, trailing comma

    @staticmethod
    def quota_spec_empty(quota: str) -> str:
        return f"limited quotaName:{quota}, quota spec is empty but queue unit res is not empty"

    @staticmethod
    def quota_cycle(item: str, quota: str, visited: list[str]) -> str:
        return (
            f"CheckUsage found cycle reference, item:{item}, quotaName:{quota}, "
            f"visited quota: {','.join(visited)}"
        )

    @staticmethod
    def quota_missing(item: str, quota: str, visited: list[str]) -> str:
        return (
            f"CheckUsage found quota not exist, item:{item}, quotaName:{quota}, "
            f"visited quota: {','.join(visited)}"
        )

    @staticmethod
    def waiting_for_victims(victims: list[str]) -> str:
        return f"preemption: waiting for queueUnit preempted, victims: [{','.join(victims)}]"

    @staticmethod
    def queue_preempting(queue: str) -> str:
        return f"queue {queue} is preempting, not allowed to preempt again"

    @staticmethod
    def share_limited(quota: str, parent: str, resource: str) -> str:
        return (
            f"limited quotaName:{quota}, limited resKey:{resource}, the rest of {parent} is held "
            "for sibling quotas (their min or fair share)"
        )

    @staticmethod
    def parent_quota(quota: str) -> str:
        return (
            f"quota {quota} is a parent quota ({QUOTA_IS_PARENT_LABEL}=true) and takes no jobs; "
            "label the job with one of its child quotas"
        )

    @staticmethod
    def guarantee_reclaiming(quotas: list[str]) -> str:
        return f"; reclaiming borrowed quota from {','.join(quotas)} (within min)"

    @staticmethod
    def guarantee_waiting(quotas: list[str]) -> str:
        waited = ",".join(quotas)
        return f"; within min, waiting for {waited} to return borrowed quota (nothing to reclaim now)"

    @staticmethod
    def reclaimed_event(name: str) -> str:
        return f"resources reclaimed, queueUnit {name} is ready for re-scheduling"


# --- Multi-tenancy: quota bindings, same-named quotas, the user priority cap ---------------------

#: Koordinator's quota annotation (a JSON array of namespace names): besides its own namespace, the
#: namespaces whose jobs may use the quota (koord-scheduler reads it since Koordinator v1.4).
QUOTA_NAMESPACES_ANNOTATION: Final = "quota.scheduling.koordinator.sh/namespaces"
#: Set by admins on an ElasticQuota: the largest priority its jobs may ask for with
#: ``scheduling.x-k8s.io/priority`` (a 32-bit integer).
MAX_USER_PRIORITY_ANNOTATION: Final = "koord-queue/max-user-priority"
#: Set by admins on an ElasticQuota: the PriorityClasses its jobs may take their priority from (a
#: JSON array of names; absent: every class). docs/compatibility.md#priority-cap
ALLOWED_PRIORITY_CLASSES_ANNOTATION: Final = "koord-queue/allowed-priority-classes"
#: Written by the reconciler on an ElasticQuota that is ignored because another quota holds its name.
IGNORED_REASON_ANNOTATION: Final = "koord-queue/ignored-reason"
#: The ConfigMap (in ``koord-queue``) the reconciler keeps for the quota-binding admission policy.
QUOTA_BINDINGS_CONFIGMAP: Final = "koord-queue-quota-bindings"
#: Keys of that ConfigMap: ``q.<quota>`` = " ns1 ns2 " (the bound namespaces, space-delimited with a
#: leading and trailing space), ``ns.<namespace>`` = "q1, q2" (the quotas usable there, for the
#: denial message) and ``enforce`` = "true" / "false" (the configuration switch).
QUOTA_BINDING_QUOTA_PREFIX: Final = "q."
QUOTA_BINDING_NAMESPACE_PREFIX: Final = "ns."
QUOTA_BINDING_ENFORCE_KEY: Final = "enforce"

#: Warning on an ElasticQuota ignored because another ElasticQuota holds its name.
DUPLICATE_QUOTA_NAME_REASON: Final = "DuplicateQuotaName"
#: Written by the reconciler on the Queue of a quota name: the namespace of the ElasticQuota that
#: holds the name (docs/compatibility.md#same-named-quotas). The first quota to claim a name keeps
#: it until it is deleted, whatever the creation timestamps say.
QUOTA_HOLDER_ANNOTATION: Final = "koord-queue/quota-namespace"
#: Key prefix in the quota-bindings ConfigMap: ``holder.<quota>`` = the namespace holding the name,
#: read by the quota-name admission policy (manifests/quota-name-policy.yaml).
QUOTA_BINDING_HOLDER_PREFIX: Final = "holder."
# --- Quota guarantees: min, borrowing, lending (docs/compatibility.md#quota-guarantees) -------

#: Koordinator's label for a quota that only groups children: it takes no jobs itself.
QUOTA_IS_PARENT_LABEL: Final = "quota.scheduling.koordinator.sh/is-parent"
#: Koordinator's label: ``"false"`` keeps the quota's unused ``min`` reserved (not lent to siblings).
QUOTA_ALLOW_LENT_LABEL: Final = "quota.scheduling.koordinator.sh/allow-lent-resource"
#: Ours: ``"true"`` lets the quota's units reclaim up to its fair share, not only its ``min``
#: (docs/compatibility.md#reclaim-of-fair-shares).
RECLAIM_FAIR_SHARE_LABEL: Final = "koord-queue/reclaim-fair-share"
#: Koordinator's annotation (a ResourceList as JSON): the quota's weight when siblings share spare
#: capacity of their parent; the default is the quota's ``max``.
QUOTA_SHARED_WEIGHT_ANNOTATION: Final = "quota.scheduling.koordinator.sh/shared-weight"
#: Published on each ElasticQuota (ResourceLists as JSON), in the places koord-scheduler uses:
#: what the quota may use now (its guarantee plus its fair share of spare capacity) and what it asks
#: for (usage plus waiting demand, capped at ``max``).
QUOTA_RUNTIME_ANNOTATION: Final = "quota.scheduling.koordinator.sh/runtime"
QUOTA_REQUEST_ANNOTATION: Final = "quota.scheduling.koordinator.sh/request"
#: Ours: ``used - min`` where positive (a ResourceList as JSON), for the printer column.
QUOTA_BORROWED_ANNOTATION: Final = "koord-queue/borrowed"
#: Ours: the quota's decayed average usage and when it was taken (JSON: ``at``, ``halfLife``,
#: ``usage``), written by the reconciler and read back when it starts
#: (docs/compatibility.md#fair-over-time).
QUOTA_USAGE_HISTORY_ANNOTATION: Final = "koord-queue/usage-history"

# --- Node pools (docs/pools.md) ---------------------------------------------------------------

#: Koordinator's labels on a pool's root quota (kept by the profile controller): the profile's name,
#: the tree id, and ``"true"``. A root labelled with both ``is-root`` and ``profile`` is read with
#: its ``min`` as its limit (docs/pools.md#a-tree-roots-limit).
QUOTA_PROFILE_LABEL: Final = "quota.scheduling.koordinator.sh/profile"
QUOTA_TREE_ID_LABEL: Final = "quota.scheduling.koordinator.sh/tree-id"
QUOTA_IS_ROOT_LABEL: Final = "quota.scheduling.koordinator.sh/is-root"
#: Ours, on an ElasticQuota outside any pool: the quotas inside pools its units may be admitted
#: through, in order (docs/pools.md#fallback-between-pools).
POOL_QUOTAS_ANNOTATION: Final = "koord-queue/pool-quotas"
#: Ours, on a job (copied to its unit): the pools it accepts, in its order of preference.
POOLS_ANNOTATION: Final = "koord-queue/pools"

#: Warning on an ElasticQuota whose koord-queue-relevant annotation cannot be read.
INVALID_QUOTA_ANNOTATION_REASON: Final = "InvalidQuotaAnnotation"


def quota_not_bound_message(quota: str, namespace: str, usable: list[str] | tuple[str, ...]) -> str:
    """Why a unit (or, at the door, a job) of ``namespace`` may not use ``quota``.

    The quota-binding admission policy (manifests/quota-binding-policy.yaml) builds the same text
    in CEL; keep the two in step.
    """
    listed = ", ".join(usable) if usable else "none"
    return (
        f'quota "{quota}" is not bound to namespace "{namespace}"; quotas usable in {namespace}: '
        f"{listed}; use one of those, or ask a cluster admin to add {namespace} to the "
        f"{QUOTA_NAMESPACES_ANNOTATION} annotation of quota {quota}"
    )


def no_default_quota_message(namespace: str) -> str:
    """Why an unlabelled job of a namespace where queueing is mandatory stays held
    (docs/operations.md#mandatory-queueing)."""
    return (
        f"queueing is mandatory in namespace {namespace} and the job has no quota label, but no quota "
        f"is the namespace's default: the job stays held. Ask a cluster admin for an ElasticQuota named "
        f'"{namespace}" in namespace {namespace}, or one listing {namespace} in its '
        f"{QUOTA_NAMESPACES_ANNOTATION} annotation; or delete the job and create it again with the "
        f"label {QUOTA_NAME_LABEL}"
    )


def default_quota_ambiguous_message(namespace: str, quotas: list[str] | tuple[str, ...]) -> str:
    """Why an unlabelled job stays held when several quotas list its namespace."""
    return (
        f"queueing is mandatory in namespace {namespace} and the job has no quota label, but several "
        f"quotas are bound to the namespace ({', '.join(quotas)}) and none is named {namespace}: the "
        f"job stays held. Delete it and create it again with the label {QUOTA_NAME_LABEL} naming one "
        "of them"
    )


def duplicate_quota_message(namespace: str, name: str, holder_namespace: str) -> str:
    """Why the ElasticQuota ``namespace/name`` is ignored (its event and its annotation).

    The quota-name admission policy (manifests/quota-name-policy.yaml) refuses such a quota at the
    door with the first part of this text; keep the two in step.
    """
    return (
        f"{quota_name_taken_message(name, holder_namespace)}; ElasticQuota {namespace}/{name} is "
        f"ignored: it serves no namespace and its limits count for nothing while "
        f"{holder_namespace}/{name} exists; give it another name, or delete it"
    )


def quota_name_taken_message(name: str, holder_namespace: str) -> str:
    """The door's refusal of a second ElasticQuota called ``name`` (and the start of the ignored
    one's reason)."""
    return (
        f'quota name "{name}" is already held by ElasticQuota {holder_namespace}/{name}: quota names '
        f"are unique across the cluster (jobs name their quota by name only)"
    )


# --- Running timeout (docs/compatibility.md#running-timeout) -------------------------------------

#: Ours: Warning on the unit and its job when the pods did not all run within ``runningTimeout``.
#: ``Evicted`` condition reason of a unit queued again after its admitted pods changed size.
EVICTED_RESIZED_REASON: Final = "PodSetsResized"
RUNNING_TIMEOUT_REASON: Final = "RunningTimeout"
#: Ours: Warning on the unit when ``partialRunningTimeout`` shrinks its admission.
PARTIAL_RUNNING_TIMEOUT_REASON: Final = "PartialRunningTimeout"


def running_timeout_message(not_running: int, replicas: int, timeout: str, backoff: str) -> str:
    """The ``RunningTimeout`` event: what was late, and what happens next."""
    return (
        f"{not_running} of {replicas} admitted pod(s) not running {timeout} after admission "
        f"(runningTimeout): the job is suspended, its quota is released, and it is queued again "
        f"in {backoff}"
    )


#: Ours: Warning on the unit and its job when an admitted, resumed job had no pod at all for
#: ``noPodsTimeout`` (docs/compatibility.md#jobs-without-pods).
NO_PODS_AFTER_ADMISSION_REASON: Final = "NoPodsAfterAdmission"


def no_pods_message(timeout: str, backoff: str) -> str:
    """The ``NoPodsAfterAdmission`` event: what was seen, and what happens next."""
    return (
        f"the job was admitted and resumed but had no pod for {timeout} (noPodsTimeout): it is "
        f"suspended, its quota is released, and it is queued again in {backoff}; its next "
        f"admission resumes it, which makes its controller create its pods again"
    )


def partial_running_timeout_message(pod_set: str, running: int, replicas: int, timeout: str) -> str:
    """The ``PartialRunningTimeout`` event: the pod set whose admission shrinks."""
    return (
        f"pod set {pod_set}: {running} of {replicas} admitted pod(s) running after {timeout} "
        f"(partialRunningTimeout): the admission shrinks to {running} and the quota of the others "
        f"is released"
    )


# --- Preemption priority and non-preempting jobs (docs/compatibility.md#preemption-priority) -----

#: Ours, on a job (immutable once it exists): the priority its unit is *preempted* at, at least its
#: scheduling priority and capped like it; copied to the unit's ``spec.preemptionPriority``.
PREEMPTION_PRIORITY_ANNOTATION: Final = "koord-queue/preemption-priority"
#: Ours, on a job (immutable once it exists): ``Never`` makes its unit wait for room and never mark a
#: victim, as a PriorityClass's ``preemptionPolicy: Never`` does; copied to ``spec.preemptionPolicy``.
PREEMPTION_POLICY_ANNOTATION: Final = "koord-queue/preemption-policy"
#: The two values of ``preemptionPolicy``, spelled as Kubernetes spells them (``core/v1``).
PREEMPTION_POLICY_NEVER: Final = "Never"
PREEMPTION_POLICY_PREEMPT: Final = "PreemptLowerPriority"
PREEMPTION_POLICIES: Final = (PREEMPTION_POLICY_PREEMPT, PREEMPTION_POLICY_NEVER)
#: The waiting message's suffix of a unit that does not preempt (instead of "; preempt failed").
NON_PREEMPTING_SUFFIX: Final = "; does not preempt (preemptionPolicy Never): waiting for room"
#: The preemption error (decision log) of a unit that does not preempt.
NON_PREEMPTING_ERROR: Final = "preemptionPolicy is Never: this queueUnit does not preempt"
#: Ours: Warning on a job whose preemption priority was below its priority and was raised to it.
PREEMPTION_PRIORITY_RAISED_REASON: Final = "PreemptionPriorityRaised"
