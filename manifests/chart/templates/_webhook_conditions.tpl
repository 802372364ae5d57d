{{- /*
Generated from webhook/core/webhook_conditions.py by `make manifests`
(tests/support/webhook_conditions_template.py): edit the module, not this file.
The pods a pod webhook must see; `decided`: in the namespaces the compiled policies decide.
*/}}
{{- define "sw.needsThePodWebhooks" -}}
matchConditions:
  - name: needs-the-webhook
    expression: >-
{{- if .decided }}
      (has(object.metadata.annotations) && object.metadata.annotations.exists(k,
      (k.startsWith('scheduling.hopsworks.ai/') &&
      k != 'scheduling.hopsworks.ai/priority-class' &&
      k != 'scheduling.hopsworks.ai/affinity' &&
      k != 'scheduling.hopsworks.ai/anti-affinity' &&
      k != 'scheduling.hopsworks.ai/policy-refusal') ||
      k.startsWith('kueue.x-k8s.io/') || k.contains('gpu') || k.contains('runai') ||
      k.startsWith('kai.scheduler/') || k == 'pod-group-name')) ||
      (has(object.metadata.labels) && object.metadata.labels.exists(k,
      k.startsWith('scheduling.hopsworks.ai/') || k.startsWith('kueue.x-k8s.io/') || k.contains('gpu') ||
      (k.startsWith('runai') && k != 'runai/queue') ||
      (k.startsWith('kai.scheduler/') && k != 'kai.scheduler/preemptibility'))) ||
      has(object.spec.resourceClaims) ||
      (has(object.metadata.ownerReferences) && object.metadata.ownerReferences.size() > 0 &&
      !(has(object.metadata.ownerReferences[0].apiVersion) && has(object.metadata.ownerReferences[0].kind) &&
      object.metadata.ownerReferences[0].apiVersion + ' ' + object.metadata.ownerReferences[0].kind in
      ['apps/v1 DaemonSet', 'apps/v1 Deployment', 'apps/v1 ReplicaSet', 'apps/v1 StatefulSet', 'batch/v1 CronJob', 'batch/v1 Job', 'v1 Pod', 'v1 ReplicationController'])) ||
      object.spec.containers.exists(c, has(c.resources) &&
      ((has(c.resources.limits) && c.resources.limits.exists(r, r.contains('gpu'))) ||
      (has(c.resources.requests) && c.resources.requests.exists(r, r.contains('gpu'))))) ||
      (has(object.spec.initContainers) && object.spec.initContainers.exists(c, has(c.resources) &&
      ((has(c.resources.limits) && c.resources.limits.exists(r, r.contains('gpu'))) ||
      (has(c.resources.requests) && c.resources.requests.exists(r, r.contains('gpu'))))))
{{- else }}
      (has(object.metadata.annotations) && object.metadata.annotations.exists(k,
      (k.startsWith('scheduling.hopsworks.ai/') &&
      k != 'scheduling.hopsworks.ai/priority-class') ||
      k.startsWith('kueue.x-k8s.io/') || k.contains('gpu') || k.contains('runai') ||
      k.startsWith('kai.scheduler/') || k == 'pod-group-name')) ||
      (has(object.metadata.labels) && object.metadata.labels.exists(k,
      k.startsWith('scheduling.hopsworks.ai/') || k.startsWith('kueue.x-k8s.io/') || k.contains('gpu') ||
      k.startsWith('runai') || k.startsWith('kai.scheduler/'))) ||
      object.spec.containers.exists(c, has(c.resources) &&
      ((has(c.resources.limits) && c.resources.limits.exists(r, r.contains('gpu'))) ||
      (has(c.resources.requests) && c.resources.requests.exists(r, r.contains('gpu'))))) ||
      (has(object.spec.initContainers) && object.spec.initContainers.exists(c, has(c.resources) &&
      ((has(c.resources.limits) && c.resources.limits.exists(r, r.contains('gpu'))) ||
      (has(c.resources.requests) && c.resources.requests.exists(r, r.contains('gpu'))))))
{{- end }}
{{- end -}}
