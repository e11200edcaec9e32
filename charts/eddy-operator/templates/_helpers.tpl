{{- define "eddy-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- /*
The objects' names: fullnameOverride, else the release name when it already holds the chart's
name (`helm install eddy-operator ...` names everything `eddy-operator`), else
<release>-<name>. Cut to 63 characters, what a label value or a DNS label may hold.
*/ -}}
{{- define "eddy-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "eddy-operator.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- /*
The leader-election Lease: one per release, so two releases in one namespace (operators
splitting a cluster by watchNamespaces) each elect their own leader.
*/ -}}
{{- define "eddy-operator.leaseName" -}}
{{- if .Values.leaseName -}}
{{- .Values.leaseName -}}
{{- else -}}
{{- include "eddy-operator.fullname" . | trunc 56 | trimSuffix "-" -}}-leader
{{- end -}}
{{- end -}}
{{- define "eddy-operator.workerImage" -}}
{{- if .Values.workerImage.digest -}}
{{ .Values.workerImage.repository }}@{{ .Values.workerImage.digest }}
{{- else -}}
{{ .Values.workerImage.repository }}:{{ .Values.workerImage.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}
{{- define "eddy-operator.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}
{{- define "eddy-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}{{ default (include "eddy-operator.fullname" .) .Values.serviceAccount.name }}{{- else -}}{{ default "default" .Values.serviceAccount.name }}{{- end -}}
{{- end -}}
{{- define "eddy-operator.labels" -}}
app.kubernetes.io/name: {{ include "eddy-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}
{{- define "eddy-operator.selector" -}}
app.kubernetes.io/name: {{ include "eddy-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- /*
Whether a monitor (ServiceMonitor, PodMonitor) is rendered: its `enabled` value when set,
else whether the cluster serves the prometheus-operator API.
*/ -}}
{{- define "eddy-operator.monitorEnabled" -}}
{{- $enabled := index . 0 -}}{{- $root := index . 1 -}}
{{- if kindIs "bool" $enabled -}}
{{- if $enabled }}true{{ end -}}
{{- else if $root.Capabilities.APIVersions.Has "monitoring.coreos.com/v1" -}}
true
{{- end -}}
{{- end -}}
