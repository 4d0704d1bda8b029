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

{{/* The name of an object with a suffix, "<fullname>-<suffix>": fullname shortened (and
trimmed of a trailing "-") so that the whole stays within 63 characters, the limit of a
Service's name (a DNS label) that every object's name keeps to. Call with (list . "suffix"). */}}
{{- define "hps.suffixedName" -}}
{{- $suffix := index . 1 -}}
{{- printf "%s-%s" (include "hps.fullname" (index . 0) | trunc (int (sub 62 (len $suffix))) | trimSuffix "-") $suffix -}}
{{- end }}

{{/* The serving workload's name: fullname, within 52 characters for a StatefulSet (its pods'
controller-revision-hash label, "<name>-<hash of up to 10 characters>", is a label value:
at most 63). */}}
{{- define "hps.servingName" -}}
{{- if include "hps.stateful" . -}}
{{- include "hps.fullname" . | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- include "hps.fullname" . -}}
{{- end -}}
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

{{/* Where the model-copy init container mounts the model volume (modelSource.type image):
apart from the image's own files at modelSource.image.path. */}}
{{- define "hps.modelCopyDir" -}}/hps-models{{- end }}

{{/* Topology: "true" or "" (templates test these as strings). */}}
{{- define "hps.stateful" -}}
{{- if .Values.persistence.enabled }}true{{ end }}
{{- end }}
{{/* A shared L2 with updates: a per-pod updater sidecar for L3, a Deployment for L2. */}}
{{- define "hps.sharedUpdates" -}}
{{- if and .Values.kafka.enabled (eq .Values.l2.mode "redis") }}true{{ end }}
{{- end }}

{{/* Kafka consumer groups. A group id must be unique per Kafka cluster: the defaults name
the namespace and the release; kafka.groupId replaces both (README: "Consumer groups"). */}}
{{- define "hps.groupBase" -}}
{{- default (printf "%s-%s" .Release.Namespace (include "hps.fullname" .)) .Values.kafka.groupId }}
{{- end }}
{{- define "hps.l2GroupId" -}}
{{- default (printf "%s-l2" (include "hps.groupBase" .)) .Values.kafka.groupId }}
{{- end }}
{{/* The per-pod group of the updater sidecar ($(POD_NAME): the container's env). */}}
{{- define "hps.l3GroupId" -}}
{{- include "hps.groupBase" . }}-l3-$(POD_NAME)
{{- end }}

{{/* Bytes of a Kubernetes quantity: a number, or digits with a suffix (1Gi, 512M, 1.5Gi). */}}
{{- define "hps.bytes" -}}
{{- if kindIs "string" . -}}
{{- $num := regexFind "^[0-9]+(\\.[0-9]+)?" . -}}
{{- $scale := dict "" 1 "m" 0.001 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 "P" 1000000000000000 "E" 1000000000000000000 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "Pi" 1125899906842624 "Ei" 1152921504606846976 -}}
{{- mulf (float64 $num) (get $scale (trimPrefix $num .)) | int64 -}}
{{- else -}}
{{- int64 . -}}
{{- end -}}
{{- end }}

{{/* The L3 volume (RocksDB, and the control plane's staged uploads): the value that sizes
it, l3.sizeLimit (the emptyDir) without persistence, persistence.size (the PVC) with it;
hps.l3Bytes is that size in bytes, "" when unbounded (l3.sizeLimit ""). */}}
{{- define "hps.l3SizeValue" -}}
{{- ternary "persistence.size" "l3.sizeLimit" (eq (include "hps.stateful" .) "true") -}}
{{- end }}
{{- define "hps.l3Bytes" -}}
{{- $size := ternary .Values.persistence.size .Values.l3.sizeLimit (eq (include "hps.stateful" .) "true") -}}
{{- if and (not (kindIs "invalid" $size)) (toString $size) }}{{ include "hps.bytes" $size }}{{ end -}}
{{- end }}

