{{/*
The extender device plugin's affinity: devicePlugin.affinity, and with dra.enabled a required node
affinity that keeps it off the DRA nodes (those carrying every label of
dra.kubeletPlugin.nodeSelector). Not all of k=v is any k NotIn [v]: each of the user's node selector
terms (or one empty term) is repeated once per label with that label's NotIn added, and the
terms are ORed. Empty when there is nothing to say.
*/}}
{{- define "kube-vgpu.devicePlugin.affinity" -}}
{{- $aff := deepCopy (default dict .Values.devicePlugin.affinity) }}
{{- $dra := default dict .Values.dra }}
{{- if $dra.enabled }}
{{- $avoid := list }}
{{- range $key, $value := (default dict (default dict $dra.kubeletPlugin).nodeSelector) }}
{{- $avoid = append $avoid (dict "key" $key "operator" "NotIn" "values" (list $value)) }}
{{- end }}
{{- if $avoid }}
{{- $na := default dict $aff.nodeAffinity }}
{{- $req := default dict (get $na "requiredDuringSchedulingIgnoredDuringExecution") }}
{{- $terms := default (list dict) $req.nodeSelectorTerms }}
{{- $out := list }}
{{- range $term := $terms }}
{{- range $expr := $avoid }}
{{- $exprs := append (default (list) $term.matchExpressions) $expr }}
{{- $out = append $out (merge (dict "matchExpressions" $exprs) (omit $term "matchExpressions")) }}
{{- end }}
{{- end }}
{{- $_ := set $req "nodeSelectorTerms" $out }}
{{- $_ := set $na "requiredDuringSchedulingIgnoredDuringExecution" $req }}
{{- $_ := set $aff "nodeAffinity" $na }}
{{- end }}
{{- end }}
{{- if $aff }}{{ toYaml $aff }}{{ end }}
{{- end }}

{{/* The DRA driver's registration socket in kubelet's plugins_registry (vgpu.core.dra.names). */}}
{{- define "kube-vgpu.dra.registrationSocket" -}}
{{- printf "%s/gpu.kube-vgpu.io-reg.sock" (.Values.dra.kubeletPlugin.registryPath | trimSuffix "/") }}
{{- end }}
