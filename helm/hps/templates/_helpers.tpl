{{/* Names, labels, images and the topology the values choose (README: "What runs where"). */}}

{{- define "hps.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "hps.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "hps.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "hps.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hps.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "hps.labels" -}}
helm.sh/chart: {{ include "hps.chart" . }}
{{ include "hps.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: hps
{{- end }}

{{/* Selector of the serving pods. */}}
{{- define "hps.servingSelector" -}}
{{ include "hps.selectorLabels" . }}
app.kubernetes.io/component: serving
{{- end }}

{{- define "hps.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "hps.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* An image reference: repository@digest, else repository:tag (tag defaults to appVersion). */}}
{{- define "hps.image" -}}
{{- $img := .image -}}
{{- if $img.digest }}
{{- printf "%s@%s" $img.repository $img.digest }}
{{- else }}
{{- printf "%s:%s" $img.repository (default .root.Chart.AppVersion $img.tag) }}
{{- end }}
{{- end }}

{{- define "hps.adminSecretName" -}}
{{- default (printf "%s-admin" (include "hps.fullname" .)) .Values.admin.existingSecret }}
{{- end }}

{{/* Topology: "true" or "" (templates test these as strings). */}}
{{- define "hps.stateful" -}}
{{- if .Values.persistence.enabled }}true{{ end }}
{{- end }}
{{/* A shared L2 with updates: a per-pod updater sidecar for L3, a Deployment for L2. */}}
{{- define "hps.sharedUpdates" -}}
{{- if and .Values.kafka.enabled (eq .Values.l2.mode "redis") }}true{{ end }}
{{- end }}

{{- define "hps.l2GroupId" -}}
{{- default (printf "%s-l2" (include "hps.fullname" .)) .Values.kafka.groupId }}
{{- end }}

{{/* Environment variable carrying a librdkafka secret setting, e.g. HPS_KAFKA_SASL_PASSWORD. */}}
{{- define "hps.kafkaEnvName" -}}
{{- printf "HPS_KAFKA_%s" (. | upper | replace "." "_" | replace "-" "_") }}
{{- end }}

{{/* Secrets as environment variables (never in the ConfigMap); .redis / .kafka choose. */}}
{{- define "hps.secretEnv" -}}
{{- $v := .root.Values -}}
{{- if and .redis (eq $v.l2.mode "redis") $v.l2.redis.existingSecret }}
- name: HPS_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $v.l2.redis.existingSecret }}
      key: {{ $v.l2.redis.passwordKey }}
{{- end }}
{{- if and .kafka $v.kafka.enabled $v.kafka.existingSecret }}
{{- range $setting, $key := $v.kafka.secretKeys }}
- name: {{ include "hps.kafkaEnvName" $setting }}
  valueFrom:
    secretKeyRef:
      name: {{ $v.kafka.existingSecret }}
      key: {{ $key }}
{{- end }}
{{- end }}
{{- end }}

{{- define "hps.adminEnv" -}}
- name: HPS_ADMIN_KEY_FILE
  value: /var/run/secrets/hps/admin-key
{{- end }}

{{- define "hps.redisTLSMount" -}}
{{- if and (eq .Values.l2.mode "redis") .Values.l2.redis.tls.enabled .Values.l2.redis.tls.existingSecret }}
- name: redis-tls
  mountPath: /var/run/secrets/hps-redis-tls
  readOnly: true
{{- end }}
{{- end }}

{{- define "hps.containerSecurity" -}}
securityContext:
  {{- toYaml .Values.securityContext | nindent 2 }}
{{- end }}
