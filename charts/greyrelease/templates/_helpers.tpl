{{/*
The labels of every object: those of config/ (app.kubernetes.io/name, and app.kubernetes.io/component when
given) and the ones Helm charts carry. Call with (dict "ctx" $ "component" "controller"); "component" may be
left out.
*/}}
{{- define "greyrelease.labels" -}}
app.kubernetes.io/name: greyrelease
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{ include "greyrelease.helmLabels" .ctx }}
{{- end }}

{{/* The labels the chart adds to those of config/: chart, instance, version, managed-by. */}}
{{- define "greyrelease.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The controller's pods: the Deployment's selector, the webhook and metrics Services' selector. */}}
{{- define "greyrelease.selectorLabels" -}}
app.kubernetes.io/name: greyrelease
app.kubernetes.io/component: controller
{{- end }}

{{- define "greyrelease.image" -}}
{{- $repo := required "image.repository: the controller's image repository is required" .Values.image.repository -}}
{{- if .Values.image.digest -}}
{{ $repo }}@{{ .Values.image.digest }}
{{- else -}}
{{ $repo }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/* replicas: its value, or shards when empty; checked against shards. */}}
{{- define "greyrelease.replicas" -}}
{{- $shards := int .Values.shards -}}
{{- $replicas := $shards -}}
{{- if not (kindIs "invalid" .Values.replicas) -}}
{{- $replicas = int .Values.replicas -}}
{{- end -}}
{{- if and (gt $replicas 0) (lt $replicas $shards) -}}
{{- fail (printf "replicas: %d is fewer than shards (%d): each shard needs a replica that holds its Lease" $replicas $shards) -}}
{{- end -}}
{{ $replicas }}
{{- end }}

{{/* The ServiceAccount's namespace-qualified subject of every binding. */}}
{{- define "greyrelease.subject" -}}
- kind: ServiceAccount
  name: greyrelease-controller
  namespace: {{ .Release.Namespace }}
{{- end }}
