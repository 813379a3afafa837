{{/* The runtime TrainJobs reference: `training.runtime.name`, else the chart's own, else Kubeflow Trainer's stock one. */}}
{{- define "alignflow.trainerRuntime" -}}
{{- if .Values.training.runtime.name }}
{{- .Values.training.runtime.name }}
{{- else if .Values.training.runtime.create }}
{{- printf "%s-torch" (include "alignflow.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- "torch-distributed" }}
{{- end }}
{{- end }}

{{/* Whether the launcher may create TrainJobs (jobKind trainjob or auto). Usage: {{ if include "alignflow.usesTrainJobs" . }} */}}
{{- define "alignflow.usesTrainJobs" -}}
{{- if ne .Values.training.jobKind "pytorchjob" }}true{{ end }}
{{- end }}

{{/* Whether the launcher may create PyTorchJobs (jobKind pytorchjob or auto). */}}
{{- define "alignflow.usesPyTorchJobs" -}}
{{- if ne .Values.training.jobKind "trainjob" }}true{{ end }}
{{- end }}

{{/*
Whether the chart installs its runtime: `training.runtime.create`, TrainJobs in use, and the cluster serving the
runtime's kind (`.Capabilities.APIVersions`), so one install works on a Trainer-only, an Operator-only and a both
cluster. `jobKind: trainjob` installs it whatever discovery says (`helm template` without `--api-versions`).
Usage: {{ if include "alignflow.installsRuntime" . }}
*/}}
{{- define "alignflow.installsRuntime" -}}
{{- $served := .Capabilities.APIVersions.Has (printf "trainer.kubeflow.org/v1alpha1/%s" .Values.training.runtime.kind) }}
{{- if and (include "alignflow.usesTrainJobs" .) .Values.training.runtime.create (or $served (eq .Values.training.jobKind "trainjob")) }}true{{ end }}
{{- end }}