{{/* hps admin --max-staged-gb: controlPlane.maxStagedGb, or by default 40% of the L3 volume
where its uploads are staged (4 GiB of the default 10Gi; 4 when the volume is unbounded),
rounded down to 1/1000 GiB. hps.validateStaged refuses one not below the volume's size. */}}
{{- define "hps.maxStagedGb" -}}
{{- $gb := .Values.controlPlane.maxStagedGb -}}
{{- if not (kindIs "invalid" $gb) }}{{ $gb }}
{{- else }}{{ with include "hps.l3Bytes" . }}{{ divf (floor (divf (mulf . 0.4 1000) 1073741824)) 1000 }}{{ else }}4{{ end }}
{{- end -}}
{{- end }}

{{/* The distinct ports of host:port[,host:port...], as a JSON list (fromJsonArray). */}}
{{- define "hps.addressPorts" -}}
{{- $ports := list -}}
{{- range splitList "," . -}}
{{- $ports = append $ports (splitList ":" (trim .) | last | int) -}}
{{- end -}}
{{- $ports | uniq | toJson -}}
{{- end }}

{{/* Environment variable naming a librdkafka secret setting, e.g. HPS_KAFKA_SASL_PASSWORD
(ps.json names it; the container gets <name>_FILE, the path of the mounted secret). */}}
{{- define "hps.kafkaEnvName" -}}
{{- printf "HPS_KAFKA_%s" (. | upper | replace "." "_" | replace "-" "_") }}
{{- end }}

{{/* Which secrets the release mounts: "redis" and "kafka" as "true" or "". */}}
{{- define "hps.redisSecret" -}}
{{- $v := .Values -}}
{{- if and (eq $v.l2.mode "redis") $v.l2.redis.existingSecret }}true{{ end }}
{{- end }}
{{- define "hps.kafkaSecret" -}}
{{- $v := .Values -}}
{{- if and $v.kafka.enabled $v.kafka.existingSecret $v.kafka.secretKeys }}true{{ end }}
{{- end }}

{{/* Kafka TLS (kafka.tls.existingSecret): the librdkafka settings the chart sets in
update_source.hps_kafka_config, each to a file of that Secret, as JSON (setting -> file
name in the Secret; {} without it). hps.psConfig sets them, hps.secretMounts and
hps.secretVolumes mount the files, hps.validate refuses a kafka.config that sets them too. */}}
{{- define "hps.kafkaTLSDir" -}}/var/run/secrets/hps-kafka-tls{{- end }}
{{- define "hps.kafkaTLSFiles" -}}
{{- $t := .Values.kafka.tls -}}
{{- $files := dict -}}
{{- if $t.existingSecret -}}
{{- $_ := set $files "ssl.ca.location" "ca.crt" -}}
{{- if $t.clientCertificate -}}
{{- $_ := set $files "ssl.certificate.location" "tls.crt" -}}
{{- $_ := set $files "ssl.key.location" "tls.key" -}}
{{- end -}}
{{- end -}}
{{- toJson $files -}}
{{- end }}
{{/* Whether the release mounts kafka.tls.existingSecret: "true" or "". */}}
{{- define "hps.kafkaTLS" -}}
{{- if and .Values.kafka.enabled .Values.kafka.tls.existingSecret }}true{{ end }}
{{- end }}

{{/* Secrets reach the processes as files (mounted Secret volumes), never as environment
values: each NAME that ps.json names gets NAME_FILE, the file's path (hps.config reads it).
.redis / .kafka choose which; hps.secretMounts mounts the same ones, and with .kafka the
Kafka TLS files too (every container that talks to Kafka). */}}
{{- define "hps.secretEnv" -}}
{{- $v := .root.Values -}}
{{- if and .redis (include "hps.redisSecret" .root) }}
- name: HPS_REDIS_PASSWORD_FILE
  value: /var/run/secrets/hps-redis/password
{{- end }}
{{- if and .kafka (include "hps.kafkaSecret" .root) }}
{{- range $setting, $key := $v.kafka.secretKeys }}
- name: {{ include "hps.kafkaEnvName" $setting }}_FILE
  value: {{ printf "/var/run/secrets/hps-kafka/%s" $setting }}
{{- end }}
{{- end }}
{{- end }}

