{{/* Checks across values that values.schema.json cannot word clearly; each names the values. */}}
{{- define "hps.validate" -}}
{{- $v := .Values -}}
{{- if and $v.kafka.enabled (eq $v.l2.mode "pod") -}}
{{- fail "l2.mode=pod cannot be combined with kafka.enabled=true: the pod's shared-memory L2 would need the updater's per-pod consumer group in the serving ps.json; use l2.mode=embedded (each Triton process applies updates) or l2.mode=redis" -}}
{{- end -}}
{{- if and $v.kafka.enabled (eq (toString (dig "hps_l1_refresh" "listener" ($v.kafka.extra | default dict))) "journal") -}}
{{- fail "kafka.extra.hps_l1_refresh=journal cannot be used by this chart: a separate Deployment writes the shared L2 and each pod's updater writes only its L3, so no one consumer could tell the serving processes when every tier holds an update; leave it unset (each serving process listens to the topics)" -}}
{{- end -}}
{{- if and $v.autoscaling.enabled (gt (int $v.autoscaling.minReplicas) (int $v.autoscaling.maxReplicas)) -}}
{{- fail (printf "autoscaling.minReplicas (%v) is above autoscaling.maxReplicas (%v)" $v.autoscaling.minReplicas $v.autoscaling.maxReplicas) -}}
{{- end -}}
{{- if and (eq $v.l2.mode "redis") $v.l2.redis.tls.clientCertificate (not $v.l2.redis.tls.existingSecret) -}}
{{- fail "l2.redis.tls.clientCertificate=true needs l2.redis.tls.existingSecret (a Secret with tls.crt and tls.key)" -}}
{{- end -}}
{{- if and $v.kafka.secretKeys (not $v.kafka.existingSecret) -}}
{{- fail "kafka.secretKeys names keys of kafka.existingSecret, which is empty" -}}
{{- end -}}
{{- if and $v.kafka.tls.clientCertificate (not $v.kafka.tls.existingSecret) -}}
{{- fail "kafka.tls.clientCertificate=true needs kafka.tls.existingSecret (a Secret with ca.crt, tls.crt and tls.key)" -}}
{{- end -}}
{{- range $setting, $_k := $v.kafka.secretKeys -}}
{{- if hasSuffix ".location" $setting -}}
{{- fail (printf "kafka.secretKeys.%s: a setting in secretKeys gets the content of the Secret's file, but %s takes a path; give TLS files with kafka.tls.existingSecret (mounted, the chart sets the paths)" $setting $setting) -}}
{{- end -}}
{{- end -}}
{{- range $setting, $file := include "hps.kafkaTLSFiles" . | fromJson -}}
{{- if hasKey (default dict $v.kafka.config) $setting -}}
{{- fail (printf "kafka.config.%s cannot be set with kafka.tls.existingSecret: the chart sets it to %s/%s, the Secret's %s; leave it out of kafka.config" $setting (include "hps.kafkaTLSDir" $) $file $file) -}}
{{- end -}}
{{- end -}}
{{- if and $v.admin.pinAdminKey (not $v.admin.existingSecret) -}}
{{- fail "admin.pinAdminKey=true takes Triton's admin key from admin.existingSecret (key admin-key), which is empty" -}}
{{- end -}}
{{- $names := dict -}}
{{- range $v.models -}}
{{- if hasKey $names .model }}{{ fail (printf "models: model %q appears twice" .model) }}{{ end -}}
{{- $_ := set $names .model true -}}
{{- if and $v.kafka.enabled (eq $v.l2.mode "embedded") (gt (int (default 1 .hps_instances)) 1) -}}
{{- fail (printf "l2.mode=embedded with kafka.enabled=true cannot serve model %q with hps_instances=%v: each Triton process applies updates to its own L2, and with more than one instance none of them writes the pod's L3 (all follow it read-only), so L3 would never receive updates; use hps_instances: 1, or l2.mode=redis (an updater sidecar writes each pod's L3)" .model .hps_instances) -}}
{{- end -}}
{{- end -}}
{{- if and $v.serviceMonitor.enabled $v.networkPolicy.enabled (not $v.networkPolicy.monitoring) -}}
{{- fail "serviceMonitor.enabled=true with networkPolicy.enabled=true and an empty networkPolicy.monitoring: the NetworkPolicy would let no one reach the metrics ports, so every scrape would fail; list Prometheus' pods or namespace in networkPolicy.monitoring (or set networkPolicy.enabled=false)" -}}
{{- end -}}
{{- include "hps.validateKafka" . -}}
{{- include "hps.validateStaged" . -}}
{{- include "hps.validateShm" . -}}
{{- include "hps.validatePorts" . -}}
{{- include "hps.validatePaths" . -}}
{{- end }}

