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
{{- if and $v.admin.pinAdminKey (not $v.admin.existingSecret) -}}
{{- fail "admin.pinAdminKey=true takes Triton's admin key from admin.existingSecret (key admin-key), which is empty" -}}
{{- end -}}
{{- $names := dict -}}
{{- range $v.models -}}
{{- if hasKey $names .model }}{{ fail (printf "models: model %q appears twice" .model) }}{{ end -}}
{{- $_ := set $names .model true -}}
{{- end -}}
{{- end }}
