{{/*
Helpers of the chart's jobs (pipeline upload, recurring retrain). Their containers run `alignflow`
directly: no shell reads any value, each value is one argument.
*/}}

{{- define "alignflow.kfpTokenDirectory" -}}
/var/run/secrets/kubeflow/pipelines
{{- end }}

{{- define "alignflow.retrainFilesDirectory" -}}
/etc/alignflow/retrain
{{- end }}

{{/*
Whether the retrain reads the repository's parameters file (and dataset manifest) from a ConfigMap.
*/}}
{{- define "alignflow.hasRetrainFiles" -}}
{{- if and .Values.retrain.enabled .Values.retrain.paramsFile }}true{{ end }}
{{- end }}

{{/*
What the retrain runs, as a JSON list of arguments: `--params-file=...` (the file names the pipeline) when
retrain.paramsFile is set, else the pipeline's name.
Usage: {{ include "alignflow.retrainTarget" . | fromJsonArray }}
*/}}
{{- define "alignflow.retrainTarget" -}}
{{- if include "alignflow.hasRetrainFiles" . }}
{{- list (printf "--params-file=%s/params.yaml" (include "alignflow.retrainFilesDirectory" .)) | toJson }}
{{- else }}
{{- list .Values.retrain.pipeline | toJson }}
{{- end }}
{{- end }}

{{/*
`--param=key=<JSON>` arguments of the retrain's pipeline parameters, as a JSON list (the CLI reads each
value as JSON). Chart settings first; `retrain.params` override them.
Usage: {{ include "alignflow.retrainParamArgs" . | fromJsonArray }}
*/}}
{{- define "alignflow.retrainParamArgs" -}}
{{- $defaults := dict "launcher_mode" "kubernetes" "trainer_image" (include "alignflow.trainerImage" .) "s3_secret" .Values.s3.credentialsSecret }}
{{- $args := list }}
{{- range $key, $value := merge (dict) .Values.retrain.params $defaults }}
{{- $args = append $args (printf "--param=%s=%s" $key (toJson $value)) }}
{{- end }}
{{- toJson $args }}
{{- end }}

{{/*
One container of a job: `alignflow ARGS...` in the launcher image, with the defaults ConfigMap as its
environment, S3 keys from the existing Secret, the KFP token when multi-user, and the extra env and mounts.
Usage: {{ include "alignflow.jobContainer" (dict "name" "upload" "args" (list "upload" "rlhf-ppo") "root" $) | nindent 8 }}
("retrainFiles" true in the dict mounts the retrain's parameters file, when there is one.)
*/}}
{{- define "alignflow.jobContainer" -}}
{{- $root := .root }}
{{- $values := $root.Values }}
{{- $args := list }}
{{- range .args }}
{{- $args = append $args (include "alignflow.kubeletLiteral" .) }}
{{- end -}}
- name: {{ .name }}
  image: {{ include "alignflow.launcherImage" $root | quote }}
  imagePullPolicy: {{ $values.images.launcher.pullPolicy }}
  command: ["alignflow"]
  args:
    {{- toYaml $args | nindent 4 }}
  envFrom:
    - configMapRef:
        name: {{ include "alignflow.fullname" $root }}-defaults
  {{- $env := include "alignflow.jobEnv" $root }}
  {{- with trim $env }}
  env:
    {{- . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- include "alignflow.containerSecurityContext" $root | nindent 4 }}
  resources:
    {{- toYaml $values.jobResources | nindent 4 }}
  {{- $retrainFiles := and .retrainFiles (include "alignflow.hasRetrainFiles" $root) }}
  {{- if or $values.kfp.multiUser.enabled $values.extraVolumeMounts $retrainFiles }}
  volumeMounts:
    {{- if $values.kfp.multiUser.enabled }}
    - name: kfp-token
      mountPath: {{ include "alignflow.kfpTokenDirectory" $root }}
      readOnly: true
    {{- end }}
    {{- if $retrainFiles }}
    - name: retrain-files
      mountPath: {{ include "alignflow.retrainFilesDirectory" $root }}
      readOnly: true
    {{- end }}
    {{- with $values.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- end }}
{{- end }}

{{/*
Environment of the jobs beyond the ConfigMap: S3 keys by Secret reference, the KFP token's path, extraEnv.
Usage: {{ include "alignflow.jobEnv" . | nindent 4 }}
*/}}
{{- define "alignflow.jobEnv" -}}
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
{{- if .Values.kfp.multiUser.enabled }}
- name: KFP_TOKEN_PATH
  value: {{ printf "%s/token" (include "alignflow.kfpTokenDirectory" .) | quote }}
- name: KF_PIPELINES_SA_TOKEN_PATH
  value: {{ printf "%s/token" (include "alignflow.kfpTokenDirectory" .) | quote }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Pod-level settings of a job's pod (everything but the containers): its ServiceAccount without the API
token (the jobs talk to KFP, not to Kubernetes), the "restricted" securityContext, the volumes.
Usage: {{ include "alignflow.jobPodSettings" . | nindent 6 }}
*/}}
{{- define "alignflow.jobPodSettings" -}}
restartPolicy: Never
serviceAccountName: {{ include "alignflow.serviceAccountName" . }}
automountServiceAccountToken: false
securityContext:
  {{- include "alignflow.podSecurityContext" . | nindent 2 }}
{{- if or .Values.kfp.multiUser.enabled .Values.extraVolumes (include "alignflow.hasRetrainFiles" .) }}
volumes:
  {{- if .Values.kfp.multiUser.enabled }}
  - name: kfp-token
    projected:
      sources:
        - serviceAccountToken:
            audience: {{ .Values.kfp.multiUser.tokenAudience | quote }}
            expirationSeconds: {{ .Values.kfp.multiUser.tokenExpirationSeconds }}
            path: token
  {{- end }}
  {{- if include "alignflow.hasRetrainFiles" . }}
  - name: retrain-files
    configMap:
      name: {{ include "alignflow.fullname" . }}-retrain
  {{- end }}
  {{- with include "alignflow.extraVolumes" . }}
  {{- . | nindent 2 }}
  {{- end }}
{{- end }}
{{- end }}