{{- define "hps.secretMounts" -}}
{{- if and .redis (include "hps.redisSecret" .root) }}
- {name: redis-password, mountPath: /var/run/secrets/hps-redis, readOnly: true}
{{- end }}
{{- if and .kafka (include "hps.kafkaSecret" .root) }}
- {name: kafka-secrets, mountPath: /var/run/secrets/hps-kafka, readOnly: true}
{{- end }}
{{- if and .kafka (include "hps.kafkaTLS" .root) }}
- {name: kafka-tls, mountPath: {{ include "hps.kafkaTLSDir" .root }}, readOnly: true}
{{- end }}
{{- end }}

{{/* The Secret volumes hps.secretMounts mounts (one file per secret, group-readable; the
Kafka TLS Secret's files are those hps.kafkaTLSFiles names). */}}
{{- define "hps.secretVolumes" -}}
{{- $v := .Values -}}
{{- if include "hps.redisSecret" . }}
- name: redis-password
  secret:
    secretName: {{ $v.l2.redis.existingSecret }}
    defaultMode: 0440
    items:
      - {key: {{ $v.l2.redis.passwordKey }}, path: password}
{{- end }}
{{- if include "hps.kafkaSecret" . }}
- name: kafka-secrets
  secret:
    secretName: {{ $v.kafka.existingSecret }}
    defaultMode: 0440
    items:
      {{- range $setting, $key := $v.kafka.secretKeys }}
      - {key: {{ $key }}, path: {{ $setting }}}
      {{- end }}
{{- end }}
{{- if include "hps.kafkaTLS" . }}
- name: kafka-tls
  secret:
    secretName: {{ $v.kafka.tls.existingSecret }}
    defaultMode: 0440
    items:
      {{- range $file := include "hps.kafkaTLSFiles" . | fromJson | values | sortAlpha }}
      - {key: {{ $file }}, path: {{ $file }}}
      {{- end }}
{{- end }}
{{- end }}

{{/* Probes of an `hps consume` container: /healthz on its metrics port answers from the
consumer loop (503 once its last pass is older than kafka.maxLoopAgeSeconds). */}}
{{- define "hps.updaterProbes" -}}
{{- $p := .Values.probes -}}
startupProbe:
  httpGet: {path: /healthz, port: upd-metrics}
  periodSeconds: {{ $p.updaterStartup.periodSeconds }}
  failureThreshold: {{ $p.updaterStartup.failureThreshold }}
livenessProbe:
  httpGet: {path: /healthz, port: upd-metrics}
  periodSeconds: {{ $p.liveness.periodSeconds }}
  failureThreshold: {{ $p.liveness.failureThreshold }}
  timeoutSeconds: {{ $p.liveness.timeoutSeconds }}
readinessProbe:
  httpGet: {path: /healthz, port: upd-metrics}
  periodSeconds: {{ $p.readiness.periodSeconds }}
  failureThreshold: {{ $p.readiness.failureThreshold }}
  timeoutSeconds: {{ $p.readiness.timeoutSeconds }}
{{- end }}

{{/* Triton's admin key and the control plane's token. The chart renders no secret value:
- the key: `hps serve --state-dir` writes a fresh random one at every start (mode 0600) into
  the in-memory volume admin-key, which the control plane mounts read-only and reads again
  at every reload (HPS_ADMIN_KEY_FILE); with admin.pinAdminKey that volume is instead the
  key admin-key of admin.existingSecret, and both containers read it (HPS_ADMIN_KEY_FILE);
- the token: only admin.existingSecret's key token, mounted into the control plane
  (--token-file); without it the mutating routes answer 403.
The file name is hps.triton.admin_key.KEY_FILE_NAME. */}}
{{- define "hps.adminKeyDir" -}}/var/run/hps-admin{{- end }}
{{- define "hps.adminKeyFile" -}}/var/run/hps-admin/hps-admin-key{{- end }}
{{- define "hps.adminTokenFile" -}}/var/run/secrets/hps/token{{- end }}

{{- define "hps.adminKeyEnv" -}}
- name: HPS_ADMIN_KEY_FILE
  value: {{ include "hps.adminKeyFile" . }}
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
