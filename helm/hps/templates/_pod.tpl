{{/* The serving pod: init (model source, import), triton, control plane, updater sidecar. */}}
{{- define "hps.servingPod" -}}
{{- $v := .Values -}}
{{- $hpsImage := include "hps.image" (dict "image" $v.images.hps "root" .) -}}
metadata:
  labels:
    {{- include "hps.labels" . | nindent 4 }}
    app.kubernetes.io/component: serving
    {{- with $v.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    checksum/config: {{ include (print $.Template.BasePath "/configmap.yaml") . | sha256sum }}
    {{- with $v.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "hps.serviceAccountName" . }}
  automountServiceAccountToken: false
  enableServiceLinks: false
  terminationGracePeriodSeconds: {{ $v.terminationGracePeriodSeconds }}
  securityContext:
    {{- toYaml $v.podSecurityContext | nindent 4 }}
  {{- with $v.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if $v.triton.runtimeClassName }}
  runtimeClassName: {{ $v.triton.runtimeClassName }}
  {{- end }}
  {{- if $v.priorityClassName }}
  priorityClassName: {{ $v.priorityClassName }}
  {{- end }}
  {{- with $v.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if $v.topologySpreadConstraints }}
  topologySpreadConstraints:
    {{- range $v.topologySpreadConstraints }}
    {{- $c := deepCopy . }}
    {{- if not $c.labelSelector }}
    {{- $_ := set $c "labelSelector" (dict "matchLabels" (include "hps.servingSelector" $ | fromYaml)) }}
    {{- end }}
    - {{- toYaml $c | nindent 6 }}
    {{- end }}
  {{- end }}
  initContainers:
    {{- if eq $v.modelSource.type "demo" }}
    - name: model-demo
      image: {{ $hpsImage }}
      imagePullPolicy: {{ $v.images.hps.pullPolicy }}
      workingDir: /tmp  # a volume: the root filesystem is read-only
      command: [hps, demo, --dir, {{ $v.modelSource.mountPath | quote }}, --tables, {{ $v.modelSource.demo.tables | quote }}, --rows, {{ $v.modelSource.demo.rows | quote }}, --dim, {{ $v.modelSource.demo.dim | quote }}]
      {{- include "hps.containerSecurity" . | nindent 6 }}
      resources:
        {{- toYaml $v.importer.resources | nindent 8 }}
      volumeMounts:
        - {name: model-source, mountPath: {{ $v.modelSource.mountPath }}}
        - {name: tmp, mountPath: /tmp}
    {{- else if eq $v.modelSource.type "image" }}
    - name: model-copy
      image: {{ include "hps.image" (dict "image" $v.modelSource.image "root" .) }}
      imagePullPolicy: {{ $v.modelSource.image.pullPolicy }}
      # The model volume is mounted apart from the image's files, which it would hide.
      command: [cp, -R, {{ printf "%s/." $v.modelSource.image.path | quote }}, {{ include "hps.modelCopyDir" . | quote }}]
      {{- include "hps.containerSecurity" . | nindent 6 }}
      resources:
        {{- toYaml $v.importer.resources | nindent 8 }}
      volumeMounts:
        - {name: model-source, mountPath: {{ include "hps.modelCopyDir" . }}}
    {{- end }}
    - name: import
      image: {{ $hpsImage }}
      imagePullPolicy: {{ $v.images.hps.pullPolicy }}
      workingDir: /tmp  # a volume: the root filesystem is read-only
      command: [hps, import, --config, /etc/hps/ps-import.json, --quiet]
      {{- include "hps.containerSecurity" . | nindent 6 }}
      {{- $importSecrets := dict "root" . "redis" (not .Values.kafka.enabled) "kafka" false }}
      {{- with include "hps.secretEnv" $importSecrets | trim }}
      env:
        {{- . | nindent 8 }}
      {{- end }}
      resources:
        {{- toYaml $v.importer.resources | nindent 8 }}
      volumeMounts:
        - {name: config, mountPath: /etc/hps, readOnly: true}
        - {name: l3, mountPath: /var/lib/hps/l3}
        - {name: model-source, mountPath: {{ $v.modelSource.mountPath }}, readOnly: true}
        - {name: tmp, mountPath: /tmp}
        {{- with include "hps.redisTLSMount" . | trim }}
        {{- . | nindent 8 }}
        {{- end }}
        {{- with include "hps.secretMounts" $importSecrets | trim }}
        {{- . | nindent 8 }}
        {{- end }}
  containers:
    - name: triton
      image: {{ include "hps.image" (dict "image" $v.images.serving "root" .) }}
      imagePullPolicy: {{ $v.images.serving.pullPolicy }}
      workingDir: /tmp  # a volume: the root filesystem is read-only
      command: [hps, serve, --config, /etc/hps/ps.json, --host, 0.0.0.0, --http-port, {{ $v.triton.httpPort | quote }}, --grpc-port, {{ $v.triton.grpcPort | quote }}, --metrics-port, {{ $v.triton.metricsPort | quote }}, --state-dir, {{ include "hps.adminKeyDir" . }}{{ if not (kindIs "invalid" $v.triton.maxRequestMb) }}, --max-request-mb, {{ $v.triton.maxRequestMb | quote }}{{ end }}]
      {{- include "hps.containerSecurity" . | nindent 6 }}
      {{- $tritonEnv := list }}
      {{- if $v.admin.pinAdminKey }}
      {{- $tritonEnv = append $tritonEnv (include "hps.adminKeyEnv" .) }}
      {{- end }}
      {{- with include "hps.secretEnv" (dict "root" . "redis" true "kafka" true) | trim }}
      {{- $tritonEnv = append $tritonEnv . }}
      {{- end }}
      {{- with $v.triton.extraEnv }}
      {{- $tritonEnv = append $tritonEnv (toYaml .) }}
      {{- end }}
      {{- with $tritonEnv }}
      env:
        {{- join "\n" . | nindent 8 }}
      {{- end }}
      ports:
        - {name: http, containerPort: {{ $v.triton.httpPort }}, protocol: TCP}
        - {name: grpc, containerPort: {{ $v.triton.grpcPort }}, protocol: TCP}
        - {name: metrics, containerPort: {{ $v.triton.metricsPort }}, protocol: TCP}
      startupProbe:
        httpGet: {path: /v2/health/ready, port: http}
        periodSeconds: {{ $v.probes.startup.periodSeconds }}
        failureThreshold: {{ $v.probes.startup.failureThreshold }}
      livenessProbe:
        httpGet: {path: /v2/health/live, port: http}
        periodSeconds: {{ $v.probes.liveness.periodSeconds }}
        failureThreshold: {{ $v.probes.liveness.failureThreshold }}
        timeoutSeconds: {{ $v.probes.liveness.timeoutSeconds }}
      readinessProbe:
        httpGet: {path: /v2/health/ready, port: http}
        periodSeconds: {{ $v.probes.readiness.periodSeconds }}
        failureThreshold: {{ $v.probes.readiness.failureThreshold }}
        timeoutSeconds: {{ $v.probes.readiness.timeoutSeconds }}
      lifecycle:
        preStop:
          exec:
            command: [sleep, {{ $v.lifecycle.preStopSleepSeconds | quote }}]
      resources:
        {{- $res := deepCopy $v.triton.resources }}
        {{- with include "hps.ephemeralRequest" . }}
        {{- $requests := default dict $res.requests }}
        {{- if not (hasKey $requests "ephemeral-storage") }}
        {{- $_ := set $requests "ephemeral-storage" . }}
        {{- $_ := set $res "requests" $requests }}
        {{- end }}
        {{- end }}
        {{- if $v.triton.gpu.enabled }}
        {{- $limits := default dict $res.limits }}
        {{- $_ := set $limits "nvidia.com/gpu" $v.triton.gpu.count }}
        {{- $_ := set $res "limits" $limits }}
        {{- end }}
        {{- toYaml $res | nindent 8 }}
      volumeMounts:
        - {name: config, mountPath: /etc/hps, readOnly: true}
        - {name: l3, mountPath: /var/lib/hps/l3}
        - {name: model-source, mountPath: {{ $v.modelSource.mountPath }}, readOnly: true}
        - {name: shm, mountPath: /dev/shm}
        - {name: tmp, mountPath: /tmp}
        - {name: admin-key, mountPath: {{ include "hps.adminKeyDir" . }}{{ if $v.admin.pinAdminKey }}, readOnly: true{{ end }}}
        {{- with include "hps.redisTLSMount" . | trim }}
        {{- . | nindent 8 }}
        {{- end }}
        {{- with include "hps.secretMounts" (dict "root" . "redis" true "kafka" true) | trim }}
        {{- . | nindent 8 }}
        {{- end }}
    - name: control-plane
      image: {{ $hpsImage }}
      imagePullPolicy: {{ $v.images.hps.pullPolicy }}
      workingDir: /tmp  # a volume: the root filesystem is read-only
      command: [hps, admin, --config, /etc/hps/ps.json, --state-dir, /var/lib/hps/l3/hps-admin, --host, 0.0.0.0, --port, {{ $v.controlPlane.port | quote }}, --triton-url, {{ printf "127.0.0.1:%v" $v.triton.httpPort | quote }}, --max-staged-gb, {{ include "hps.maxStagedGb" . | quote }}{{ if $v.admin.existingSecret }}, --token-file, {{ include "hps.adminTokenFile" . }}{{ end }}]
      {{- include "hps.containerSecurity" . | nindent 6 }}
      env:
        {{- include "hps.adminKeyEnv" . | nindent 8 }}
        - name: HPS_TRITON_METRICS_URL  # Triton's hit rates and latencies, read by /v1 routes
          value: {{ printf "http://127.0.0.1:%v/metrics" $v.triton.metricsPort | quote }}
        {{- with include "hps.secretEnv" (dict "root" . "redis" true "kafka" true) | trim }}
        {{- . | nindent 8 }}
        {{- end }}
      ports:
        - {name: admin, containerPort: {{ $v.controlPlane.port }}, protocol: TCP}
      readinessProbe:
        httpGet: {path: /readyz, port: admin}
        periodSeconds: {{ $v.probes.readiness.periodSeconds }}
        failureThreshold: {{ $v.probes.readiness.failureThreshold }}
        timeoutSeconds: {{ $v.probes.readiness.timeoutSeconds }}
      livenessProbe:
        httpGet: {path: /healthz, port: admin}
        periodSeconds: {{ $v.probes.liveness.periodSeconds }}
        failureThreshold: {{ $v.probes.liveness.failureThreshold }}
        timeoutSeconds: {{ $v.probes.liveness.timeoutSeconds }}
      resources:
        {{- toYaml $v.controlPlane.resources | nindent 8 }}
      volumeMounts:
        - {name: config, mountPath: /etc/hps, readOnly: true}
        - {name: l3, mountPath: /var/lib/hps/l3}
        - {name: model-source, mountPath: {{ $v.modelSource.mountPath }}, readOnly: true}
        - {name: shm, mountPath: /dev/shm}
        - {name: tmp, mountPath: /tmp}
        - {name: admin-key, mountPath: {{ include "hps.adminKeyDir" . }}, readOnly: true}
        {{- if $v.admin.existingSecret }}
        - {name: admin-token, mountPath: /var/run/secrets/hps, readOnly: true}
        {{- end }}
        {{- with include "hps.redisTLSMount" . | trim }}
        {{- . | nindent 8 }}
        {{- end }}
        {{- with include "hps.secretMounts" (dict "root" . "redis" true "kafka" true) | trim }}
        {{- . | nindent 8 }}
        {{- end }}
    {{- if include "hps.sharedUpdates" . }}
    - name: updater
      image: {{ $hpsImage }}
      imagePullPolicy: {{ $v.images.hps.pullPolicy }}
      workingDir: /tmp  # a volume: the root filesystem is read-only
      # Its own consumer group per pod: every pod's L3 receives every update. With
      # persistence the pod name is stable, so a restarted pod resumes where its L3 stopped;
      # without it a new pod (new name, fresh L3) replays what Kafka retains.
      # /healthz on the metrics port is the consumer loop's heartbeat (the probes below).
      command: [hps, consume, --config, /etc/hps/ps-updater.json, --metrics-port, {{ $v.kafka.updater.metricsPort | quote }}, --metrics-address, 0.0.0.0, --max-loop-age-s, {{ $v.kafka.maxLoopAgeSeconds | quote }}, --group-id, {{ include "hps.l3GroupId" . | quote }}]
      {{- include "hps.containerSecurity" . | nindent 6 }}
      env:
        - name: POD_NAME
          valueFrom:
            fieldRef: {fieldPath: metadata.name}
        {{- with include "hps.secretEnv" (dict "root" . "redis" false "kafka" true) | trim }}
        {{- . | nindent 8 }}
        {{- end }}
      ports:
        - {name: upd-metrics, containerPort: {{ $v.kafka.updater.metricsPort }}, protocol: TCP}
      {{- include "hps.updaterProbes" . | nindent 6 }}
      resources:
        {{- toYaml $v.kafka.updater.resources | nindent 8 }}
      volumeMounts:
        - {name: config, mountPath: /etc/hps, readOnly: true}
        - {name: l3, mountPath: /var/lib/hps/l3}
        - {name: tmp, mountPath: /tmp}
        {{- with include "hps.secretMounts" (dict "root" . "redis" false "kafka" true) | trim }}
        {{- . | nindent 8 }}
        {{- end }}
    {{- end }}
  volumes:
    - name: config
      configMap: {name: {{ include "hps.suffixedName" (list $ "config") }}}
    - name: admin-key
      {{- if $v.admin.pinAdminKey }}
      secret:
        secretName: {{ $v.admin.existingSecret }}
        defaultMode: 0440
        items:
          - {key: admin-key, path: hps-admin-key}
      {{- else }}
      emptyDir: {medium: Memory, sizeLimit: 1Mi}  # hps serve's per-start key, never on disk
      {{- end }}
    {{- if $v.admin.existingSecret }}
    - name: admin-token
      secret:
        secretName: {{ $v.admin.existingSecret }}
        defaultMode: 0440
        items:
          - {key: token, path: token}
    {{- end }}
    {{- if not (include "hps.stateful" .) }}
    - name: l3
      emptyDir: {{ include "hps.emptyDir" $v.l3.sizeLimit }}
    {{- end }}
    - name: model-source
      {{- if eq $v.modelSource.type "pvc" }}
      persistentVolumeClaim: {claimName: {{ $v.modelSource.pvc.existingClaim }}, readOnly: true}
      {{- else }}
      emptyDir: {{ include "hps.emptyDir" $v.modelSource.sizeLimit }}
      {{- end }}
    - name: shm
      emptyDir: {medium: Memory, sizeLimit: {{ $v.triton.shmSize }}}
    - name: tmp
      emptyDir: {}
    {{- if and (eq $v.l2.mode "redis") $v.l2.redis.tls.enabled $v.l2.redis.tls.existingSecret }}
    - name: redis-tls
      secret: {secretName: {{ $v.l2.redis.tls.existingSecret }}, defaultMode: 0440}
    {{- end }}
    {{- with include "hps.secretVolumes" . | trim }}
    {{- . | nindent 4 }}
    {{- end }}
{{- end }}

{{/* An emptyDir on the node's disk, bounded when a size is given. */}}
{{- define "hps.emptyDir" -}}
{{- if . }}{sizeLimit: {{ . }}}{{ else }}{}{{ end }}
{{- end }}

{{/* The serving container's ephemeral-storage request: the sizes of the emptyDirs holding
L3 (without persistence) and the model files (demo, image); "" when neither is bounded. */}}
{{- define "hps.ephemeralRequest" -}}
{{- $v := .Values -}}
{{- $bytes := 0 -}}
{{- if and (not (include "hps.stateful" .)) $v.l3.sizeLimit -}}
{{- $bytes = add $bytes (include "hps.bytes" $v.l3.sizeLimit | int64) -}}
{{- end -}}
{{- if and (ne $v.modelSource.type "pvc") $v.modelSource.sizeLimit -}}
{{- $bytes = add $bytes (include "hps.bytes" $v.modelSource.sizeLimit | int64) -}}
{{- end -}}
{{- if and $bytes (eq (mod $bytes 1073741824) 0) }}{{ printf "%dGi" (div $bytes 1073741824) }}
{{- else if $bytes }}{{ printf "%dMi" (div (add $bytes 1048575) 1048576) }}{{ end -}}
{{- end }}
