{{/*
Names and labels.
*/}}
{{- define "epode-sidecar.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "epode-sidecar.fullname" -}}
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

{{- define "epode-sidecar.selectorLabels" -}}
app.kubernetes.io/name: {{ include "epode-sidecar.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "epode-sidecar.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "epode-sidecar.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "epode-sidecar.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "epode-sidecar.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* repository[:tag][@digest] */}}
{{- define "epode-sidecar.image" -}}
{{- $img := .image -}}
{{- $ref := $img.repository -}}
{{- $tag := default .defaultTag $img.tag -}}
{{- if $tag -}}{{- $ref = printf "%s:%s" $ref (toString $tag) -}}{{- end -}}
{{- if $img.digest -}}{{- $ref = printf "%s@%s" $ref $img.digest -}}{{- end -}}
{{- $ref -}}
{{- end -}}

{{/*
A duration as the sidecar writes them (10s, 500ms, 2m, 1h, or a sum such as 1m30s), rounded
up to whole seconds. Anything else fails the render.
*/}}
{{- define "epode-sidecar.seconds" -}}
{{- $d := toString .value | trim -}}
{{- if not (regexMatch "^([0-9]+(ms|s|m|h) ?)+$" $d) -}}
{{- fail (printf "epode-sidecar: %s is %q; write a duration such as 10s, 500ms or 2m" .name $d) -}}
{{- end -}}
{{- $ms := 0 -}}
{{- range (regexFindAll "[0-9]+(ms|s|m|h)" $d -1) -}}
{{- $n := regexFind "^[0-9]+" . | int -}}
{{- $u := regexFind "(ms|s|m|h)$" . -}}
{{- if eq $u "ms" -}}{{- $ms = add $ms $n -}}
{{- else if eq $u "s" -}}{{- $ms = add $ms (mul $n 1000) -}}
{{- else if eq $u "m" -}}{{- $ms = add $ms (mul $n 60000) -}}
{{- else -}}{{- $ms = add $ms (mul $n 3600000) -}}
{{- end -}}
{{- end -}}
{{- div (add $ms 999) 1000 -}}
{{- end -}}

{{/*
"true" when the cluster has the preStop sleep action (PodLifecycleSleepAction: beta and on by
default from 1.30; alpha and off in 1.29, where the API server would drop the field and refuse
the empty handler). `helm template` assumes Helm's own Kubernetes version unless given
--kube-version.
*/}}
{{- define "epode-sidecar.sleepSupported" -}}
{{- if semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version }}true{{ end -}}
{{- end -}}

{{/* epode.mode as the sidecar reads it (an unquoted YAML `off` arrives as false). */}}
{{- define "epode-sidecar.mode" -}}
{{- if and (kindIs "bool" .Values.epode.mode) (not .Values.epode.mode) -}}
off
{{- else -}}
{{- toString .Values.epode.mode -}}
{{- end -}}
{{- end -}}

{{/* auth.mode as the sidecar reads it (an unquoted YAML `off` arrives as false). */}}
{{- define "epode-sidecar.authMode" -}}
{{- $m := .Values.auth.mode -}}
{{- if or (kindIs "invalid" $m) (and (kindIs "bool" $m) (not $m)) -}}
off
{{- else -}}
{{- toString $m -}}
{{- end -}}
{{- end -}}

{{- define "epode-sidecar.feedbackOn" -}}
{{- if ne (include "epode-sidecar.mode" .) "off" }}true{{ end -}}
{{- end -}}

{{/* EPODE_SIDECAR_REPLICA_URL: sidecar.replicaUrl as given; "auto": this pod's IP (the POD_IP
     env, from the downward API), the MCP port and path, over plain HTTP, when the product key
     (which seals the states that name a replica) is set and the listener has no TLS of its own
     (whose certificate would not name a pod's IP); else unset. */}}
{{- define "epode-sidecar.replicaUrl" -}}
{{- $s := .Values.sidecar -}}
{{- if ne $s.replicaUrl "auto" -}}
{{- $s.replicaUrl -}}
{{- else if and (include "epode-sidecar.feedbackOn" .) (not $s.tls.enabled) -}}
{{- printf "http://$(POD_IP):%v%s" ($s.port | int) $s.path -}}
{{- end -}}
{{- end -}}

{{/* Seconds the server keeps serving after the pod is told to stop (its preStop sleep). */}}
{{- define "epode-sidecar.upstreamPreStop" -}}
{{- $v := .Values.upstream.preStopSleepSeconds -}}
{{- if not (kindIs "invalid" $v) -}}
{{- $v | int -}}
{{- else if .Values.nativeSidecar -}}
5
{{- else -}}
{{- add (.Values.sidecar.preStopSleepSeconds | int) (include "epode-sidecar.seconds" (dict "name" "sidecar.shutdownGrace" "value" .Values.sidecar.shutdownGrace) | int) -}}
{{- end -}}
{{- end -}}

{{/*
terminationGracePeriodSeconds: the preStop delay of the container that stops first + the
drain (sidecar.shutdownGrace) + the telemetry flush (epode.telemetry.shutdown, when feedback
is on) + 5 s.
*/}}
{{- define "epode-sidecar.terminationGrace" -}}
{{- if not (kindIs "invalid" .Values.terminationGracePeriodSeconds) -}}
{{- .Values.terminationGracePeriodSeconds | int -}}
{{- else -}}
{{- $first := 0 -}}
{{- if .Values.nativeSidecar -}}
{{- $first = include "epode-sidecar.upstreamPreStop" . | int -}}
{{- else -}}
{{- $first = .Values.sidecar.preStopSleepSeconds | int -}}
{{- end -}}
{{- $drain := include "epode-sidecar.seconds" (dict "name" "sidecar.shutdownGrace" "value" .Values.sidecar.shutdownGrace) | int -}}
{{- $flush := 0 -}}
{{- if include "epode-sidecar.feedbackOn" . -}}
{{- $flush = include "epode-sidecar.seconds" (dict "name" "epode.telemetry.shutdown" "value" .Values.epode.telemetry.shutdown) | int -}}
{{- end -}}
{{- add $first $drain $flush 5 -}}
{{- end -}}
{{- end -}}

{{/*
The sidecar settings the chart maps from its values: a list of [NAME, value path, value].
An empty string or null leaves the setting to the sidecar's default. Every setting the sidecar
declares has a row (an alias and the key too, so sidecar.env cannot set them), or is listed as
left out on purpose: src/config/chart_tests.rs checks it, with values.yaml, the schema and the
README.
*/}}
{{- define "epode-sidecar.settings" -}}
{{- $s := .Values.sidecar -}}
{{- $l := $s.limits -}}
{{- $r := $s.rateLimit -}}
{{- $e := .Values.epode -}}
{{- $t := $e.telemetry -}}
{{- $upstream := $s.upstreamUrl -}}
{{- if not $upstream -}}
{{- $upstream = printf "%s://127.0.0.1:%v%s" .Values.upstream.scheme (.Values.upstream.port | int) .Values.upstream.path -}}
{{- end -}}
{{- $tools := list -}}
{{- range $r.tools -}}{{- $tools = append $tools (printf "%s=%s" .tool .rate) -}}{{- end -}}
{{- $ids := list -}}
{{- range $k, $v := $e.identityHeaders -}}{{- $ids = append $ids (printf "%s=%s" $k $v) -}}{{- end -}}
{{- $tlsDir := trimSuffix "/" $s.tls.mountPath -}}
{{- $a := .Values.auth -}}
{{- $authMode := include "epode-sidecar.authMode" . -}}
{{- $opScopes := list -}}
{{- range $a.operationScopes -}}{{- $opScopes = append $opScopes (printf "%s:%s=%s" .kind .match (join " " .scopes)) -}}{{- end -}}
{{- $implies := list -}}
{{- range $k, $v := $a.scopeImplies -}}{{- $implies = append $implies (printf "%s=%s" $k (join " " $v)) -}}{{- end -}}
{{- $o := .Values.observability.otlp -}}
{{- /* Prometheus scrapes /metrics already (annotations or a PodMonitor): over OTLP, unless
     told otherwise, only the MCP histograms, so no family reaches the backend twice. */ -}}
{{- $otlpMetrics := ternary "" (toString $o.metrics) (kindIs "invalid" $o.metrics) -}}
{{- if and (kindIs "invalid" $o.metrics) $o.endpoint (or .Values.metrics.annotations .Values.metrics.podMonitor.enabled) -}}
{{- $otlpMetrics = "conventions" -}}
{{- end -}}
{{- /* With OTLP on: the Kubernetes resource attributes (semantic conventions, k8s.*), the
     pod's from the downward API (epode-sidecar.env defines POD_NAME … first); the values'
     own after them, so a value given wins. */ -}}
{{- $resAttrs := list -}}
{{- if and $o.endpoint $o.kubernetesAttributes -}}
{{- $resAttrs = list "k8s.pod.name=$(POD_NAME)" "k8s.pod.uid=$(POD_UID)" "k8s.namespace.name=$(POD_NAMESPACE)" "k8s.node.name=$(NODE_NAME)" (printf "k8s.deployment.name=%s" (include "epode-sidecar.fullname" .)) (printf "k8s.container.name=%s" $s.name) -}}
{{- end -}}
{{- range $k, $v := $o.resourceAttributes -}}{{- $resAttrs = append $resAttrs (printf "%s=%s" $k (toString $v)) -}}{{- end -}}
{{- $rows := list
  (list "EPODE_SIDECAR_UPSTREAM" "sidecar.upstreamUrl (or upstream.scheme/port/path)" $upstream)
  (list "EPODE_SIDECAR_LISTEN" "sidecar.listenAddress and sidecar.port" (printf "%s:%v" $s.listenAddress ($s.port | int)))
  (list "EPODE_SIDECAR_ADMIN_LISTEN" "sidecar.listenAddress and sidecar.adminPort" (printf "%s:%v" $s.listenAddress ($s.adminPort | int)))
  (list "EPODE_SIDECAR_PATH" "sidecar.path" $s.path)
  (list "EPODE_SIDECAR_REPLICA_URL" "sidecar.replicaUrl" (include "epode-sidecar.replicaUrl" .))
  (list "EPODE_SIDECAR_UPSTREAM_PROTOCOL" "sidecar.upstreamProtocol" $s.upstreamProtocol)
  (list "EPODE_SIDECAR_UPSTREAM_TIMEOUT" "sidecar.upstreamTimeout" $s.upstreamTimeout)
  (list "EPODE_SIDECAR_ALLOWED_ORIGINS" "sidecar.allowedOrigins" (join "," $s.allowedOrigins))
  (list "EPODE_SIDECAR_ALLOWED_HOSTS" "sidecar.allowedHosts" (join "," $s.allowedHosts))
  (list "EPODE_SIDECAR_SHUTDOWN_GRACE" "sidecar.shutdownGrace" $s.shutdownGrace)
  (list "EPODE_SIDECAR_WORKERS" "sidecar.workers" $s.workers)
  (list "EPODE_SIDECAR_SERVER_NAME" "sidecar.serverName" $s.serverName)
  (list "EPODE_SIDECAR_SERVER_VERSION" "sidecar.serverVersion" $s.serverVersion)
  (list "EPODE_SIDECAR_CACHE_TTL_MS" "sidecar.cacheTtlMs" $s.cacheTtlMs)
  (list "EPODE_SIDECAR_CACHE_SCOPE" "sidecar.cacheScope" $s.cacheScope)
  (list "EPODE_SIDECAR_LOG" "sidecar.log.level" $s.log.level)
  (list "EPODE_SIDECAR_LOG_FORMAT" "sidecar.log.format" $s.log.format)
  (list "EPODE_SIDECAR_ACCESS_LOG" "sidecar.log.access" (ternary "on" "" (eq $s.log.access true)))
  (list "EPODE_SIDECAR_MAX_BODY_BYTES" "sidecar.limits.maxBodyBytes" $l.maxBodyBytes)
  (list "EPODE_SIDECAR_MAX_HEADER_BYTES" "sidecar.limits.maxHeaderBytes" $l.maxHeaderBytes)
  (list "EPODE_SIDECAR_MAX_HEADERS" "sidecar.limits.maxHeaders" $l.maxHeaders)
  (list "EPODE_SIDECAR_HEADER_TIMEOUT" "sidecar.limits.headerTimeout" $l.headerTimeout)
  (list "EPODE_SIDECAR_BODY_TIMEOUT" "sidecar.limits.bodyTimeout" $l.bodyTimeout)
  (list "EPODE_SIDECAR_IDLE_TIMEOUT" "sidecar.limits.idleTimeout" $l.idleTimeout)
  (list "EPODE_SIDECAR_MAX_CONNECTIONS" "sidecar.limits.maxConnections" $l.maxConnections)
  (list "EPODE_SIDECAR_MAX_IN_FLIGHT" "sidecar.limits.maxInFlight" $l.maxInFlight)
  (list "EPODE_SIDECAR_MEMORY_BUDGET_BYTES" "sidecar.limits.memoryBudgetBytes" $l.memoryBudgetBytes)
  (list "EPODE_SIDECAR_MAX_UPSTREAM_ANSWER_BYTES" "sidecar.limits.maxUpstreamAnswerBytes" $l.maxUpstreamAnswerBytes)
  (list "EPODE_SIDECAR_MAX_SSE_EVENT_BYTES" "sidecar.limits.maxSseEventBytes" $l.maxSseEventBytes)
  (list "EPODE_SIDECAR_UPSTREAM_SESSIONS" "sidecar.limits.upstreamSessions" $l.upstreamSessions)
  (list "EPODE_SIDECAR_UPSTREAM_SESSION_IDLE" "sidecar.limits.upstreamSessionIdle" $l.upstreamSessionIdle)
  (list "EPODE_SIDECAR_HELD_CALLS" "sidecar.limits.heldCalls" $l.heldCalls)
  (list "EPODE_SIDECAR_HELD_CALL_WAIT" "sidecar.limits.heldCallWait" $l.heldCallWait)
  (list "EPODE_SIDECAR_LISTEN_STREAMS" "sidecar.limits.listenStreams" $l.listenStreams)
  (list "EPODE_SIDECAR_HELD_CALLS_PER_CALLER" "sidecar.limits.heldCallsPerCaller" $l.heldCallsPerCaller)
  (list "EPODE_SIDECAR_LISTEN_STREAMS_PER_CALLER" "sidecar.limits.listenStreamsPerCaller" $l.listenStreamsPerCaller)
  (list "EPODE_SIDECAR_QUESTIONS" "sidecar.limits.questions" $l.questions)
  (list "EPODE_SIDECAR_QUESTIONS_PER_CALLER" "sidecar.limits.questionsPerCaller" $l.questionsPerCaller)
  (list "EPODE_SIDECAR_SESSION_STREAM_QUESTIONS" "sidecar.limits.sessionStreamQuestions" (ternary "on" (ternary "off" "" (eq $l.sessionStreamQuestions false)) (eq $l.sessionStreamQuestions true)))
  (list "EPODE_SIDECAR_TASKS" "sidecar.limits.tasks" $l.tasks)
  (list "EPODE_SIDECAR_TASKS_PER_CALLER" "sidecar.limits.tasksPerCaller" $l.tasksPerCaller)
  (list "EPODE_SIDECAR_UPSTREAM_SESSIONS_PER_CALLER" "sidecar.limits.upstreamSessionsPerCaller" $l.upstreamSessionsPerCaller)
  (list "EPODE_SIDECAR_UPSTREAM_HOLD_SHARE" "sidecar.limits.upstreamHoldShare" $l.upstreamHoldShare)
  (list "EPODE_SIDECAR_UPSTREAM_MAX_IDLE" "sidecar.limits.upstreamMaxIdle" $l.upstreamMaxIdle)
  (list "EPODE_SIDECAR_UPSTREAM_IDLE_TIMEOUT" "sidecar.limits.upstreamIdleTimeout" $l.upstreamIdleTimeout)
  (list "EPODE_SIDECAR_UPSTREAM_MAX_CONNECTIONS" "sidecar.limits.upstreamMaxConnections" $l.upstreamMaxConnections)
  (list "EPODE_SIDECAR_UPSTREAM_WAIT" "sidecar.limits.upstreamWait" $l.upstreamWait)
  (list "EPODE_SIDECAR_RATE_LIMIT" "sidecar.rateLimit.perClient" $r.perClient)
  (list "EPODE_SIDECAR_RATE_BURST" "sidecar.rateLimit.burst" $r.burst)
  (list "EPODE_SIDECAR_RATE_LIMIT_CLIENTS" "sidecar.rateLimit.clients" $r.clients)
  (list "EPODE_SIDECAR_TOOL_RATE_LIMITS" "sidecar.rateLimit.tools" (join "," $tools))
  (list "EPODE_SIDECAR_TRUSTED_PROXIES" "sidecar.rateLimit.trustedProxies" (join "," $r.trustedProxies))
  (list "EPODE_SIDECAR_TLS_CERT" "sidecar.tls" (ternary (printf "%s/tls.crt" $tlsDir) "" (and $s.tls.enabled true)))
  (list "EPODE_SIDECAR_TLS_KEY" "sidecar.tls" (ternary (printf "%s/tls.key" $tlsDir) "" (and $s.tls.enabled true)))
  (list "EPODE_SIDECAR_TLS_RELOAD" "sidecar.tls.reload" $s.tls.reload)
  (list "EPODE_SIDECAR_CA_FILE" "sidecar.upstreamTls.caSecretName" (ternary (printf "/etc/epode-sidecar/upstream-ca/%s" $s.upstreamTls.caKey) "" (not (empty $s.upstreamTls.caSecretName))))
  (list "EPODE_SIDECAR_UPSTREAM_CLIENT_CERT" "sidecar.upstreamTls.clientCertSecretName" (ternary "/etc/epode-sidecar/upstream-client/tls.crt" "" (not (empty $s.upstreamTls.clientCertSecretName))))
  (list "EPODE_SIDECAR_UPSTREAM_CLIENT_KEY" "sidecar.upstreamTls.clientCertSecretName" (ternary "/etc/epode-sidecar/upstream-client/tls.key" "" (not (empty $s.upstreamTls.clientCertSecretName))))
  (list "AGENT_FEEDBACK_MODE" "epode.mode" (include "epode-sidecar.mode" .))
  (list "EPODE_API_URL" "epode.apiUrl" $e.apiUrl)
  (list "AGENT_FEEDBACK_CONSENT_TIMEOUT_MS" "epode.consentTimeoutMs" $e.consentTimeoutMs)
  (list "EPODE_SIDECAR_FEEDBACK_TIMEOUT" "epode.feedbackTimeout" $e.feedbackTimeout)
  (list "EPODE_SIDECAR_INCLUDE_TOOLS" "epode.includeTools" (join "," $e.includeTools))
  (list "EPODE_SIDECAR_EXCLUDE_TOOLS" "epode.excludeTools" (join "," $e.excludeTools))
  (list "EPODE_SIDECAR_FEEDBACK_TOOLS" "epode.feedbackTools" (join "," $e.feedbackTools))
  (list "EPODE_SIDECAR_UPSTREAM_EPODE" "epode.upstreamEpode" $e.upstreamEpode)
  (list "EPODE_SIDECAR_IDENTITY_HEADERS" "epode.identityHeaders" (join "," $ids))
  (list "EPODE_SIDECAR_MAX_TOOLS" "epode.maxTools" $e.maxTools)
  (list "EPODE_SIDECAR_CUSTOMER_CONTEXT" "epode.customerContext.enabled" (ternary "on" "" (eq $e.customerContext.enabled true)))
  (list "EPODE_SIDECAR_CUSTOMER_CONTEXT_TOOLS" "epode.customerContext.tools" (join "," $e.customerContext.tools))
  (list "EPODE_SIDECAR_CUSTOMER_CONTEXT_FIELDS" "epode.customerContext.fields" (join "," $e.customerContext.fields))
  (list "EPODE_SIDECAR_CUSTOMER_CONTEXT_PURPOSE" "epode.customerContext.purpose" $e.customerContext.purpose)
  (list "EPODE_SIDECAR_CUSTOMER_CONTEXT_BUDGET" "epode.customerContext.budget" $e.customerContext.budget)
  (list "EPODE_SIDECAR_CUSTOMER_CONTEXT_TIMEOUT" "epode.customerContext.timeout" $e.customerContext.timeout)
  (list "EPODE_SIDECAR_CUSTOMER_CONTEXT_REQUESTS" "epode.customerContext.requests" $e.customerContext.requests)
  (list "EPODE_SIDECAR_CUSTOMER_CONTEXT_REQUESTS_PER_CALLER" "epode.customerContext.requestsPerCaller" $e.customerContext.requestsPerCaller)
  (list "EPODE_SIDECAR_HTTP_SURFACE" "epode.httpSurface.enabled" (ternary "on" "" (eq $e.httpSurface.enabled true)))
  (list "EPODE_SIDECAR_HTTP_MAX_BODY" "epode.httpSurface.maxBody" $e.httpSurface.maxBody)
  (list "EPODE_SIDECAR_HTTP_CACHE_MODE" "epode.httpSurface.cacheMode" $e.httpSurface.cacheMode)
  (list "EPODE_SIDECAR_HTTP_EXCLUDE" "epode.httpSurface.exclude" (join "," $e.httpSurface.exclude))
  (list "EPODE_SIDECAR_OPERATIONS_PREFIX" "epode.httpSurface.operationsPrefix" $e.httpSurface.operationsPrefix)
  (list "EPODE_SIDECAR_HTTP_ROUTES" "epode.httpSurface.routes" (join "," $e.httpSurface.routes))
  (list "EPODE_SIDECAR_HTTP_UPSTREAM_SHARE" "epode.httpSurface.upstreamShare" $e.httpSurface.upstreamShare)
  (list "EPODE_SIDECAR_REQUEST_OBSERVATION" "epode.httpSurface.requestObservation" (ternary "on" (ternary "off" "" (eq $e.httpSurface.requestObservation false)) (eq $e.httpSurface.requestObservation true)))
  (list "EPODE_SIDECAR_TELEMETRY_QUEUE" "epode.telemetry.queue" $t.queue)
  (list "EPODE_SIDECAR_TELEMETRY_BATCH" "epode.telemetry.batch" $t.batch)
  (list "EPODE_SIDECAR_TELEMETRY_CONCURRENCY" "epode.telemetry.concurrency" $t.concurrency)
  (list "EPODE_SIDECAR_TELEMETRY_FLUSH" "epode.telemetry.flush" $t.flush)
  (list "EPODE_SIDECAR_TELEMETRY_RETRY_BASE" "epode.telemetry.retryBase" $t.retryBase)
  (list "EPODE_SIDECAR_TELEMETRY_SHUTDOWN" "epode.telemetry.shutdown" $t.shutdown)
  (list "EPODE_SIDECAR_AUTH" "auth.mode" (ternary "" $authMode (eq $authMode "off")))
  (list "EPODE_SIDECAR_AUTH_ISSUER" "auth.issuer" $a.issuer)
  (list "EPODE_SIDECAR_AUTH_RESOURCE" "auth.resource" $a.resource)
  (list "EPODE_SIDECAR_AUTH_SCOPES" "auth.scopes" (join " " $a.scopes))
  (list "EPODE_SIDECAR_AUTH_ALGORITHMS" "auth.algorithms" (join "," $a.algorithms))
  (list "EPODE_SIDECAR_AUTH_LEEWAY" "auth.leeway" $a.leeway)
  (list "EPODE_SIDECAR_AUTH_TOKEN_TYPE" "auth.tokenType" $a.tokenType)
  (list "EPODE_SIDECAR_AUTH_USER_CLAIM" "auth.userClaim" $a.userClaim)
  (list "EPODE_SIDECAR_AUTH_ACCOUNT_CLAIM" "auth.accountClaim" $a.accountClaim)
  (list "EPODE_SIDECAR_AUTH_CLIENT_ID" "auth.clientId" $a.clientId)
  (list "EPODE_SIDECAR_AUTH_FORWARD_TOKEN" "auth.forwardToken" (ternary "true" "" (eq $a.forwardToken true)))
  (list "EPODE_SIDECAR_AUTH_CACHE_ENTRIES" "auth.cacheEntries" $a.cacheEntries)
  (list "EPODE_SIDECAR_AUTH_KEYS_REFRESH" "auth.keysRefresh" $a.keysRefresh)
  (list "EPODE_SIDECAR_AUTH_KEYS_MAX_AGE" "auth.keysMaxAge" $a.keysMaxAge)
  (list "EPODE_SIDECAR_AUTH_FETCH_TIMEOUT" "auth.fetchTimeout" $a.fetchTimeout)
  (list "EPODE_SIDECAR_AUTH_INTROSPECTION_CACHE" "auth.introspectionCache" $a.introspectionCache)
  (list "EPODE_SIDECAR_AUTH_INTROSPECTIONS" "auth.introspections" $a.introspections)
  (list "EPODE_SIDECAR_AUTH_INTROSPECTIONS_PER_CALLER" "auth.introspectionsPerCaller" $a.introspectionsPerCaller)
  (list "EPODE_SIDECAR_AUTH_HTTP_SURFACE" "auth.httpSurface" (ternary "true" "" (eq $a.httpSurface true)))
  (list "EPODE_SIDECAR_AUTH_DOCUMENTATION" "auth.documentation" $a.documentation)
  (list "EPODE_SIDECAR_AUTH_OPERATION_SCOPES" "auth.operationScopes" (join "; " $opScopes))
  (list "EPODE_SIDECAR_AUTH_SCOPE_IMPLIES" "auth.scopeImplies" (join "; " $implies))
  (list "EPODE_SIDECAR_AUTH_AUDIENCE" "auth.audience" (join "," $a.audience))
  (list "EPODE_SIDECAR_AUTH_FACADE" "auth.facade" (ternary "true" "" (eq $a.facade true)))
  (list "EPODE_SIDECAR_AUTH_CLIENT_SECRET" "auth.clientSecret.existingSecret and auth.clientSecret.existingSecretKey" "")
  (list "EPODE_SIDECAR_OTLP_ENDPOINT" "observability.otlp.endpoint" $o.endpoint)
  (list "OTEL_EXPORTER_OTLP_ENDPOINT" "observability.otlp.endpoint" "")
  (list "OTEL_EXPORTER_OTLP_HEADERS" "observability.otlp.headers.existingSecret and observability.otlp.headers.existingSecretKey" "")
  (list "EPODE_SIDECAR_OTLP_QUEUE" "observability.otlp.queue" $o.queue)
  (list "EPODE_SIDECAR_OTLP_TIMEOUT" "observability.otlp.timeout" $o.timeout)
  (list "OTEL_EXPORTER_OTLP_TIMEOUT" "observability.otlp.timeout" "")
  (list "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT" "observability.otlp.timeout" "")
  (list "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT" "observability.otlp.timeout" "")
  (list "OTEL_EXPORTER_OTLP_CERTIFICATE" "observability.otlp.certificate" $o.certificate)
  (list "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE" "observability.otlp.certificate" "")
  (list "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE" "observability.otlp.certificate" "")
  (list "EPODE_SIDECAR_OTLP_METRICS" "observability.otlp.metrics" $otlpMetrics)
  (list "EPODE_SIDECAR_OTLP_METRICS_INTERVAL" "observability.otlp.metricsInterval" $o.metricsInterval)
  (list "OTEL_METRIC_EXPORT_INTERVAL" "observability.otlp.metricsInterval" "")
  (list "OTEL_SERVICE_NAME" "observability.otlp.serviceName" $o.serviceName)
  (list "OTEL_RESOURCE_ATTRIBUTES" "observability.otlp.resourceAttributes" (join "," $resAttrs))
  (list "OTEL_TRACES_SAMPLER" "observability.otlp.sampler" $o.sampler)
  (list "OTEL_TRACES_SAMPLER_ARG" "observability.otlp.samplerArg" $o.samplerArg)
  (list "EPODE_API_KEY" "epode.existingSecret and epode.existingSecretKey" "")
  (list "AGENT_FEEDBACK_KEY" "epode.existingSecret and epode.existingSecretKey" "")
  (list "AGENT_FEEDBACK_URL" "epode.apiUrl" "")
  (list "AGENT_FEEDBACK_ENABLED" "epode.mode (off)" "")
-}}
{{- toJson $rows -}}
{{- end -}}

{{/*
Render-time checks. The product key may only come from a Secret reference: a value that looks
like a key, anywhere in the values, fails the render (the message never repeats it), and so
does any key variable given through env, extraEnv or the server's env. The same holds for the
authorization client secret (auth.clientSecret), and auth on needs what the sidecar needs.
*/}}
{{- define "epode-sidecar.validate" -}}
{{- $v := .Values -}}
{{- if regexMatch "af_live_[0-9a-fA-F]{32}_" (toJson $v) -}}
{{- fail "epode-sidecar: a value looks like an Epode product key (af_live_…). The key is never a chart value: create a Secret (kubectl create secret generic epode-sidecar --from-literal=api-key=af_live_…) and name it with epode.existingSecret and epode.existingSecretKey." -}}
{{- end -}}
{{- $keyNames := list "EPODE_API_KEY" "AGENT_FEEDBACK_KEY" -}}
{{- range $name, $_ := $v.sidecar.env -}}
{{- if has $name $keyNames -}}
{{- fail (printf "epode-sidecar: sidecar.env.%s is refused: the product key comes only from a Secret named by epode.existingSecret (key epode.existingSecretKey)." $name) -}}
{{- end -}}
{{- end -}}
{{- range $v.sidecar.extraEnv -}}
{{- if has (toString .name) $keyNames -}}
{{- fail (printf "epode-sidecar: sidecar.extraEnv %s is refused: the product key comes only from a Secret named by epode.existingSecret (key epode.existingSecretKey)." (toString .name)) -}}
{{- end -}}
{{- end -}}
{{- range $v.upstream.env -}}
{{- if has (toString .name) $keyNames -}}
{{- fail (printf "epode-sidecar: upstream.env %s is refused: the MCP server never needs the product key; only the sidecar reads it, from epode.existingSecret." (toString .name)) -}}
{{- end -}}
{{- end -}}
{{- $authSecret := "EPODE_SIDECAR_AUTH_CLIENT_SECRET" -}}
{{- $authSecretHint := "the authorization client secret comes only from a Secret named by auth.clientSecret.existingSecret (key auth.clientSecret.existingSecretKey)." -}}
{{- range $name, $_ := $v.sidecar.env -}}
{{- if eq $name $authSecret -}}
{{- fail (printf "epode-sidecar: sidecar.env.%s is refused: %s" $name $authSecretHint) -}}
{{- end -}}
{{- end -}}
{{- range $v.sidecar.extraEnv -}}
{{- if eq (toString .name) $authSecret -}}
{{- fail (printf "epode-sidecar: sidecar.extraEnv %s is refused: %s" (toString .name) $authSecretHint) -}}
{{- end -}}
{{- end -}}
{{- range $v.upstream.env -}}
{{- if eq (toString .name) $authSecret -}}
{{- fail (printf "epode-sidecar: upstream.env %s is refused: the MCP server never needs the sidecar's client secret; %s" (toString .name) $authSecretHint) -}}
{{- end -}}
{{- end -}}
{{- $authMode := include "epode-sidecar.authMode" . -}}
{{- if ne $authMode "off" -}}
{{- $a := $v.auth -}}
{{- $missing := list -}}
{{- if not $a.issuer -}}
{{- $missing = append $missing "auth.issuer (the authorization server's issuer, an https:// URL exactly as its tokens' iss claim writes it)" -}}
{{- end -}}
{{- if not $a.resource -}}
{{- $missing = append $missing "auth.resource (this MCP server's canonical URI as its clients reach it, such as https://mcp.example.com/mcp)" -}}
{{- end -}}
{{- if eq $authMode "introspect" -}}
{{- if not $a.clientId -}}
{{- $missing = append $missing "auth.clientId (the sidecar's client id at the authorization server, for its introspection endpoint)" -}}
{{- end -}}
{{- if not $a.clientSecret.existingSecret -}}
{{- $missing = append $missing (printf "auth.clientSecret.existingSecret (the name of a Secret holding the sidecar's client secret under the key auth.clientSecret.existingSecretKey, which you create: kubectl create secret generic epode-sidecar-auth --from-literal=%s=…)" $a.clientSecret.existingSecretKey) -}}
{{- end -}}
{{- end -}}
{{- $scopes := $a.scopes | default list -}}
{{- range $a.operationScopes -}}{{- $scopes = concat $scopes .scopes -}}{{- end -}}
{{- range $_, $granted := $a.scopeImplies -}}{{- $scopes = concat $scopes $granted -}}{{- end -}}
{{- if has "offline_access" $scopes -}}
{{- fail "epode-sidecar: offline_access is in auth.scopes, auth.operationScopes or auth.scopeImplies: it is no scope of a resource (MCP: it belongs in no challenge and no scopes_supported); leave it out." -}}
{{- end -}}
{{- if $missing -}}
{{- fail (printf "epode-sidecar: auth.mode is %s, which needs: %s. Or set auth.mode=off." $authMode (join "; " $missing)) -}}
{{- end -}}
{{- end -}}
{{- if and (include "epode-sidecar.feedbackOn" .) (not $v.epode.existingSecret) -}}
{{- fail (printf "epode-sidecar: epode.mode is %s, which needs the product key: create a Secret (kubectl create secret generic epode-sidecar --from-literal=api-key=af_live_…) and set epode.existingSecret to its name (and epode.existingSecretKey to its key, default api-key), or set epode.mode=off." (include "epode-sidecar.mode" .)) -}}
{{- end -}}
{{- $managed := dict -}}
{{- range (include "epode-sidecar.settings" . | fromJsonArray) -}}
{{- $_ := set $managed (index . 0) (index . 1) -}}
{{- end -}}
{{- range $name, $_ := $v.sidecar.env -}}
{{- if hasKey $managed $name -}}
{{- fail (printf "epode-sidecar: sidecar.env.%s is refused: the chart sets %s from %s; set that value instead." $name $name (index $managed $name)) -}}
{{- end -}}
{{- end -}}
{{- range $v.sidecar.extraEnv -}}
{{- if hasKey $managed (toString .name) -}}
{{- fail (printf "epode-sidecar: sidecar.extraEnv %s is refused: the chart sets it from %s; set that value instead." (toString .name) (index $managed (toString .name))) -}}
{{- end -}}
{{- end -}}
{{- if and $v.sidecar.tls.enabled (not $v.sidecar.tls.secretName) -}}
{{- fail "epode-sidecar: sidecar.tls.enabled needs sidecar.tls.secretName (a Secret of type kubernetes.io/tls with tls.crt and tls.key)." -}}
{{- end -}}
{{- if and $v.pdb.enabled (not (kindIs "invalid" $v.pdb.minAvailable)) (not (kindIs "invalid" $v.pdb.maxUnavailable)) -}}
{{- fail "epode-sidecar: set one of pdb.minAvailable and pdb.maxUnavailable (the other null)." -}}
{{- end -}}
{{- if eq (int $v.sidecar.port) (int $v.sidecar.adminPort) -}}
{{- fail "epode-sidecar: sidecar.port and sidecar.adminPort must differ." -}}
{{- end -}}
{{- if or (eq (int $v.upstream.port) (int $v.sidecar.port)) (eq (int $v.upstream.port) (int $v.sidecar.adminPort)) -}}
{{- fail "epode-sidecar: upstream.port must differ from sidecar.port and sidecar.adminPort (one network namespace)." -}}
{{- end -}}
{{- $_ := include "epode-sidecar.terminationGrace" . -}}
{{- end -}}

{{/* A setting's value as the sidecar reads it: numbers as integers, "" for unset. */}}
{{- define "epode-sidecar.settingValue" -}}
{{- if kindIs "invalid" . -}}
{{- else if or (kindIs "float64" .) (kindIs "int64" .) (kindIs "int" .) -}}
{{- . | int64 | toString -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}

{{/* The sidecar container's env entries (a YAML list). */}}
{{- define "epode-sidecar.env" -}}
{{- if contains "$(POD_IP)" (include "epode-sidecar.replicaUrl" .) }}
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- end -}}
{{- if and .Values.observability.otlp.endpoint .Values.observability.otlp.kubernetesAttributes }}
{{- range $name, $field := dict "POD_NAME" "metadata.name" "POD_UID" "metadata.uid" "POD_NAMESPACE" "metadata.namespace" "NODE_NAME" "spec.nodeName" }}
- name: {{ $name }}
  valueFrom:
    fieldRef:
      fieldPath: {{ $field }}
{{- end -}}
{{- end -}}
{{- range (include "epode-sidecar.settings" . | fromJsonArray) -}}
{{- $value := include "epode-sidecar.settingValue" (index . 2) -}}
{{- if ne $value "" }}
- name: {{ index . 0 }}
  value: {{ $value | quote }}
{{- end -}}
{{- end -}}
{{- if include "epode-sidecar.feedbackOn" . }}
- name: EPODE_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.epode.existingSecret | quote }}
      key: {{ .Values.epode.existingSecretKey | quote }}
{{- end -}}
{{- if and .Values.observability.otlp.endpoint .Values.observability.otlp.headers.existingSecret }}
- name: OTEL_EXPORTER_OTLP_HEADERS
  valueFrom:
    secretKeyRef:
      name: {{ .Values.observability.otlp.headers.existingSecret | quote }}
      key: {{ .Values.observability.otlp.headers.existingSecretKey | quote }}
{{- end -}}
{{- if eq (include "epode-sidecar.authMode" .) "introspect" }}
- name: EPODE_SIDECAR_AUTH_CLIENT_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ .Values.auth.clientSecret.existingSecret | quote }}
      key: {{ .Values.auth.clientSecret.existingSecretKey | quote }}
{{- end -}}
{{- range $name := keys .Values.sidecar.env | sortAlpha }}
- name: {{ $name }}
  value: {{ include "epode-sidecar.settingValue" (index $.Values.sidecar.env $name) | quote }}
{{- end -}}
{{- with .Values.sidecar.extraEnv }}
{{ toYaml . }}
{{- end -}}
{{- end -}}

