{{/* Chart name, truncated to the 63 characters Kubernetes names allow. */}}
{{- define "alignflow.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-qualified name. */}}
{{- define "alignflow.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* Standard labels (Helm's recommended set). */}}
{{- define "alignflow.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "alignflow.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "alignflow.selectorLabels" -}}
app.kubernetes.io/name: {{ include "alignflow.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "alignflow.serviceAccountName" -}}
{{- default (include "alignflow.fullname" .) .Values.serviceAccount.name }}
{{- end }}

{{- define "alignflow.launcherImage" -}}
{{- printf "%s:%s" .Values.images.launcher.repository .Values.images.launcher.tag }}
{{- end }}

{{- define "alignflow.trainerImage" -}}
{{- printf "%s:%s" .Values.images.trainer.repository .Values.images.trainer.tag }}
{{- end }}

{{/* The trainer image's vLLM variant (same repository, so the allow-list admits it); empty without vllmTag. */}}
{{- define "alignflow.trainerVllmImage" -}}
{{- if .Values.images.trainer.vllmTag }}
{{- printf "%s:%s" .Values.images.trainer.repository .Values.images.trainer.vllmTag }}
{{- end }}
{{- end }}

{{/* The tracking URI jobs use: the bundled server's Service, or the configured one. */}}
{{- define "alignflow.trackingUri" -}}
{{- if .Values.mlflow.enabled }}
{{- printf "http://%s-mlflow.%s.svc:5000" (include "alignflow.fullname" .) .Release.Namespace }}
{{- else }}
{{- .Values.mlflow.trackingUri }}
{{- end }}
{{- end }}

{{/*
Pod-level securityContext of every pod: the Pod Security "restricted" profile (non-root, RuntimeDefault
seccomp). UID/GID 1000 is the user the alignflow images create.
Usage: {{ include "alignflow.podSecurityContext" . | nindent 6 }}
*/}}
{{- define "alignflow.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 1000
runAsGroup: 1000
fsGroup: 1000
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
Container-level securityContext of every container ("restricted": no privilege escalation, no capabilities).
Usage: {{ include "alignflow.containerSecurityContext" . | nindent 10 }}
*/}}
{{- define "alignflow.containerSecurityContext" -}}
allowPrivilegeEscalation: false
privileged: false
capabilities:
  drop: ["ALL"]
{{- end }}

{{/*
`extraVolumes`, after checking each is a type the "restricted" profile admits (a hostPath would make every
pod of the chart inadmissible in a restricted namespace).
Usage: {{ include "alignflow.extraVolumes" . | nindent 8 }}
*/}}
{{- define "alignflow.extraVolumes" -}}
{{- $allowed := list "name" "configMap" "csi" "downwardAPI" "emptyDir" "ephemeral" "persistentVolumeClaim" "projected" "secret" }}
{{- range $volume := .Values.extraVolumes }}
{{- range $key, $_ := $volume }}
{{- if not (has $key $allowed) }}
{{- fail (printf "extraVolumes: volume %q is of type %s, which the Pod Security \"restricted\" profile forbids; use one of configMap, csi, downwardAPI, emptyDir, ephemeral, persistentVolumeClaim, projected, secret." (toString $volume.name) $key) }}
{{- end }}
{{- end }}
{{- end }}
{{- with .Values.extraVolumes }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{/*
An argument or env value as data: the kubelet expands `$(NAME)` in `args` and `env[].value`, so `$` is
doubled (`$$` is its escape) and a value like `$(AWS_SECRET_ACCESS_KEY)` stays literal.
Usage: {{ include "alignflow.kubeletLiteral" "some value" }}
*/}}
{{- define "alignflow.kubeletLiteral" -}}
{{- replace "$" "$$" (toString .) }}
{{- end }}
