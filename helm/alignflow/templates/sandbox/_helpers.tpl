{{/* The sandbox service's name (Deployment, Service, ServiceAccount, NetworkPolicy). */}}
{{- define "alignflow.sandboxName" -}}
{{- printf "%s-sandbox" (include "alignflow.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The sandbox image: `sandbox.image`, or else the trainer image (which holds trainer.sandbox). */}}
{{- define "alignflow.sandboxImage" -}}
{{- if .Values.sandbox.image.repository }}
{{- printf "%s:%s" .Values.sandbox.image.repository (default "latest" .Values.sandbox.image.tag) }}
{{- else }}
{{- include "alignflow.trainerImage" . }}
{{- end }}
{{- end }}
