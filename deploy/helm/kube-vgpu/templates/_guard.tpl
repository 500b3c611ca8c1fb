{{/*
The update guard (docs/webhook.md, "The update guard"; vgpu.core.guard): which keys only the
services may change after creation, who they are, and the same rules as CEL for the webhook's
matchConditions and for the ValidatingAdmissionPolicy. Keep these in step with
libs/vgpu/core/guard.py (tests/deploy/test_guard_chart.py evaluates this CEL against its table).
*/}}

{{- define "kube-vgpu.annotationPrefix" -}}
{{- $cfg := default dict .Values.config }}
{{- default "hami.io" $cfg.annotationPrefix }}
{{- end }}

{{/* Owned pod annotations, pod labels and node annotations, as JSON lists. */}}
{{- define "kube-vgpu.guard.podAnnotations" -}}
{{- $p := include "kube-vgpu.annotationPrefix" . }}
{{- list (printf "%s/vgpu-node" $p) (printf "%s/vgpu-time" $p) (printf "%s/vgpu-devices-to-allocate" $p) (printf "%s/vgpu-devices-allocated" $p) (printf "%s/bind-phase" $p) (printf "%s/bind-time" $p) | toJson }}
{{- end }}

{{- define "kube-vgpu.guard.podLabels" -}}
{{- list (printf "%s/vgpu-node" (include "kube-vgpu.annotationPrefix" .)) | toJson }}
{{- end }}

{{- define "kube-vgpu.guard.nodeAnnotations" -}}
{{- $p := include "kube-vgpu.annotationPrefix" . }}
{{- list (printf "%s/node-nvidia-register" $p) (printf "%s/node-nvidia-plugin-error" $p) (printf "%s/node-nvidia-outside-usage" $p) (printf "%s/mutex.lock" $p) | toJson }}
{{- end }}

{{/* Trusted usernames: the scheduler's service account, then guard.extraUsers. */}}
{{- define "kube-vgpu.guard.users" -}}
{{- $ns := .Release.Namespace }}
{{- $sa := list (printf "system:serviceaccount:%s:%s" $ns (include "kube-vgpu.scheduler.fullname" .)) }}
{{- concat $sa .Values.guard.extraUsers | uniq | toJson }}
{{- end }}

{{/* Trusted on their own node only, where the token names it (1.30+): the device plugin's service account. */}}
{{- define "kube-vgpu.guard.nodeBoundUsers" -}}
{{- list (printf "system:serviceaccount:%s:%s" .Release.Namespace (include "kube-vgpu.devicePlugin.fullname" .)) | toJson }}
{{- end }}

{{- define "kube-vgpu.guard.groups" -}}
{{- .Values.guard.extraGroups | uniq | toJson }}
{{- end }}

{{/* CEL list literal of strings: ['a', 'b']. */}}
{{- define "kube-vgpu.guard.celList" -}}
[{{- range $i, $s := . }}{{ if $i }}, {{ end }}'{{ $s }}'{{ end }}]
{{- end }}

{{/* CEL: the requester is trusted for this object. A node-bound user (the device plugin) whose
token names its node (userInfo.extra authentication.kubernetes.io/node-name, 1.30+) only for pods
bound to that node and that Node; without the extra, everywhere (vgpu.core.guard). Call with
(dict "root" $ "kind" "pods"|"nodes"). */}}
{{- define "kube-vgpu.guard.celTrusted" -}}
{{- $key := "'authentication.kubernetes.io/node-name'" }}
{{- $named := printf "(has(request.userInfo.extra) && %s in request.userInfo.extra)" $key }}
{{- $onNode := printf "(has(oldObject.metadata.name) && oldObject.metadata.name in request.userInfo.extra[%s])" $key }}
{{- if eq .kind "pods" }}
{{- $onNode = printf "(has(oldObject.spec) && has(oldObject.spec.nodeName) && oldObject.spec.nodeName in request.userInfo.extra[%s])" $key }}
{{- end }}
{{- $bound := include "kube-vgpu.guard.celList" (include "kube-vgpu.guard.nodeBoundUsers" .root | fromJsonArray) }}
{{- $users := include "kube-vgpu.guard.celList" (include "kube-vgpu.guard.users" .root | fromJsonArray) }}
{{- $groups := include "kube-vgpu.guard.celList" (include "kube-vgpu.guard.groups" .root | fromJsonArray) }}
{{- printf "(request.userInfo.username in %s ? (!%s || %s) : (request.userInfo.username in %s || (has(request.userInfo.groups) && request.userInfo.groups.exists(g, g in %s))))" $bound $named $onNode $users $groups }}
{{- end }}

{{/* CEL: metadata.<field>[<key>] was added, removed or changed. Call with (dict "field" "annotations" "key" "hami.io/x"). */}}
{{- define "kube-vgpu.guard.celChanged" -}}
{{- $new := printf "(has(object.metadata.%s) && '%s' in object.metadata.%s)" .field .key .field }}
{{- $old := printf "(has(oldObject.metadata.%s) && '%s' in oldObject.metadata.%s)" .field .key .field }}
{{- printf "%s != %s || (%s && object.metadata.%s['%s'] != oldObject.metadata.%s['%s'])" $new $old $new .field .key .field .key }}
{{- end }}

{{/* CEL: any owned key of a kind changed. Call with (dict "annotations" <list> "labels" <list>). */}}
{{- define "kube-vgpu.guard.celAnyChanged" -}}
{{- $terms := list }}
{{- range .annotations }}{{ $terms = append $terms (printf "(%s)" (include "kube-vgpu.guard.celChanged" (dict "field" "annotations" "key" .))) }}{{ end }}
{{- range .labels }}{{ $terms = append $terms (printf "(%s)" (include "kube-vgpu.guard.celChanged" (dict "field" "labels" "key" .))) }}{{ end }}
{{- join " || " $terms }}
{{- end }}

{{/* Who may change them, for messages (sorted, as vgpu.core.guard.Trusted.describe writes it). */}}
{{- define "kube-vgpu.guard.allowed" -}}
{{- $users := include "kube-vgpu.guard.users" . | fromJsonArray | sortAlpha }}
{{- $bound := include "kube-vgpu.guard.nodeBoundUsers" . | fromJsonArray | sortAlpha }}
{{- $groups := include "kube-vgpu.guard.groups" . | fromJsonArray | sortAlpha }}
{{- printf "users %s; on their own node %s" (join ", " $users) (join ", " $bound) }}{{ if $groups }}{{ printf "; groups %s" (join ", " $groups) }}{{ end }}
{{- end }}

{{- define "kube-vgpu.guardWebhook" -}}
{{- if and .Values.scheduler.enabled .Values.webhook.enabled (eq .Values.guard.mode "webhook") }}true{{ end }}
{{- end }}

{{- define "kube-vgpu.guardPolicy" -}}
{{- if eq .Values.guard.mode "policy" }}true{{ end }}
{{- end }}
