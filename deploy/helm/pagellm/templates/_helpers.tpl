{{/*
Names, labels and per-track values. A track is "stable" (always) or "canary" (canary.enabled):
each track has its own Deployment, Service, ConfigMap, PodDisruptionBudget, InferencePool and
endpoint picker, named <fullname> and <fullname>-canary.
*/}}

{{- define "pagellm.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release name when it contains the chart's name, else release-chart; at most 48 characters,
so that <fullname>-canary-epp is still a valid Service name. */}}
{{- define "pagellm.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 48 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 48 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* "stable" or "stable,canary". */}}
{{- define "pagellm.tracks" -}}
{{- if .Values.canary.enabled -}}stable,canary{{- else -}}stable{{- end -}}
{{- end -}}

{{/* A track's object name. Arguments: root, track. */}}
{{- define "pagellm.trackName" -}}
{{- $name := include "pagellm.fullname" .root -}}
{{- if eq .track "canary" -}}{{ $name }}-canary{{- else -}}{{ $name }}{{- end -}}
{{- end -}}

{{/* A track's values, stored in .out.v: the chart's values and, for the canary, its overrides
(image, config, replicaCount, resources, extraEnv); a canary image tag given without a digest
drops the stable image's digest. Arguments: root, track, out. */}}
{{- define "pagellm.trackValues" -}}
{{- $v := deepCopy .root.Values -}}
{{- if eq .track "canary" -}}
{{- $canary := .root.Values.canary -}}
{{- $v = mergeOverwrite $v (deepCopy (pick $canary "image" "config" "replicaCount" "resources" "extraEnv")) -}}
{{- if and $canary.image.tag (not $canary.image.digest) -}}
{{- $_ := set $v.image "digest" "" -}}
{{- end -}}
{{- end -}}
{{- $_ := set .out "v" $v -}}
{{- end -}}

{{/* Labels every object carries. */}}
{{- define "pagellm.commonLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/name: {{ include "pagellm.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Selector labels of a track's pods. Arguments: root, component (server, endpoint-picker), track. */}}
{{- define "pagellm.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pagellm.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
pagellm/track: {{ .track }}
{{- end -}}

{{/* Labels of a track's objects. Arguments: root, component, track. */}}
{{- define "pagellm.labels" -}}
{{ include "pagellm.commonLabels" .root }}
app.kubernetes.io/component: {{ .component }}
pagellm/track: {{ .track }}
{{- end -}}

{{/* repository:tag, or repository@digest when a digest is given. Argument: an image map. */}}
{{- define "pagellm.image" -}}
{{- if .digest -}}{{ .repository }}@{{ .digest }}{{- else -}}{{ .repository }}:{{ .tag }}{{- end -}}
{{- end -}}

{{/* The --config file of a track: its config with host and port set by the chart. Argument: a
track's values. */}}
{{- define "pagellm.configData" -}}
{{- $config := mergeOverwrite (deepCopy .config) (dict "host" "0.0.0.0" "port" .containerPort) -}}
{{- toYaml $config -}}
{{- end -}}

{{/* preStop sleep + drain-timeout + margin: the pod's grace period. Argument: a track's values. */}}
{{- define "pagellm.terminationGracePeriodSeconds" -}}
{{- $drain := index .config "drain-timeout" | default 30 -}}
{{- add .preStopSleepSeconds (ceil $drain) .terminationGraceMarginSeconds -}}
{{- end -}}

{{/* The InferencePool API group. */}}
{{- define "pagellm.poolGroup" -}}
{{- .Values.inferencePool.apiVersion | splitList "/" | first -}}
{{- end -}}
