{{/*
The ps.json of one role, from values (README: "The ps.json files"). Roles:
  serving   Triton (`hps serve`) and the control plane
  import    the init container: L3, and Redis only without Kafka (with Kafka a pod joining
            later must not write an old snapshot over updates Redis already holds; an
            in-process or per-pod L2 is filled by the serving processes themselves)
  updater   the per-pod sidecar: L3 only (its own consumer group, given on the command line)
  l2        the L2 updater Deployment: the shared L2 only (the group of ps.json)
  test      the helm test pod: the models alone (no L2, L3 or updates, so no secret named)
Secrets are named by environment variable (hps_password_env, hps_kafka_config_env), never
written here.
*/}}
{{- define "hps.psConfig" -}}
{{- $v := .root.Values -}}
{{- $role := .role -}}
{{- $base := $v.modelSource.mountPath -}}
{{- $models := list -}}
{{- range $v.models -}}
{{- $m := deepCopy . -}}
{{- /* Every file a model names, relative to modelSource.mountPath unless absolute (the
serving processes' cwd is /tmp); {model} and {table} of hps_cache's stay as they are. */ -}}
{{- $files := list -}}
{{- range (default list .sparse_files) -}}
{{- $files = append $files (ternary . (printf "%s/%s" $base .) (hasPrefix "/" .)) -}}
{{- end -}}
{{- if .sparse_files }}{{ $_ := set $m "sparse_files" $files }}{{ end -}}
{{- $cache := get $m "hps_cache" -}}
{{- range $pair := list (list $m "dense_file") (list $m "network_file") (list $cache "frequency_file") (list $cache "warmup_keyset") -}}
{{- $d := index $pair 0 -}}
{{- $key := index $pair 1 -}}
{{- if kindIs "map" $d -}}
{{- $f := get $d $key -}}
{{- if and $f (kindIs "string" $f) (not (hasPrefix "/" $f)) }}{{ $_ := set $d $key (printf "%s/%s" $base $f) }}{{ end -}}
{{- end -}}
{{- end -}}
{{- $models = append $models $m -}}
{{- end -}}

{{- $vdb := dict "type" "disabled" -}}
{{- $redis := $v.l2.redis -}}
{{- if or (has $role (list "updater" "test")) (and (eq $role "import") (or $v.kafka.enabled (ne $v.l2.mode "redis"))) -}}
{{- else if eq $v.l2.mode "embedded" -}}
{{- $vdb = merge (dict "type" "hash_map") (deepCopy $v.l2.extra) -}}
{{- else if eq $v.l2.mode "pod" -}}
{{- $vdb = merge (dict "type" "multi_process_hash_map" "shared_memory_size" (include "hps.l2SegmentBytes" .root | int64)) (deepCopy $v.l2.extra) -}}
{{- else -}}
{{- $vdb = dict "type" (ternary "redis_cluster" "redis" $redis.cluster) "address" $redis.address "user_name" $redis.user -}}
{{- if $redis.existingSecret }}{{ $_ := set $vdb "hps_password_env" "HPS_REDIS_PASSWORD" }}{{ end -}}
{{- if $redis.tls.enabled -}}
{{- $_ := set $vdb "enable_tls" true -}}
{{- if $redis.tls.existingSecret }}{{ $_ := set $vdb "tls_ca_certificate" "/var/run/secrets/hps-redis-tls/ca.crt" }}{{ end -}}
{{- if $redis.tls.clientCertificate -}}
{{- $_ := set $vdb "tls_client_certificate" "/var/run/secrets/hps-redis-tls/tls.crt" -}}
{{- $_ := set $vdb "tls_client_key" "/var/run/secrets/hps-redis-tls/tls.key" -}}
{{- end -}}
{{- if $redis.tls.serverName }}{{ $_ := set $vdb "tls_server_name_identification" $redis.tls.serverName }}{{ end -}}
{{- end -}}
{{- $vdb = merge $vdb (deepCopy $v.l2.extra) -}}
{{- end -}}

{{- $pdb := merge (dict "type" "rocks_db" "path" "/var/lib/hps/l3/rocksdb") (deepCopy $v.l3.extra) -}}
{{- if has $role (list "l2" "test") }}{{ $pdb = dict "type" "disabled" }}{{ end -}}

{{- $us := dict "type" "null" -}}
{{- if and $v.kafka.enabled (not (has $role (list "import" "test"))) -}}
{{- $us = dict "type" "kafka_message_queue" "brokers" $v.kafka.brokers "hps_group_id" (include "hps.l2GroupId" .root) "hps_dead_letter_topic" $v.kafka.deadLetterTopic -}}
{{- $kconf := deepCopy (default dict $v.kafka.config) -}}
{{- range $setting, $file := include "hps.kafkaTLSFiles" .root | fromJson -}}
{{- $_ := set $kconf $setting (printf "%s/%s" (include "hps.kafkaTLSDir" $.root) $file) -}}
{{- end -}}
{{- if $kconf }}{{ $_ := set $us "hps_kafka_config" $kconf }}{{ end -}}
{{- if and $v.kafka.existingSecret $v.kafka.secretKeys -}}
{{- $env := dict -}}
{{- range $setting, $_k := $v.kafka.secretKeys }}{{ $_ := set $env $setting (include "hps.kafkaEnvName" $setting) }}{{ end -}}
{{- $_ := set $us "hps_kafka_config_env" $env -}}
{{- end -}}
{{- $us = merge $us (deepCopy $v.kafka.extra) -}}
{{- end -}}

{{- dict "supportlonglong" true "models" $models "volatile_db" $vdb "persistent_db" $pdb "update_source" $us | toPrettyJson }}
{{- end }}

{{/* l2.mode=pod: the L2 segment's bytes, /dev/shm (triton.shmSize) less what Triton's Python
backend keeps there (triton.pythonBackendShm); l2.extra.shared_memory_size, when given. */}}
{{- define "hps.l2SegmentBytes" -}}
{{- $t := .Values.triton -}}
{{- $free := sub (include "hps.bytes" $t.shmSize | int64) (include "hps.bytes" $t.pythonBackendShm | int64) -}}
{{- dig "shared_memory_size" $free (.Values.l2.extra | default dict) | int64 -}}
{{- end }}
