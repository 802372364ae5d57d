"""The names of the labels and annotations the rules read and write, ours and other systems'.

One place for each name, so that a rule, a cache and a test cannot spell it two ways.
"""

from __future__ import annotations

# The labels and annotations on namespaces that make a project and carry its scheduling choices.
PROJECT_LABEL = "hopsworks.ai/project"
DEPARTMENT_LABEL = "hopsworks.ai/department"
RUNAI_QUEUE_LABEL = "runai/queue"
RUNAI_PROJECT_ID_LABEL = "hopsworks.ai/runai-project-id"
# Set by the leader on a project namespace once its admission policy parameters are written: the
# policies' bindings select it, so a namespace is never judged by them before it has parameters.
ADMISSION_POLICIES_LABEL = "scheduling.hopsworks.ai/admission-policies"
AVAILABLE_ANNOTATION = "scheduling.hopsworks.ai/available"
DEFAULTS_ANNOTATION = "scheduling.hopsworks.ai/defaults"
# A department move in progress (intent + lock, written only by this system).
RUNAI_MOVE_ANNOTATION = "scheduling.hopsworks.ai/runai-move"
# Pod keys.
AFFINITY_ANNOTATION = "scheduling.hopsworks.ai/affinity"
ANTI_AFFINITY_ANNOTATION = "scheduling.hopsworks.ai/anti-affinity"
TOPOLOGY_ANNOTATION = "scheduling.hopsworks.ai/topology"
# Says the workload chose its priority class itself, for a class the Priority admission plugin
# could have filled in (the cluster's globalDefault class); see `core.scheduling._priority`.
PRIORITY_CLASS_ANNOTATION = "scheduling.hopsworks.ai/priority-class"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_TOPOLOGY_ANNOTATION = "kueue.x-k8s.io/podset-required-topology"
# Kueue's plain-pod group (pkg/controller/jobs/pod/constants at v0.17.0): the pods carrying one name
# and one total count are admitted as one Workload, so Topology-Aware Scheduling places them together.
KUEUE_POD_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_POD_GROUP_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
KUEUE_POD_GROUP_SERVING_ANNOTATION = "kueue.x-k8s.io/pod-group-serving"
KUEUE_POD_GROUP_FAST_ADMISSION_ANNOTATION = "kueue.x-k8s.io/pod-group-fast-admission"
# Written by `core.owners` into the pod template of a Deployment that chose a topology unit: its
# replica count, so that a new count is a new template, a new ReplicaSet and a new pod group.
GROUP_REPLICAS_ANNOTATION = "scheduling.hopsworks.ai/group-replicas"
# What Kueue's pod webhook sets on a pod it manages: the label and the scheduling gate it lifts on
# admission (constants.ManagedByKueueLabelKey, podconstants.SchedulingGateName).
KUEUE_MANAGED_LABEL = "kueue.x-k8s.io/managed"
KUEUE_ADMISSION_GATE = "kueue.x-k8s.io/admission"
MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"

# The Deployment controller's annotation on a ReplicaSet: the Deployment's replica count
# (k8s.io/kubernetes pkg/controller/deployment/util: DesiredReplicasAnnotation).
DESIRED_REPLICAS_ANNOTATION = "deployment.kubernetes.io/desired-replicas"

# Run:ai's own admission webhooks: while either Deployment is down, no pod can be created in a
# bound namespace (their webhooks fail closed). Watched read-only; see `core.runai_health`.
RUNAI_NAMESPACE = "runai"
RUNAI_ADMISSION_DEPLOYMENTS = ("runai-admission-controller", "admission")
