{{/* Labels every object of the chart carries (the selectors use the name only). */}}
{{- define "sw.labels" -}}
app.kubernetes.io/name: scheduling-webhook
app.kubernetes.io/part-of: hopsworks
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
{{- end -}}

{{/*
The serving certificate and its CA for certs.mode helm, computed once per render (cached in
.Values) so that the Secrets and the caBundle agree. The CA is read back from the cluster on
upgrade and never replaced while its Secret holds one; the serving certificate is reused until it
is within renewBeforeDays of its end, then issued again from the same CA.
*/}}
{{- define "sw.helmCerts" -}}
{{- if not (hasKey .Values "__certs") -}}
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
