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

{{/* The tracking URI jobs use: the bundled server's Service, or the configured one. */}}
{{- define "alignflow.trackingUri" -}}
{{- if .Values.mlflow.enabled }}
{{- printf "http://%s-mlflow.%s.svc:5000" (include "alignflow.fullname" .) .Release.Namespace }}
{{- else }}
{{- .Values.mlflow.trackingUri }}
{{- end }}
{{- end }}

{{/*
Environment of the chart's jobs: defaults from the ConfigMap, S3 keys from the existing Secret.
Usage: {{ include "alignflow.jobEnv" . | nindent 12 }}
*/}}
{{- define "alignflow.jobEnv" -}}
- name: KFP_HOST
  value: {{ .Values.kfp.host | quote }}
- name: MLFLOW_TRACKING_URI
  value: {{ include "alignflow.trackingUri" . | quote }}
{{- if .Values.s3.endpoint }}
- name: AWS_ENDPOINT_URL
  value: {{ .Values.s3.endpoint | quote }}
{{- end }}
{{- if .Values.s3.credentialsSecret }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ .Values.s3.credentialsSecret }}
      key: AWS_ACCESS_KEY_ID
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.s3.credentialsSecret }}
      key: AWS_SECRET_ACCESS_KEY
{{- end }}
{{- end }}

{{/*
`--param k=v` flags of the retrain's pipeline parameters (values as JSON).
Usage: {{ include "alignflow.retrainParams" . }}
*/}}
{{- define "alignflow.retrainParams" -}}
{{- $params := dict "launcher_mode" "kubernetes" "trainer_image" (printf "%s:%s" .Values.images.trainer.repository .Values.images.trainer.tag) "s3_secret" .Values.s3.credentialsSecret }}
{{- range $key, $value := merge (dict) .Values.retrain.params $params }} --param {{ printf "%s=%s" $key (toJson $value) | squote }}{{- end }}
{{- end }}
