{{/* Names and labels */}}
{{- define "rewardd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rewardd.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "rewardd.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "rewardd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: rewardd
{{- end -}}

{{/* selector labels of one component: (dict "root" $ "component" "api") */}}
{{- define "rewardd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rewardd.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "rewardd.componentLabels" -}}
{{ include "rewardd.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "rewardd.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "rewardd.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* image reference: (dict "root" $ "image" .Values.images.api) */}}
{{- define "rewardd.image" -}}
{{- if .image.digest -}}
{{- printf "%s@%s" .image.repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Redis */}}
{{- define "rewardd.redisName" -}}
{{- printf "%s-redis" (include "rewardd.fullname" .) -}}
{{- end -}}

{{- define "rewardd.useInternalRedis" -}}
{{- if and .Values.redis.internal.enabled (not .Values.redis.external.url) (not .Values.redis.external.existingSecret) -}}true{{- end -}}
{{- end -}}

{{- define "rewardd.redisSecretName" -}}
{{- if .Values.redis.external.existingSecret -}}
{{- .Values.redis.external.existingSecret -}}
{{- else -}}
{{- printf "%s-redis-url" (include "rewardd.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* host:port of Redis, for KEDA */}}
{{- define "rewardd.redisAddress" -}}
{{- if .Values.autoscaling.keda.redisAddress -}}
{{- .Values.autoscaling.keda.redisAddress -}}
{{- else if .Values.redis.external.url -}}
{{- $u := urlParse .Values.redis.external.url -}}
{{- if contains ":" $u.host -}}{{ $u.host }}{{- else -}}{{ printf "%s:6379" $u.host }}{{- end -}}
{{- else if include "rewardd.useInternalRedis" . -}}
{{- printf "%s.%s.svc:6379" (include "rewardd.redisName" .) .Release.Namespace -}}
{{- else -}}
{{- fail "autoscaling.mode=keda with redis.external.existingSecret needs autoscaling.keda.redisAddress" -}}
{{- end -}}
{{- end -}}

{{/* The run record's database (REWARDD_DATABASE_URL of the API pods) */}}
{{- define "rewardd.postgresqlName" -}}
{{- printf "%s-postgresql" (include "rewardd.fullname" .) -}}
{{- end -}}

{{/* the Secret holding the database URL under database.urlKey, or empty (SQLite per pod);
fails when more than one source is set */}}
{{- define "rewardd.databaseSecretName" -}}
{{- $d := .Values.database -}}
{{- if gt (len (compact (list $d.url $d.existingSecret (ternary "in-chart" "" $d.postgresql.enabled)))) 1 -}}
{{- fail "database: set one of database.url, database.existingSecret (your PostgreSQL) or database.postgresql.enabled (an in-chart PostgreSQL for trials), not several" -}}
{{- end -}}
{{- if $d.existingSecret -}}
{{- $d.existingSecret -}}
{{- else if $d.url -}}
{{- printf "%s-database-url" (include "rewardd.fullname" .) -}}
{{- else if $d.postgresql.enabled -}}
{{- include "rewardd.postgresqlName" . -}}
{{- end -}}
{{- end -}}

{{/* the in-chart PostgreSQL's password: given, else the one its Secret already holds (an
upgrade must not change it: the server keeps the password it was initialised with), else new */}}
{{- define "rewardd.postgresqlPassword" -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "rewardd.postgresqlName" .) -}}
{{- if .Values.database.postgresql.password -}}
{{- .Values.database.postgresql.password -}}
{{- else if and $existing $existing.data (hasKey $existing.data "password") -}}
{{- index $existing.data "password" | b64dec -}}
{{- else -}}
{{- randAlphaNum 32 -}}
{{- end -}}
{{- end -}}

{{/*
Environment of every rewardd container: Redis URLs (REWARDD_BROKER_URL for queues and
results, REWARDD_STATE_URL for the API's shared state) and the shared settings.
The base URL lives in a Secret (it may carry a password); the database is appended with
Kubernetes' $(VAR) expansion.
*/}}
{{- define "rewardd.commonEnv" -}}
- name: RD_REDIS_BASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "rewardd.redisSecretName" . }}
      key: {{ .Values.redis.external.urlKey }}
- name: REWARDD_BROKER_URL
  value: "$(RD_REDIS_BASE_URL)/{{ .Values.redis.brokerDb }}"
- name: REWARDD_VERIFIER_TIMEOUT_S
  value: {{ .Values.settings.verifierTimeoutS | quote }}
- name: REWARDD_MAX_VERIFIER_TIMEOUT_S
  value: {{ .Values.settings.maxVerifierTimeoutS | quote }}
- name: REWARDD_VISIBILITY_TIMEOUT_S
  value: {{ .Values.settings.visibilityTimeoutS | quote }}
- name: REWARDD_LOG_LEVEL
  value: {{ .Values.settings.logLevel | quote }}
- name: REWARDD_LOG_FORMAT
  value: {{ .Values.settings.logFormat | quote }}
{{- with .Values.settings.queueRoutes }}
- name: REWARDD_QUEUE_ROUTES
  value: {{ . | quote }}
{{- end }}
{{- with .Values.env }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* the Secret holding the /metrics token, or empty */}}
{{- define "rewardd.metricsTokenSecret" -}}
{{- if .Values.metrics.token.existingSecret -}}
{{- .Values.metrics.token.existingSecret -}}
{{- else if .Values.metrics.token.value -}}
{{- printf "%s-metrics-token" (include "rewardd.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* restricted container securityContext (non-root, no capabilities, read-only root) */}}
{{- define "rewardd.restrictedContainer" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}
