{{/* The release's resource name. */}}
{{- define "tiered.fullname" -}}
{{- printf "%s-tiered" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tiered.labels" -}}
app.kubernetes.io/name: tiered
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tiered.selectorLabels" -}}
app.kubernetes.io/name: tiered
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tiered.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tiered.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The image: by digest when one is given, else by tag. An image is required. */}}
{{- define "tiered.image" -}}
{{- $repository := required "image.repository: the registry path of the image built from the repository's Dockerfile" .Values.image.repository -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repository .Values.image.tag -}}
{{- end -}}
{{- end -}}

{{/* Secrets: an existing Secret, or the chart's own (generated once, kept by lookup). */}}
{{- define "tiered.adminSecretName" -}}
{{- default (printf "%s-admin" (include "tiered.fullname" .)) .Values.auth.existingSecret -}}
{{- end -}}

{{- define "tiered.clusterSecretName" -}}
{{- default (printf "%s-cluster" (include "tiered.fullname" .)) .Values.cluster.existingSecret -}}
{{- end -}}
