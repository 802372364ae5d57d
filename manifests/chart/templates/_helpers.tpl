{{/* Labels every object of the chart carries (the selectors use the name only, so that a second
release or a chart upgrade never changes what a selector picks). */}}
{{- define "sw.labels" -}}
app.kubernetes.io/name: scheduling-webhook
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: hopsworks
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/* The server container's own environment; extraEnv comes after it and may not rename any of it. */}}
{{- define "sw.env" -}}
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
# Leader-election identity.
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
# The Lease named in the Role's resourceNames.
- name: SCHEDULING_WEBHOOK_LEASE_NAME
  value: scheduling-webhook-leader
# This system's own identity (system:serviceaccount:<namespace>:<this>): the guards let
# it make the department moves they refuse to everyone else.
- name: SERVICE_ACCOUNT_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.serviceAccountName
# G2: who may change run_ai_enable. Comma-separated; `group:NAME` is a group, anything
# else a user name. Kept out of the ConfigMap it guards.
- name: SCHEDULING_WEBHOOK_INSTALLERS
  value: {{ join "," .Values.installers | quote }}
# G5: who may name a pod's PodGroup (KAI's pod grouper); same form as the installers.
- name: SCHEDULING_WEBHOOK_POD_GROUPERS
  value: {{ join "," .Values.podGroupers | quote }}
# admissionPolicies.enabled: the leader writes the compiled admission policies, or (false)
# deletes what an enabled install wrote.
- name: SCHEDULING_WEBHOOK_ADMISSION_POLICIES
  value: {{ .Values.admissionPolicies.enabled | quote }}
{{- end -}}

{{/* CEL, true when the request's caller is one of the installers: the same reading of the
`installers` value as the server's (trimmed; `group:NAME` a group, anything else a user name).
JSON string lists are CEL list literals. A request may carry no groups at all. */}}
{{- define "sw.installerCaller" -}}
{{- $users := list -}}
{{- $groups := list -}}
{{- range .Values.installers -}}
{{- $i := trim . -}}
{{- if hasPrefix "group:" $i -}}
{{- $groups = append $groups (trimPrefix "group:" $i) -}}
{{- else if $i -}}
{{- $users = append $users $i -}}
{{- end -}}
{{- end -}}
{{- $terms := list -}}
{{- if $users -}}
{{- $terms = append $terms (printf "request.userInfo.username in %s" (toJson $users)) -}}
{{- end -}}
{{- if $groups -}}
{{- $terms = append $terms (printf "(has(request.userInfo.groups) && request.userInfo.groups.exists(g, g in %s))" (toJson $groups)) -}}
{{- end -}}
{{- if $terms -}}{{ join " || " $terms }}{{- else -}}false{{- end -}}
{{- end -}}

{{/* "true" when Kueue is on: this chart's kueue_installed, or the umbrella chart's switch. */}}
{{- define "sw.kueueOn" -}}
{{- $hopsworks := index (.Values.global | default dict) "_hopsworks" | default dict -}}
{{- $kueue := $hopsworks.kueue | default dict -}}
{{- if or .Values.variables.kueue_installed $kueue.enabled -}}true{{- end -}}
{{- end -}}