{{/*
The sidecar container. Arguments: (dict "root" $ "native" true|false), $ being this chart's
context (from another chart: index .Subcharts "epode-sidecar").
*/}}
{{- define "epode-sidecar.sidecarContainer" -}}
{{- $root := .root -}}
{{- include "epode-sidecar.validate" $root -}}
{{- $s := $root.Values.sidecar -}}
- name: {{ $s.name }}
  image: {{ include "epode-sidecar.image" (dict "image" $s.image "defaultTag" $root.Chart.AppVersion) | quote }}
  imagePullPolicy: {{ $s.image.pullPolicy }}
  {{- if .native }}
  restartPolicy: Always
  {{- end }}
  ports:
    - name: mcp
      containerPort: {{ $s.port | int }}
      protocol: TCP
    - name: admin
      containerPort: {{ $s.adminPort | int }}
      protocol: TCP
  env:
    {{- include "epode-sidecar.env" $root | trim | nindent 4 }}
  startupProbe:
    httpGet:
      path: /healthz
      port: {{ $s.adminPort | int }}
    {{- toYaml $s.probes.startup | nindent 4 }}
  livenessProbe:
    httpGet:
      path: /healthz
      port: {{ $s.adminPort | int }}
    {{- toYaml $s.probes.liveness | nindent 4 }}
  readinessProbe:
    httpGet:
      path: /readyz
      port: {{ $s.adminPort | int }}
    {{- toYaml $s.probes.readiness | nindent 4 }}
  {{- if and (not .native) (gt (int $s.preStopSleepSeconds) 0) (include "epode-sidecar.sleepSupported" $root) }}
  lifecycle:
    preStop:
      sleep:
        seconds: {{ $s.preStopSleepSeconds | int }}
  {{- end }}
  {{- with $s.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    runAsNonRoot: true
    runAsUser: 65532
    runAsGroup: 65532
    readOnlyRootFilesystem: true
    allowPrivilegeEscalation: false
    privileged: false
    capabilities:
      drop: [ALL]
    seccompProfile:
      type: RuntimeDefault
  {{- $mounts := include "epode-sidecar.sidecarVolumeMounts" $root | trim }}
  {{- if $mounts }}
  volumeMounts:
    {{- $mounts | nindent 4 }}
  {{- end }}
{{- end -}}

{{/* Public: the sidecar as a native sidecar, for a pod's initContainers. */}}
{{- define "epode-sidecar.initContainer" -}}
{{- include "epode-sidecar.sidecarContainer" (dict "root" . "native" true) -}}
{{- end -}}

{{/* Public: the sidecar as a classic container, for a pod's containers. */}}
{{- define "epode-sidecar.container" -}}
{{- include "epode-sidecar.sidecarContainer" (dict "root" . "native" false) -}}
{{- end -}}

{{- define "epode-sidecar.sidecarVolumeMounts" -}}
{{- $s := .Values.sidecar -}}
{{- if $s.tls.enabled }}
- name: epode-sidecar-tls
  mountPath: {{ trimSuffix "/" $s.tls.mountPath }}
  readOnly: true
{{- end }}
{{- if $s.upstreamTls.caSecretName }}
- name: epode-sidecar-upstream-ca
  mountPath: /etc/epode-sidecar/upstream-ca
  readOnly: true
{{- end }}
{{- if $s.upstreamTls.clientCertSecretName }}
- name: epode-sidecar-upstream-client
  mountPath: /etc/epode-sidecar/upstream-client
  readOnly: true
{{- end }}
{{- with $s.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Public: the volumes the sidecar's mounts need (a YAML list, possibly empty). */}}
{{- define "epode-sidecar.volumes" -}}
{{- $s := .Values.sidecar -}}
{{- if $s.tls.enabled }}
- name: epode-sidecar-tls
  secret:
    secretName: {{ $s.tls.secretName | quote }}
    defaultMode: 288 # 0440: root and the pod's fsGroup (65532)
    items:
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
{{- end }}
{{- if $s.upstreamTls.caSecretName }}
- name: epode-sidecar-upstream-ca
  secret:
    secretName: {{ $s.upstreamTls.caSecretName | quote }}
    defaultMode: 288
    items:
      - key: {{ $s.upstreamTls.caKey | quote }}
        path: {{ $s.upstreamTls.caKey | quote }}
{{- end }}
{{- if $s.upstreamTls.clientCertSecretName }}
- name: epode-sidecar-upstream-client
  secret:
    secretName: {{ $s.upstreamTls.clientCertSecretName | quote }}
    defaultMode: 288
    items:
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
{{- end }}
{{- end -}}

{{/*
The MCP server's container security context: what no server needs taken away, and with
upstream.hardened the sidecar's own hardening; upstream.securityContext merged over it.
*/}}
{{- define "epode-sidecar.upstreamSecurityContext" -}}
{{- $sc := dict "allowPrivilegeEscalation" false "privileged" false "capabilities" (dict "drop" (list "ALL")) "seccompProfile" (dict "type" "RuntimeDefault") -}}
{{- if .Values.upstream.hardened -}}
{{- $sc = merge (dict "runAsNonRoot" true "runAsUser" 65532 "runAsGroup" 65532 "readOnlyRootFilesystem" true) $sc -}}
{{- end -}}
{{- toYaml (mergeOverwrite $sc (deepCopy (.Values.upstream.securityContext | default dict))) -}}
{{- end -}}

{{/*
The external ways in (ingress, httpRoute) checked: each names its host(s); with auth on,
auth.resource must be what a client outside reaches: one of those hosts and the MCP path
(clients compare it with the URL they were given, and tokens name it).
*/}}
{{- define "epode-sidecar.checkExternal" -}}
{{- $v := .Values -}}
{{- $hosts := list -}}
{{- if $v.ingress.enabled -}}
{{- if not $v.ingress.host -}}
{{- fail "epode-sidecar: ingress.enabled needs ingress.host, the name clients use (e.g. mcp.example.com)" -}}
{{- end -}}
{{- $hosts = append $hosts $v.ingress.host -}}
{{- end -}}
{{- if $v.httpRoute.enabled -}}
{{- if not $v.httpRoute.parentRefs -}}
{{- fail "epode-sidecar: httpRoute.enabled needs httpRoute.parentRefs, the Gateway (and listener) it attaches to, e.g. [{name: public, namespace: gateways, sectionName: https}]" -}}
{{- end -}}
{{- if not $v.httpRoute.hostnames -}}
{{- fail "epode-sidecar: httpRoute.enabled needs httpRoute.hostnames, the names clients use (e.g. [mcp.example.com])" -}}
{{- end -}}
{{- $hosts = concat $hosts $v.httpRoute.hostnames -}}
{{- end -}}
{{- if ne (include "epode-sidecar.authMode" .) "off" -}}
{{- $u := urlParse (toString $v.auth.resource) -}}
{{- if not (has $u.host $hosts) -}}
{{- fail (printf "epode-sidecar: auth.resource (%s) names the host %q, but clients come in through %s: set auth.resource to https://<that host>%s (the URL clients are given, which every token must name)" $v.auth.resource $u.host (join ", " $hosts) $v.sidecar.path) -}}
{{- end -}}
{{- if ne $u.path $v.sidecar.path -}}
{{- fail (printf "epode-sidecar: auth.resource (%s) has the path %q, but the MCP path is sidecar.path (%s): the resource is the URL clients reach, https://<host>%s" $v.auth.resource $u.path $v.sidecar.path $v.sidecar.path) -}}
{{- end -}}
{{- if and $v.ingress.enabled $v.ingress.tls.secretName (ne $u.scheme "https") -}}
{{- fail (printf "epode-sidecar: auth.resource (%s) must be https:// when the Ingress ends TLS (ingress.tls.secretName)" $v.auth.resource) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The URL clients outside reach, when an Ingress or an HTTPRoute is rendered; else "". */}}
{{- define "epode-sidecar.externalUrl" -}}
{{- $v := .Values -}}
{{- if ne (include "epode-sidecar.authMode" .) "off" -}}
{{- if or $v.ingress.enabled $v.httpRoute.enabled -}}{{ $v.auth.resource }}{{- end -}}
{{- else if $v.ingress.enabled -}}
{{- printf "%s://%s%s" (ternary "https" "http" (not (empty $v.ingress.tls.secretName))) $v.ingress.host $v.sidecar.path -}}
{{- else if $v.httpRoute.enabled -}}
{{- printf "https://%s%s" (first $v.httpRoute.hostnames) $v.sidecar.path -}}
{{- end -}}
{{- end -}}
