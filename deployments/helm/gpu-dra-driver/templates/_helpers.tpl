{{/* Chart name, overridable. */}}
{{- define "gpu-dra-driver.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Prefix of every object name: the release name, plus the chart name unless the
release name already contains it. At most 40 characters, so that suffixes such as
"-kubelet-plugin" still fit in 63. */}}
{{- define "gpu-dra-driver.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "gpu-dra-driver.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "gpu-dra-driver.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels of one component: (dict "ctx" $ "component" "controller"). */}}
{{- define "gpu-dra-driver.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-dra-driver.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Names of the components' objects. */}}
{{- define "gpu-dra-driver.pluginName" -}}
{{ include "gpu-dra-driver.fullname" . }}-kubelet-plugin
{{- end }}
{{- define "gpu-dra-driver.mpsHostName" -}}
{{ include "gpu-dra-driver.fullname" . }}-mps-host
{{- end }}
{{- /* The MPS daemon host's socket: in the plugin's directory, which both pods mount. */}}
{{- define "gpu-dra-driver.mpsHostSocket" -}}
{{ trimSuffix "/" .Values.kubeletPlugin.kubeletPluginsDir }}/{{ .Values.driverName }}/mps-host.sock
{{- end }}
{{- define "gpu-dra-driver.controllerName" -}}
{{ include "gpu-dra-driver.fullname" . }}-controller
{{- end }}
{{- define "gpu-dra-driver.webhookServiceName" -}}
{{ include "gpu-dra-driver.fullname" . }}-webhook
{{- end }}

{{- define "gpu-dra-driver.pluginServiceAccount" -}}
{{- default (include "gpu-dra-driver.pluginName" .) .Values.kubeletPlugin.serviceAccount.name }}
{{- end }}
{{- define "gpu-dra-driver.controllerServiceAccount" -}}
{{- default (include "gpu-dra-driver.controllerName" .) .Values.controller.serviceAccount.name }}
{{- end }}

{{/* Secret holding the webhook's serving certificate. */}}
{{- define "gpu-dra-driver.webhookSecretName" -}}
{{- if .Values.webhook.certManager.enabled }}
{{- include "gpu-dra-driver.fullname" . }}-webhook-tls
{{- else }}
{{- required "webhook.tls.secretName is required when webhook.certManager.enabled is false" .Values.webhook.tls.secretName }}
{{- end }}
{{- end }}

{{/* image reference: (dict "image" .Values.x.image "ctx" $). */}}
{{- define "gpu-dra-driver.image" -}}
{{ .image.repository }}:{{ default .ctx.Chart.AppVersion .image.tag }}
{{- end }}

{{/* The Lease the controller replicas elect a leader with. */}}
{{- define "gpu-dra-driver.leaseName" -}}
{{ include "gpu-dra-driver.controllerName" . }}
{{- end }}

{{/* Checks of value combinations that the schema cannot express. */}}
{{- define "gpu-dra-driver.checks" -}}
{{- /* NVIDIA's chart values first: refused ones fail, the others are mapped (_nvidia.tpl). */ -}}
{{- include "gpu-dra-driver.nvidia.apply" . }}
{{- if and .Values.controller.enabled (gt (int .Values.controller.replicas) 1) (not .Values.controller.leaderElection.enabled) }}
{{- fail "controller.replicas > 1 needs controller.leaderElection.enabled: true (only one replica may run the claim diagnostics and slice GC)" }}
{{- end }}
{{- if and .Values.webhook.enabled (not .Values.controller.enabled) }}
{{- fail "webhook.enabled needs controller.enabled: the controller serves the webhook" }}
{{- end }}
{{- if and .Values.webhook.enabled (not .Values.webhook.certManager.enabled) (not .Values.webhook.tls.caBundle) }}
{{- fail "webhook.tls.caBundle is required when webhook.certManager.enabled is false" }}
{{- end }}
{{- if and .Values.kubeletPlugin.livenessProbe.enabled (eq (int .Values.kubeletPlugin.metrics.port) 0) }}
{{- fail "kubeletPlugin.livenessProbe.enabled needs kubeletPlugin.metrics.port > 0 (the probe uses /healthz there)" }}
{{- end }}
{{- if and .Values.kubeletPlugin.readinessProbe.enabled (eq (int .Values.kubeletPlugin.metrics.port) 0) }}
{{- fail "kubeletPlugin.readinessProbe.enabled needs kubeletPlugin.metrics.port > 0 (the probe uses /readyz there)" }}
{{- end }}
{{- end }}