{{/* What the schema cannot say. Each refusal is one message naming the values. */}}
{{- define "sw.checks" -}}
{{- $v := .Values.variables -}}
{{- if and $v.run_ai_enable (include "sw.kueueOn" .) -}}
{{- fail "Kueue and Run:ai cannot both be on: variables.run_ai_enable is true and Kueue is on (variables.kueue_installed or global._hopsworks.kueue.enabled); a cluster uses Kueue, Run:ai, or neither" -}}
{{- end -}}
{{- if $v.run_ai_enable -}}
{{- range $key := list "run_ai_client_id" "run_ai_client_secret_name" "run_ai_client_secret_key" -}}
{{- if not (index $v $key) -}}
{{- fail (printf "variables.run_ai_enable is true but variables.%s is empty" $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if has .Release.Namespace (list "default" "kube-system" "kube-public" "kube-node-lease") -}}
{{- fail (printf "the release namespace %q is a system namespace: install into a namespace of its own (helm install -n NAMESPACE)" .Release.Namespace) -}}
{{- end -}}
{{- if and .Values.networkPolicy.enabled (not .Values.networkPolicy.apiserverCIDRs) -}}
{{- fail "networkPolicy.apiserverCIDRs: name the addresses the kube-apiserver connects from (e.g. the control-plane nodes' IPs as /32); without them the policy would refuse the apiserver and, the pod webhooks failing closed, every project pod" -}}
{{- end -}}
{{- if and (eq .Values.certs.mode "certManager") .Values.certs.secret.caBundle -}}
{{- fail "certs.secret.caBundle is set but certs.mode is certManager: cert-manager injects the CA" -}}
{{- end -}}
{{- $chartLabels := include "sw.labels" . | fromYaml -}}
{{- range $path, $labels := dict "podLabels" .Values.podLabels "metrics.serviceMonitor.labels" .Values.metrics.serviceMonitor.labels -}}
{{- range $key, $_ := $labels -}}
{{- if hasKey $chartLabels $key -}}
{{- fail (printf "%s.%s is a label the chart sets itself (the Service, the PodDisruptionBudget and the spread select on them): choose another key" $path $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $own := list -}}
{{- range (include "sw.env" . | fromYamlArray) -}}
{{- $own = append $own .name -}}
{{- end -}}
{{- range .Values.extraEnv -}}
{{- if has .name $own -}}
{{- fail (printf "extraEnv names %s, which the chart sets itself: choose another name" .name) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The serving certificate and its CA for certs.mode helm, computed once per render (cached in
.Values) so that the Secrets and the caBundle agree. The CA is read back from the cluster on
upgrade and never replaced while its Secret holds one; the serving certificate is reused until it
is within renewBeforeDays of its end, then issued again from the same CA.
*/}}
{{- define "sw.helmCerts" -}}
{{- if not (hasKey .Values "__certs") -}}
{{- /* kube-system exists in every cluster, so it is missing only where helm has no cluster to
ask: helm template (Argo CD renders that way), --dry-run=client, and helm lint (which reports a
fail as information only). There the Secrets' lookup finds nothing either, and a CA issued at each
render would replace the one the pods serve with. */ -}}
{{- if and (not (lookup "v1" "Namespace" "" "kube-system")) (not .Values.certs.helm.renderWithoutCluster) -}}
{{- fail "certs.mode helm keeps its CA in the cluster and reads it back at every upgrade; rendered without a cluster (helm template, Argo CD, --dry-run=client) it would issue a new CA each time. With GitOps use certs.mode certManager or secret (manifests/README.md, \"GitOps\"); to render once anyway, set certs.helm.renderWithoutCluster=true" -}}
{{- end -}}
{{- $service := printf "scheduling-webhook.%s.svc" .Release.Namespace -}}
{{- $names := list $service (printf "%s.cluster.local" $service) -}}
{{- $c := .Values.certs.helm -}}
{{- $caSecret := lookup "v1" "Secret" .Release.Namespace (printf "%s-ca" .Values.certs.secretName) | default dict -}}
{{- $tlsSecret := lookup "v1" "Secret" .Release.Namespace .Values.certs.secretName | default dict -}}
{{- $caData := $caSecret.data | default dict -}}
{{- $tlsData := $tlsSecret.data | default dict -}}
{{- $out := dict -}}
{{- if and (index $caData "tls.crt") (index $caData "tls.key") -}}
{{- $_ := set $out "caCrt" (index $caData "tls.crt") -}}
{{- $_ := set $out "caKey" (index $caData "tls.key") -}}
{{- else -}}
{{- $ca := genCA "scheduling-webhook CA" (int $c.caDays) -}}
{{- $_ := set $out "caCrt" ($ca.Cert | b64enc) -}}
{{- $_ := set $out "caKey" ($ca.Key | b64enc) -}}
{{- end -}}
{{- $notAfter := index ($tlsSecret.metadata | default dict) "annotations" | default dict -}}
{{- $notAfter = index $notAfter "scheduling.hopsworks.ai/not-after" | default "0" | int64 -}}
{{- $renewAt := sub $notAfter (mul (int $c.renewBeforeDays) 86400) -}}
{{- $sameCA := eq (index $tlsData "ca.crt" | default "") $out.caCrt -}}
{{- if and $sameCA (index $tlsData "tls.crt") (index $tlsData "tls.key") (lt (now | unixEpoch | int64) $renewAt) -}}
{{- $_ := set $out "tlsCrt" (index $tlsData "tls.crt") -}}
{{- $_ := set $out "tlsKey" (index $tlsData "tls.key") -}}
{{- $_ := set $out "notAfter" $notAfter -}}
{{- else -}}
{{- $ca := buildCustomCert $out.caCrt $out.caKey -}}
{{- $cert := genSignedCert $service nil $names (int $c.days) $ca -}}
{{- $_ := set $out "tlsCrt" ($cert.Cert | b64enc) -}}
{{- $_ := set $out "tlsKey" ($cert.Key | b64enc) -}}
{{- $_ := set $out "notAfter" (add (now | unixEpoch | int64) (mul (int $c.days) 86400)) -}}
{{- end -}}
{{- $_ := set .Values "__certs" $out -}}
{{- end -}}
{{- end -}}

{{/* The caBundle line of a webhook's clientConfig, or nothing (cert-manager's injector fills it). */}}
{{- define "sw.caBundle" -}}
{{- if eq .Values.certs.mode "helm" -}}
{{- include "sw.helmCerts" . -}}
caBundle: {{ .Values.__certs.caCrt }}
{{- else if and (eq .Values.certs.mode "secret") .Values.certs.secret.caBundle -}}
caBundle: {{ .Values.certs.secret.caBundle }}
{{- end -}}
{{- end -}}

{{/* The annotations of a webhook configuration: cert-manager's CA injection. */}}
{{- define "sw.webhookAnnotations" -}}
{{- if eq .Values.certs.mode "certManager" }}
  annotations:
    cert-manager.io/inject-ca-from: {{ .Release.Namespace }}/scheduling-webhook
{{- end -}}
{{- end -}}

{{/* The admission webhooks' port: the container's `admission` port and the Service's port of that
name, which the webhook configurations call; the console and the APIs stay on 8443. */}}
{{- define "sw.admissionPort" -}}9443{{- end -}}

{{/* The aggregated API's port: the container's `aggregated` port and the Service's port of that
name, which the APIService calls; the apiserver's front proxy alone is served there. */}}
{{- define "sw.aggregatedPort" -}}8445{{- end -}}

{{/* The file of the CA whose client certificates the admission port requires, or nothing. */}}
{{- define "sw.admissionClientCA" -}}
{{- if and .Values.certs.clientCAKey .Values.admission.clientCA -}}
{{- fail "certs.clientCAKey and admission.clientCA both name the admission port's client CA: set one" -}}
{{- else if .Values.certs.clientCAKey -}}
/certs/{{ .Values.certs.clientCAKey }}
{{- else if .Values.admission.clientCA -}}
/admission-client-ca/ca.crt
{{- end -}}
{{- end -}}

{{/* "true" where the compiled admission policies are rendered (14-admission-policies.yaml), else
empty. The webhooks hand the namespaces the leader labelled to the policies only then: a namespace
that carries the label where no policy exists (an apiserver before 1.36, `helm template` without
--api-versions, a label left by an earlier install) stays the webhooks' alone, never decided by
neither. */}}
{{- define "sw.policiesRendered" -}}
{{- if and .Values.admissionPolicies.enabled (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy") -}}
true
{{- end -}}
{{- end -}}

{{/* With the compiled admission policies on: the pod webhooks in namespaces the leader labelled
scheduling.hopsworks.ai/admission-policies=on (the policies decide their plain pods) are called only
for a pod that needs outside state or a rule not compiled: a GPU in a request or limit, an
annotation or label of this system (but the priority class one the policies read), of Run:ai,
KAI or Kueue. Every other pod there makes no webhook call. The condition is generated
(_webhook_conditions.tpl, from webhook/core/webhook_conditions.py). */}}
{{- define "sw.decidedNamespaces" -}}
namespaceSelector:
  matchExpressions:
    - key: hopsworks.ai/project
      operator: Exists
    - key: scheduling.hopsworks.ai/admission-policies
      operator: In
      values: ["on"]
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values: ["kube-system", "kube-public", "kube-node-lease", {{ .Release.Namespace | quote }}]
{{ include "sw.needsThePodWebhooks" (dict "decided" true) }}
{{- end -}}
