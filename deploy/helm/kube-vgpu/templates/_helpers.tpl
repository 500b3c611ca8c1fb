{{/*
Names, labels, images and the derived values every template shares. Templates hold one object
each and take every name from here, so a Service, its selector and the webhook that points at it
cannot drift apart.
*/}}

{{- define "kube-vgpu.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* <release>-kube-vgpu, or the release name alone when it already contains the chart name. */}}
{{- define "kube-vgpu.fullname" -}}
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

{{- define "kube-vgpu.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kube-vgpu.labels" -}}
helm.sh/chart: {{ include "kube-vgpu.chart" . }}
app.kubernetes.io/name: {{ include "kube-vgpu.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels of one component: call with (dict "ctx" $ "component" "scheduler"). */}}
{{- define "kube-vgpu.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kube-vgpu.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "kube-vgpu.scheduler.fullname" -}}
{{- printf "%s-scheduler" (include "kube-vgpu.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kube-vgpu.devicePlugin.fullname" -}}
{{- printf "%s-device-plugin" (include "kube-vgpu.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The ConfigMap holding the shared config file both services read. */}}
{{- define "kube-vgpu.configName" -}}
{{- printf "%s-config" (include "kube-vgpu.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kube-vgpu.scheduler.kubeSchedulerConfigName" -}}
{{- printf "%s-kube-scheduler" (include "kube-vgpu.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kube-vgpu.webhookName" -}}
{{- printf "%s-webhook" (include "kube-vgpu.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kube-vgpu.certgen.fullname" -}}
{{- printf "%s-certgen" (include "kube-vgpu.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kube-vgpu.certManager.certificateName" -}}
{{- printf "%s-scheduler-cert" (include "kube-vgpu.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kube-vgpu.certManager.issuerName" -}}
{{- printf "%s-selfsigned" (include "kube-vgpu.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The Secret with tls.crt/tls.key the scheduler serves with (made by certgen or cert-manager, or yours). */}}
{{- define "kube-vgpu.tlsSecretName" -}}
{{- if eq .Values.tls.mode "secret" }}
{{- required "tls.secret.name is required when tls.mode is secret" .Values.tls.secret.name }}
{{- else }}
{{- printf "%s-scheduler-tls" (include "kube-vgpu.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "kube-vgpu.tlsEnabled" -}}
{{- if has .Values.tls.mode (list "certgen" "certManager" "secret") }}true{{ end }}
{{- end }}

{{/* The scheduler service's listening port: 8443 with TLS, 8080 without (the service's own defaults). */}}
{{- define "kube-vgpu.scheduler.port" -}}
{{- if include "kube-vgpu.tlsEnabled" . }}{{ .Values.scheduler.httpsPort }}{{ else }}{{ .Values.scheduler.httpPort }}{{ end }}
{{- end }}

{{- define "kube-vgpu.scheduler.scheme" -}}
{{- if include "kube-vgpu.tlsEnabled" . }}https{{ else }}http{{ end }}
{{- end }}

{{/* DNS names the serving certificate must cover: the Service in its short and long forms. */}}
{{- define "kube-vgpu.scheduler.dnsNames" -}}
{{- $svc := include "kube-vgpu.scheduler.fullname" . }}
{{- $ns := .Release.Namespace }}
{{- list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) | toJson }}
{{- end }}

{{/* Our image (both services): tag defaults to the chart's appVersion. */}}
{{- define "kube-vgpu.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* The cluster's version without a build suffix: v1.29.3-gke.1200 and v1.29.3+k3s1 give v1.29.3. */}}
{{- define "kube-vgpu.kubeVersion" -}}
{{- $v := regexFind "^v?[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version }}
{{- printf "v%s" (trimPrefix "v" $v) }}
{{- end }}

{{/* kube-scheduler image: tag defaults to the cluster's version, so the scheduler matches the API server. */}}
{{- define "kube-vgpu.kubeScheduler.image" -}}
{{- $img := .Values.scheduler.kubeScheduler.image }}
{{- printf "%s:%s" $img.repository (default (include "kube-vgpu.kubeVersion" .) $img.tag) }}
{{- end }}

{{/* KubeSchedulerConfiguration version: v1 from 1.25 on, v1beta3 on 1.23 and 1.24 (docs/protocol.md#the-extender-entry). */}}
{{- define "kube-vgpu.kubeScheduler.configApiVersion" -}}
{{- if .Values.scheduler.kubeScheduler.configApiVersion }}
{{- .Values.scheduler.kubeScheduler.configApiVersion }}
{{- else if semverCompare ">=1.25.0-0" .Capabilities.KubeVersion.Version }}
{{- "kubescheduler.config.k8s.io/v1" }}
{{- else }}
{{- "kubescheduler.config.k8s.io/v1beta3" }}
{{- end }}
{{- end }}

{{/* The lease kube-scheduler's leader election holds (one active replica at a time). */}}
{{- define "kube-vgpu.scheduler.leaseName" -}}
{{- default (include "kube-vgpu.scheduler.fullname" .) .Values.scheduler.leaderElection.resourceName }}
{{- end }}

{{/* Where the device plugins' liveness Leases live (config scheduler.leaseNamespace): a namespace
of their own, "<release namespace>-leases", unless the config names one. */}}
{{- define "kube-vgpu.leaseNamespace" -}}
{{- $sched := default dict .Values.config.scheduler }}
{{- default (printf "%s-leases" (default "default" .Release.Namespace)) $sched.leaseNamespace }}
{{- end }}

{{/* The device plugin's socket in kubelet's directory: nvidia-<suffix of the count resource>.sock. */}}
{{- define "kube-vgpu.devicePlugin.socketName" -}}
{{- printf "nvidia-%s.sock" (.Values.resourceNames.count | splitList "/" | last) }}
{{- end }}

{{/* Host directory with HAMi-core (libvgpu.so, ld.so.preload): <devicePlugin.hookPath>/vgpu. */}}
{{- define "kube-vgpu.hamiCoreDir" -}}
{{- $dp := default dict .Values.config.devicePlugin }}
{{- printf "%s/vgpu" (default "/usr/local" $dp.hookPath | trimSuffix "/") }}
{{- end }}

{{/*
The host directories of CDI specs the plugin mounts where a CDI deviceListStrategy is configured
(config.devicePlugin or any config.nodes override), one per line as "<path> <rw|ro>": its own spec's
directory (devicePlugin.cdiSpecDir, default /var/run/cdi) read-write, and /etc/cdi and /var/run/cdi
read-only for the toolkit's specs it checks. Empty without a CDI strategy.
*/}}
{{- define "kube-vgpu.cdiMounts" -}}
{{- $dp := default dict .Values.config.devicePlugin }}
{{- $strategies := list "cdi-annotations" "cdi-cri" }}
{{- $cdi := has (default "envvar" $dp.deviceListStrategy) $strategies }}
{{- range $node, $override := (default dict .Values.config.nodes) }}
{{- if has (default "" (default dict $override).deviceListStrategy) $strategies }}{{ $cdi = true }}{{ end }}
{{- end }}
{{- if $cdi }}
{{- $own := default "/var/run/cdi" $dp.cdiSpecDir | trimSuffix "/" }}
{{- $own }} rw
{{ range list "/etc/cdi" "/var/run/cdi" }}{{ if ne . $own }}{{ . }} ro
{{ end }}{{ end }}
{{- end }}
{{- end }}

{{/*
The shared config file (vgpu.core.config, docs/configuration.md): .Values.config as given, with the
keys the chart must own set from their single source in values.yaml, so the scheduler name, the
resource names, the lease namespace and the update guard's trusted identities (guard.*) seen by
both services, kube-scheduler, the webhook and the admission policy agree.
*/}}
{{- define "kube-vgpu.configData" -}}
{{- $cfg := deepCopy (default dict .Values.config) }}
{{- $_ := set $cfg "resources" (deepCopy .Values.resourceNames) }}
{{- $sched := deepCopy (default dict $cfg.scheduler) }}
{{- $_ := set $sched "schedulerName" .Values.schedulerName }}
{{- $_ := set $sched "leaseNamespace" (include "kube-vgpu.leaseNamespace" .) }}
{{- $_ := set $sched "viewsAuth" .Values.views.auth }}
{{- $_ := set $cfg "scheduler" $sched }}
{{- $dp := deepCopy (default dict $cfg.devicePlugin) }}
{{- $_ := set $dp "resourceName" .Values.resourceNames.count }}
{{- $_ := set $cfg "devicePlugin" $dp }}
{{- $wh := deepCopy (default dict $cfg.webhook) }}
{{- $_ := set $wh "trustedUsers" (include "kube-vgpu.guard.users" . | fromJsonArray) }}
{{- $_ := set $wh "trustedGroups" (include "kube-vgpu.guard.groups" . | fromJsonArray) }}
{{- $_ := set $wh "nodeBoundUsers" (include "kube-vgpu.guard.nodeBoundUsers" . | fromJsonArray) }}
{{- if not (hasKey $wh "defaultMode") }}
{{- $_ := set $wh "defaultMode" ((.Values.dra | default dict).defaultMode | default "extender") }}
{{- end }}
{{- $_ := set $cfg "webhook" $wh }}
{{- toYaml $cfg }}
{{- end }}

{{/* Checks of value combinations that would render a broken install. */}}
{{- define "kube-vgpu.validate" -}}
{{- if semverCompare "<1.23.0-0" .Capabilities.KubeVersion.Version }}
{{- fail (printf "kube-vgpu needs Kubernetes 1.23 or newer (KubeSchedulerConfiguration v1beta3/v1); this cluster is %s" .Capabilities.KubeVersion.Version) }}
{{- end }}
{{- if not (has .Values.tls.mode (list "certgen" "certManager" "secret" "none")) }}
{{- fail (printf "tls.mode must be certgen, certManager, secret or none (got %q)" .Values.tls.mode) }}
{{- end }}
{{- if and .Values.webhook.enabled (eq .Values.tls.mode "none") }}
{{- fail "webhook.enabled needs TLS: the API server calls admission webhooks over HTTPS only; set tls.mode or disable the webhook" }}
{{- end }}
{{- if not (has .Values.webhook.failurePolicy (list "Ignore" "Fail")) }}
{{- fail "webhook.failurePolicy must be Ignore or Fail" }}
{{- end }}
{{- if or (lt (int .Values.webhook.timeoutSeconds) 1) (gt (int .Values.webhook.timeoutSeconds) 30) }}
{{- fail "webhook.timeoutSeconds must be between 1 and 30" }}
{{- end }}
{{- if and .Values.scheduler.enabled (eq .Values.guard.mode "webhook") (not .Values.webhook.enabled) }}
{{- fail "guard.mode webhook is served by the webhook (webhook.enabled); use guard.mode policy (Kubernetes 1.30+) or none" }}
{{- end }}
{{- if and (eq .Values.guard.mode "policy") (semverCompare "<1.30.0-0" .Capabilities.KubeVersion.Version) }}
{{- fail (printf "guard.mode policy needs ValidatingAdmissionPolicy v1 (Kubernetes 1.30+); this cluster is %s: use guard.mode webhook" .Capabilities.KubeVersion.Version) }}
{{- end }}
{{- if not (has .Values.devicePlugin.backend (list "nvml" "fake")) }}
{{- fail "devicePlugin.backend must be nvml or fake" }}
{{- end }}
{{- if and (eq .Values.devicePlugin.backend "fake") (not .Values.devicePlugin.fakeGpus) }}
{{- fail "devicePlugin.backend fake needs devicePlugin.fakeGpus (the GPUs to pretend, see vgpu.gpu.fake)" }}
{{- end }}
{{- if and (gt (int .Values.scheduler.replicas) 1) (not .Values.scheduler.leaderElection.enabled) }}
{{- fail "scheduler.replicas > 1 needs scheduler.leaderElection.enabled: only the elected kube-scheduler may call its extender" }}
{{- end }}
{{- end }}
