{{- define "alignflow.mlflowServiceAccountName" -}}
{{- if .Values.mlflow.serviceAccount.create }}
{{- default (printf "%s-mlflow" (include "alignflow.fullname" .)) .Values.mlflow.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.mlflow.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Host headers the server accepts: `mlflow.allowedHosts`, or else the Service's in-cluster names (with and
without the port), localhost for `kubectl port-forward`, and the host of `mlflow.externalUrl`.
Usage: {{ include "alignflow.mlflowAllowedHosts" . }}
*/}}
{{- define "alignflow.mlflowAllowedHosts" -}}
{{- if .Values.mlflow.allowedHosts }}
{{- .Values.mlflow.allowedHosts }}
{{- else }}
{{- $service := printf "%s-mlflow" (include "alignflow.fullname" .) }}
{{- $hosts := list "localhost" "localhost:*" "127.0.0.1" "127.0.0.1:*" }}
{{- range list $service (printf "%s.%s" $service .Release.Namespace) (printf "%s.%s.svc" $service .Release.Namespace) (printf "%s.%s.svc.cluster.local" $service .Release.Namespace) }}
{{- $hosts = append (append $hosts .) (printf "%s:5000" .) }}
{{- end }}
{{- with .Values.mlflow.externalUrl }}
{{- $hosts = append $hosts (urlParse .).host }}
{{- end }}
{{- join "," $hosts }}
{{- end }}
{{- end }}