{{/* What hps consume would refuse at start (the pods would crash-loop): a dead-letter topic
named like an update topic (hps.config.update_source.UPDATE_TOPIC_RE), and a
--max-loop-age-s (kafka.maxLoopAgeSeconds) not above twice the longest wait of a healthy
loop, update_source.poll_timeout_ms (kafka.extra, default 500) or a retry's back-off
(hps.updates.consumer.MAX_BACKOFF_S, 5 s). */}}
{{- define "hps.validateKafka" -}}
{{- $k := .Values.kafka -}}
{{- if $k.enabled -}}
{{- if regexMatch "^hps_et\\.[A-Za-z0-9_\\-]+\\.[A-Za-z0-9_\\-]+$" (toString $k.deadLetterTopic) -}}
{{- fail (printf "kafka.deadLetterTopic %q has the name of an update topic (hps_et.<model>.<table>): hps consume would read its own dead letters back; use a topic that is not consumed, e.g. hps_et.dead_letter" $k.deadLetterTopic) -}}
{{- end -}}
{{- if include "hps.sharedUpdates" . -}}
{{- $poll := divf (dig "poll_timeout_ms" 500 ($k.extra | default dict)) 1000 -}}
{{- $wait := maxf $poll 5.0 -}}
{{- if le (float64 $k.maxLoopAgeSeconds) (mulf 2 $wait) -}}
{{- fail (printf "kafka.maxLoopAgeSeconds (%v) must exceed twice the longest wait of a healthy hps consume loop, %v s (kafka.extra.poll_timeout_ms %v s, or a retry's back-off of 5 s): an idle poll or a retry is not a stall, and hps consume refuses to start; raise kafka.maxLoopAgeSeconds above %v or lower kafka.extra.poll_timeout_ms" $k.maxLoopAgeSeconds $wait $poll (mulf 2 $wait)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* l2.mode=pod: the L2 segment and Triton's Python backend share /dev/shm (triton.shmSize). */}}
{{- define "hps.validateShm" -}}
{{- $t := .Values.triton -}}
{{- if eq .Values.l2.mode "pod" -}}
{{- $shm := include "hps.bytes" $t.shmSize | int64 -}}
{{- $reserve := include "hps.bytes" $t.pythonBackendShm | int64 -}}
{{- if le $shm $reserve -}}
{{- fail (printf "l2.mode=pod keeps the L2 segment in /dev/shm: triton.shmSize (%v) must be larger than triton.pythonBackendShm (%v), the part Triton's Python backend keeps there" $t.shmSize $t.pythonBackendShm) -}}
{{- end -}}
{{- $segment := include "hps.l2SegmentBytes" . | int64 -}}
{{- if gt (add $segment $reserve) $shm -}}
{{- fail (printf "l2.extra.shared_memory_size (%d bytes) and triton.pythonBackendShm (%v) do not fit in triton.shmSize (%v); raise triton.shmSize or leave shared_memory_size out (the chart then gives the segment what is left)" $segment $t.pythonBackendShm $t.shmSize) -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* The control plane stages uploads on the L3 volume (--state-dir under /var/lib/hps/l3),
beside RocksDB: its cap (hps.maxStagedGb) must stay below that volume's size (hps.l3Bytes;
unbounded: nothing to compare). */}}
{{- define "hps.validateStaged" -}}
{{- $v := .Values -}}
{{- with include "hps.l3Bytes" . -}}
{{- $volume := float64 . -}}
{{- $gb := include "hps.maxStagedGb" $ -}}
{{- if ge (mulf $gb 1073741824) $volume -}}
{{- $name := include "hps.l3SizeValue" $ -}}
{{- $size := ternary $v.persistence.size $v.l3.sizeLimit (eq $name "persistence.size") -}}
{{- $shown := ternary $size (printf "%d bytes" (int64 $volume)) (kindIs "string" $size) -}}
{{- fail (printf "controlPlane.maxStagedGb (%v GiB) must be smaller than the L3 volume, %s (%v), on which the control plane stages uploads beside RocksDB: uploads filling it would get the pod evicted or L3 stopped instead of a 413/429; lower controlPlane.maxStagedGb (or leave it null: 40%% of the volume) or raise %s" $gb $name $shown $name) -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* The serving pod's containers share one network namespace: one port each. */}}
{{- define "hps.validatePorts" -}}
{{- $v := .Values -}}
{{- $ports := list (list "triton.httpPort" $v.triton.httpPort) (list "triton.grpcPort" $v.triton.grpcPort) (list "triton.metricsPort" $v.triton.metricsPort) (list "controlPlane.port" $v.controlPlane.port) -}}
{{- if include "hps.sharedUpdates" . -}}
{{- $ports = append $ports (list "kafka.updater.metricsPort" $v.kafka.updater.metricsPort) -}}
{{- end -}}
{{- $seen := dict -}}
{{- range $ports -}}
{{- $port := toString (index . 1 | int) -}}
{{- if hasKey $seen $port -}}
{{- fail (printf "%s (%s) is also %s: the serving pod's containers share one network namespace, so each needs a port of its own" (index . 0) $port (get $seen $port)) -}}
{{- end -}}
{{- $_ := set $seen $port (index . 0) -}}
{{- end -}}
{{- end }}

{{/* modelSource.mountPath is mounted beside the pod's other volumes and over the image's
files: it may neither be nor contain nor lie under any of them. */}}
{{- define "hps.validatePaths" -}}
{{- $v := .Values -}}
{{- $mount := clean $v.modelSource.mountPath | trimSuffix "/" -}}
{{- $taken := list "/tmp" "/etc/hps" "/var/lib/hps/l3" "/dev/shm" (include "hps.adminKeyDir" .) "/var/run/secrets/hps" "/var/run/secrets/hps-redis" "/var/run/secrets/hps-redis-tls" "/var/run/secrets/hps-kafka" (include "hps.kafkaTLSDir" .) "/opt/hps" "/usr" "/bin" "/sbin" "/lib" "/lib64" "/proc" "/sys" -}}
{{- range $taken -}}
{{- if or (eq $mount .) (hasPrefix (printf "%s/" .) $mount) (hasPrefix (printf "%s/" $mount) .) -}}
{{- fail (printf "modelSource.mountPath %s collides with %s, which the serving pod mounts or its images hold; choose a folder of its own, such as /models" $v.modelSource.mountPath .) -}}
{{- end -}}
{{- end -}}
{{- if eq $v.modelSource.type "image" -}}
{{- $path := clean $v.modelSource.image.path | trimSuffix "/" -}}
{{- $copy := include "hps.modelCopyDir" . -}}
{{- if or (eq $path $copy) (hasPrefix (printf "%s/" $copy) $path) (hasPrefix (printf "%s/" $path) $copy) -}}
{{- fail (printf "modelSource.image.path %s collides with %s, where the copy init container mounts the pod's model volume" $v.modelSource.image.path $copy) -}}
{{- end -}}
{{- end -}}
{{- end }}
