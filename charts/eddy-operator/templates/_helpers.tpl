{{- define "eddy-operator.name" -}}eddy-operator{{- end -}}
{{- define "eddy-operator.fullname" -}}{{ .Release.Name }}-eddy-operator{{- end -}}
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
