{{/*
The DRA mode's DeviceClass selector (CEL), for every model or for .model; the same expression as
libs/vgpu/core/dra/deviceclass.py's selector_expression. Strings are CEL literals written as JSON.
*/}}
{{- define "kube-vgpu.dra.selector" -}}
{{- $driver := "gpu.kube-vgpu.io" | toJson }}
{{- $attrs := printf "device.attributes[%s]" $driver }}
{{- $expr := printf "device.driver == %s && %s.migEnabled == false" $driver $attrs }}
{{- if hasKey . "model" }}
{{- $expr = printf "%s && %s.model == %s" $expr $attrs (.model | toJson) }}
{{- end }}
{{- $expr }}
{{- end }}
