{{- /*
NVIDIA's chart values (dra-driver-nvidia-gpu v0.5.0), so that a values file written for
NVIDIA's chart installs the equivalent driver here (docs/from-nvidia.md has the
table). Two parts:

- "gpu-dra-driver.nvidia.apply" runs the checks below, then copies what NVIDIA's names set onto this chart's values
  (kubeletPlugin.driverRoot from nvidiaDriverRoot, and so on). It changes .Values in place
  and gives the same result however often it runs, so every template that reads a value it
  sets includes it first: the order Helm renders templates in does not matter.
- "gpu-dra-driver.nvidia.checks" fails the install, naming the value, for every NVIDIA value
  this driver cannot honour (ComputeDomains, gates of features it does not have). Nothing is
  ignored silently: a value is either mapped, or documented as having no effect here (and
  why), or refused.

Unknown keys fail already in values.schema.json, which names them.
*/ -}}

{{- /* NVIDIA's feature gates: what each becomes here. "flag" gates add a plugin flag
when true; "value" gates set a value of this chart; "accepted" gates change nothing here
(the behaviour is always on, or belongs to the ComputeDomain driver, which this chart does
not install); "refused" gates fail when true. */ -}}
{{- define "gpu-dra-driver.nvidia.gates" -}}
TimeSlicingSettings: accepted
MPSSupport: accepted
DeviceMetadata: flag
IMEXDaemonsWithDNSNames: accepted
ComputeDomainCliques: accepted
CrashOnNVLinkFabricErrors: accepted
DynamicMIG: value
PassthroughSupport: flag
NVMLDeviceHealthCheck: flag
ConsumableShares: accepted
DRAListTypeAttributes: refused
FabricManagerPartitioning: refused
HostManagedIMEXDaemon: refused
{{- end }}

{{- /* The plugin flag of each "flag" gate set to true or to false (nothing when the gate is
not set: the plugin's default then applies). The health monitor is on by default here (off in
NVIDIA's driver): a values file that sets NVMLDeviceHealthCheck: false turns it off. */ -}}
{{- define "gpu-dra-driver.nvidia.gateFlags" -}}
PassthroughSupport: {"true": "--passthrough"}
DeviceMetadata: {"true": "--device-metadata=true", "false": "--device-metadata=false"}
NVMLDeviceHealthCheck: {"true": "--health=on", "false": "--health=off"}
{{- end }}

{{- /* Why a refused gate is refused. */ -}}
{{- define "gpu-dra-driver.nvidia.refusedGates" -}}
DRAListTypeAttributes: "resource.kubernetes.io/numaNode is published as an int, not as a list of ints"
FabricManagerPartitioning: "the Fabric Manager partition attributes (gpuModuleID, partition1..8) and their activation at prepare are not implemented"
HostManagedIMEXDaemon: "ComputeDomains are not supported by this driver"
{{- end }}

{{- /* Whether NVIDIA's gate `name` is set to true. */ -}}
{{- define "gpu-dra-driver.nvidia.gate" -}}
{{- $gates := .ctx.Values.featureGates | default dict }}
{{- if eq (toString (index $gates .name | default false)) "true" }}true{{ end }}
{{- end }}

{{- define "gpu-dra-driver.nvidia.apply" -}}
{{- include "gpu-dra-driver.nvidia.checks" . }}
{{- $v := .Values }}
{{- $p := $v.kubeletPlugin }}
{{- with $v.nvidiaDriverRoot }}
{{- $_ := set $p "driverRoot" . }}
{{- end }}
{{- with $v.nvidiaCDIHookPath }}
{{- $_ := set $p "nvidiaCdiHookPath" . }}
{{- end }}
{{- with $p.kubeletRegistrarDirectoryPath }}
{{- $_ := set $p "kubeletRegistrarDir" . }}
{{- end }}
{{- with $p.kubeletPluginsDirectoryPath }}
{{- $_ := set $p "kubeletPluginsDir" . }}
{{- end }}
{{- if include "gpu-dra-driver.nvidia.gate" (dict "ctx" . "name" "DynamicMIG") }}
{{- $_ := set $p "dynamicMig" true }}
{{- end }}
{{- /* klog's -v levels: NVIDIA's default 4 shows what our info does. */ -}}
{{- if ne (toString ($v.logVerbosity | default "")) "" }}
{{- $level := int (toString $v.logVerbosity) }}
{{- $_ := set $v "logLevel" (ternary "trace" (ternary "debug" "info" (ge $level 5)) (ge $level 7)) }}
{{- end }}
{{- /* kubeletPlugin.metrics.gpuHttpEndpoint: "[host]:port". */ -}}
{{- with $p.metrics.gpuHttpEndpoint }}
{{- $port := regexFind "[0-9]+$" . }}
{{- $host := trimSuffix (printf ":%s" $port) . | trimPrefix "[" | trimSuffix "]" }}
{{- $_ := set $p.metrics "port" (int $port) }}
{{- if $host }}
{{- $_ := set $p.metrics "bindAddress" $host }}
{{- end }}
{{- end }}
{{- end }}

{{- /* The extendedResourceName of the gpu.nvidia.com DeviceClass, or "". NVIDIA's chart
sets nvidia.com/gpu on that class whenever it installs the GPU part, which it does only with
gpuResourcesEnabledOverride=true: a values file with that override gets the same class. */ -}}
{{- define "gpu-dra-driver.gpuExtendedResourceName" -}}
{{- if .Values.deviceClasses.gpuExtendedResourceName }}
{{- .Values.deviceClasses.gpuExtendedResourceName }}
{{- else if .Values.gpuResourcesEnabledOverride }}
{{- "nvidia.com/gpu" }}
{{- end }}
{{- end }}

