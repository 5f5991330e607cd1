{{/* Name of the Deployment, ServiceAccount, Service, roles and bindings. */}}
{{- define "mo.fullname" -}}
{{- default "maintenance-operator" .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Namespace of every namespaced object. */}}
{{- define "mo.namespace" -}}
{{- default .Release.Namespace .Values.namespace.name -}}
{{- end -}}

{{/*
Selector labels. `app.kubernetes.io/name: maintenance-operator` is fixed: the operator recognises
its own pods by it and never evicts them.
*/}}
{{- define "mo.selectorLabels" -}}
app.kubernetes.io/name: maintenance-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "mo.labels" -}}
{{ include "mo.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "mo.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Rules for the leader-election Lease (in the operator's namespace or leaseNamespace). */}}
{{- define "mo.leaseRules" -}}
# Create is needed when the Lease does not exist yet (a fresh install, or NVIDIA's operator never
# elected a leader: without it nobody would ever lead); resourceNames cannot restrict create (the
# name is not known before the object exists).
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["create"]
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  resourceNames: [{{ .Values.leaderElection.leaseName | quote }}]
  verbs: ["get", "update"]
{{- end -}}