{{- /* Plugin flags from NVIDIA's values, one per line ("- --flag"). */ -}}
{{- define "gpu-dra-driver.nvidia.pluginArgs" -}}
{{- $flags := include "gpu-dra-driver.nvidia.gateFlags" . | fromYaml }}
{{- $gates := .Values.featureGates | default dict }}
{{- range $gate := keys $flags | sortAlpha }}
{{- if hasKey $gates $gate }}
{{- with index (index $flags $gate) (toString (index $gates $gate)) }}
- {{ . }}
{{- end }}
{{- end }}
{{- end }}
{{- $shares := toString (.Values.consumableShares | default "") }}
{{- if and $shares (ne $shares "disabled") }}
- --consumable-shares={{ $shares }}
{{- end }}
{{- $cd := dig "containers" "computeDomains" "gpuCliqueLabelEnabled" false .Values.kubeletPlugin }}
{{- if or .Values.gpuCliqueLabelEnabled $cd }}
- --gpu-clique-label
{{- end }}
{{- end }}

{{- define "gpu-dra-driver.nvidia.checks" -}}
{{- $v := .Values }}
{{- $res := $v.resources | default dict }}
{{- $gpus := $res.gpus | default dict }}
{{- if eq (toString (dig "enabled" true $gpus)) "false" }}
{{- fail "resources.gpus.enabled: false (NVIDIA's chart) installs no GPU driver, and ComputeDomains, the rest of NVIDIA's chart, are not supported here; to install only parts of this chart use kubeletPlugin.enabled, controller.enabled and deviceClasses.enabled" }}
{{- end }}
{{- $cds := $res.computeDomains | default dict }}
{{- if eq (toString (dig "enabled" false $cds)) "true" }}
{{- fail "resources.computeDomains.enabled: true is not supported: this driver has no ComputeDomains (multi-node NVLink, driver compute-domain.nvidia.com); set it to false, or keep NVIDIA's driver for ComputeDomains next to this one under another driverName" }}
{{- end }}
{{- $imex := $cds.imex | default dict }}
{{- range $key, $default := dict "mode" "driverManaged" "isolation" "domain" "hostSocketPath" "/etc/nvidia-imex/imex_ctrl.sock" }}
{{- if and (hasKey $imex $key) (ne (toString (index $imex $key)) $default) }}
{{- fail (printf "resources.computeDomains.imex.%s: %v is not supported: this driver has no ComputeDomains (only NVIDIA's default %q is accepted, which has no effect here)" $key (index $imex $key) $default) }}
{{- end }}
{{- end }}
{{- $known := include "gpu-dra-driver.nvidia.gates" . | fromYaml }}
{{- $refused := include "gpu-dra-driver.nvidia.refusedGates" . | fromYaml }}
{{- range $gate, $value := $v.featureGates | default dict }}
{{- if not (hasKey $known $gate) }}
{{- fail (printf "featureGates.%s: not a feature gate of NVIDIA's driver (known: %s)" $gate (keys $known | sortAlpha | join ", ")) }}
{{- end }}
{{- if not (has (toString $value) (list "true" "false")) }}
{{- fail (printf "featureGates.%s: %v is not a boolean" $gate $value) }}
{{- end }}
{{- if and (eq (index $known $gate) "refused") (eq (toString $value) "true") }}
{{- fail (printf "featureGates.%s: true is not supported: %s" $gate (index $refused $gate)) }}
{{- end }}
{{- end }}
{{- $shares := toString ($v.consumableShares | default "") }}
{{- if and $shares (ne $shares "disabled") (not (include "gpu-dra-driver.nvidia.gate" (dict "ctx" . "name" "ConsumableShares"))) }}
{{- fail (printf "consumableShares: %q needs featureGates.ConsumableShares: true (as in NVIDIA's driver)" $shares) }}
{{- end }}
{{- if and $shares (ne $shares "disabled") $v.kubeletPlugin.memorySharing }}
{{- fail (printf "consumableShares: %q and kubeletPlugin.memorySharing: %q cannot both be set (the plugin's --consumable-shares and --memory-sharing exclude each other)" $shares $v.kubeletPlugin.memorySharing) }}
{{- end }}
{{- with $v.resourceApiVersion }}
{{- if ne . "resource.k8s.io/v1" }}
{{- fail (printf "resourceApiVersion: %s is not supported: this driver uses resource.k8s.io/v1 (Kubernetes 1.34 or newer); leave it empty or set resource.k8s.io/v1" .) }}
{{- end }}
{{- end }}
{{- $m := $v.kubeletPlugin.metrics }}
{{- if eq (toString (dig "enabled" true $m)) "false" }}
{{- fail "kubeletPlugin.metrics.enabled: false is not supported: the metrics endpoint also serves the plugin's liveness and readiness probes; to turn it off set kubeletPlugin.metrics.port: 0 with kubeletPlugin.livenessProbe.enabled and readinessProbe.enabled false" }}
{{- end }}
{{- with $m.metricsPath }}
{{- if ne . "/metrics" }}
{{- fail (printf "kubeletPlugin.metrics.metricsPath: %s is not supported: the plugin serves metrics at /metrics" .) }}
{{- end }}
{{- end }}
{{- with $m.gpuHttpEndpoint }}
{{- if not (regexMatch "^(\\[[0-9A-Fa-f:.]+\\]|[0-9.]*):[0-9]{1,5}$" .) }}
{{- fail (printf "kubeletPlugin.metrics.gpuHttpEndpoint: %q is not [address]:port (e.g. \":8080\")" .) }}
{{- end }}
{{- if gt (int (regexFind "[0-9]+$" .)) 65535 }}
{{- fail (printf "kubeletPlugin.metrics.gpuHttpEndpoint: %q: the port is over 65535" .) }}
{{- end }}
{{- end }}
{{- end }}
