#!/usr/bin/env python3
"""Lints and renders the Helm chart offline and checks every rendered object.

Run through hack/validate-chart.sh (which checks the Python packages first).

For each values variant below:
  1. `helm lint --strict` (Helm's Go library through the PyPI package
     helm-python-sdk), against Kubernetes 1.37; warnings fail.
  2. `helm template` (same library, offline), then every object is validated
     against the Kubernetes 1.37 OpenAPI schema, strictly, with
     kubernetes-validate. cert-manager objects (no schema there) are checked
     against the subset of cert-manager.io/v1 the chart writes (below).
  3. Cross-object checks: names that must agree (Service -> pods, webhook ->
     Service and certificate, RBAC and the admission policy -> the pods'
     ServiceAccounts), the plugin's --mps-dir, its mount and its hostPath
     volume naming one path (or none of them with mpsDir empty), the webhook
     agreeing with deployments/webhook/, the DeviceClasses being exactly the
     repository's deviceclasses/ files.
Then values that must be refused are rendered, and each must fail with its
message.

With GPU_KUBELET_PLUGIN_BIN / GPU_DRA_CONTROLLER_BIN set to built binaries,
every flag the chart passes is also checked against the binary's --help.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deployments/helm/gpu-dra-driver"
STATIC_WEBHOOK = ROOT / "deployments/webhook"
DEVICECLASSES = ROOT / "deviceclasses"
K8S_VERSION = os.environ.get("K8S_VERSION", "1.37.0")
RELEASE = "gpu-dra-driver"
NAMESPACE = "gpu-dra-driver"
# base64 of a PEM stub: the chart only passes it through.
CA_BUNDLE = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCi0tLS0tRU5EIENFUlRJRklDQVRFLS0tLS0K"

def merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


VARIANTS: dict[str, dict] = {
    "defaults": {},
    "cert-manager-off": {
        "webhook": {
            "certManager": {"enabled": False},
            "tls": {"secretName": "my-webhook-tls", "caBundle": CA_BUNDLE},
        }
    },
    "cert-manager-cluster-issuer": {
        "webhook": {"certManager": {"issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}}
    },
    "other-driver-single-replica": {
        "driverName": "gpu.example.com",
        "fullnameOverride": "gpu-example",
        "logFormat": "json",
        "controller": {"replicas": 1, "leaderElection": {"enabled": False}, "sliceGC": {"enabled": False}},
        "webhook": {"failurePolicy": "Fail", "timeoutSeconds": 10},
        "kubeletPlugin": {
            "dynamicMig": True,
            "memorySharing": "all",
            "deleteSlicesOnExit": True,
            "sliceRules": "1.35",
            "metrics": {"bindAddress": "::", "port": 9400},
            "nvmlLib": "",
            "nvidiaCdiHookPath": "/usr/local/nvidia/toolkit/nvidia-cdi-hook",
            "mpsDir": "/var/run/gpu-example/mps",
            "perInstanceSockets": "never",
            "extraArgs": ["--sysfs-root=/sys"],
            "extraEnv": [{"name": "EXTRA", "value": "1"}],
        },
        "deviceClasses": {"only": ["gpu.nvidia.com", "mig.nvidia.com"], "keepOnUninstall": True},
    },
    "no-webhook-no-policy": {
        "webhook": {"enabled": False},
        "resourceSlicePolicy": {"enabled": False},
        "kubeletPlugin": {
            "metrics": {"port": 0},
            "livenessProbe": {"enabled": False},
            "readinessProbe": {"enabled": False},
        },
    },
    # VFIO passthrough on a stand-in sysfs (what hack/cluster's VFIO test sets).
    "passthrough-stand-in-sysfs": {
        "kubeletPlugin": {"passthrough": True, "sysfsRoot": "/var/lib/gpu-dra-cluster-node/sys"}
    },
    # The MPS daemons' directories under the plugin's state dir (no --mps-dir).
    "mps-dir-empty": {"kubeletPlugin": {"mpsDir": ""}},
    # The plugin starts the MPS daemons itself: no host, no hostPID.
    "mps-host-off": {"kubeletPlugin": {"mpsHost": {"enabled": False}}},
    "plugin-only": {
        "controller": {"enabled": False},
        "webhook": {"enabled": False},
        "deviceClasses": {"enabled": False},
    },
    # What e2e/kind/run.sh installs: its values file plus what the script sets.
    "e2e-kind": merge(
        yaml.safe_load((ROOT / "e2e/kind/values.yaml").read_text()),
        {
            "webhook": {"tls": {"caBundle": CA_BUNDLE}},
            "kubeletPlugin": {"extraEnv": [
                {"name": "MOCK_NVML_PROFILE", "value": "/opt/mock-nvml/profiles/dgx-h100.yaml"},
                {"name": "MOCK_NVML_PROC_ROOT", "value": "/host-proc"},
            ]},
        },
    ),
}

# Values that must be refused, with a piece of the expected message.
REFUSED: list[tuple[dict, str]] = [
    ({"kubeletPlugin": {"nvmlLibrary": "/x"}}, "nvmlLibrary"),
    ({"driverName": "GPU_nvidia"}, "driverName"),
    ({"controller": {"replicas": 2, "leaderElection": {"enabled": False}}}, "leaderElection"),
    ({"webhook": {"certManager": {"enabled": False}, "tls": {"caBundle": CA_BUNDLE}}}, "webhook.tls.secretName"),
    ({"webhook": {"certManager": {"enabled": False}, "tls": {"secretName": "s"}}}, "caBundle"),
    ({"controller": {"enabled": False}}, "webhook.enabled needs controller.enabled"),
    ({"deviceClasses": {"only": ["no-such-class"]}}, "no-such-class"),
    ({"kubeletPlugin": {"metrics": {"port": 0}}}, "livenessProbe"),
    ({"kubeletPlugin": {"metrics": {"port": 0}, "livenessProbe": {"enabled": False}}}, "readinessProbe"),
    ({"kubeletPlugin": {"sliceRules": "1.33"}}, "sliceRules"),
    ({"kubeletPlugin": {"mpsDir": "run/x"}}, "mpsDir"),
    ({"kubeletPlugin": {"mpsDir": "/dev/shm/mps"}}, "mpsDir"),
    ({"kubeletPlugin": {"mpsDir": "//dev/./shm"}}, "mpsDir"),
    ({"kubeletPlugin": {"mpsDir": "/run/../x"}}, "mpsDir"),
    ({"kubeletPlugin": {"nvidiaCdiHookPath": "nvidia-cdi-hook"}}, "nvidiaCdiHookPath"),
    ({"kubeletPlugin": {"nvidiaCdiHookPath": "/usr/bin/"}}, "nvidiaCdiHookPath"),
    ({"controller": {"pendingGracePeriod": "30"}}, "pendingGracePeriod"),
    ({"kubeletPlugin": {"perInstanceSockets": "yes"}}, "perInstanceSockets"),
    ({"kubeletPlugin": {"mpsHost": {"enabled": "yes"}}}, "mpsHost"),
    ({"kubeletPlugin": {"sysfsRoot": "sys"}}, "sysfsRoot"),
    ({"kubeletPlugin": {"sysfsRoot": "/var/sys/"}}, "sysfsRoot"),
    ({"kubeletPlugin": {"sysfsRoot": "/var/../sys"}}, "sysfsRoot"),
    ({"kubeletPlugin": {"mpsHost": {"socket": "/run/h.sock"}}}, "mpsHost"),
]

# Values files written for NVIDIA's chart (dra-driver-nvidia-gpu v0.5.0; keys and defaults
# from its values.yaml and install docs) and the values of this chart they stand for: both
# must render exactly the same objects. Each pair is checked like a variant too.
NVIDIA_DEFAULTS_COPY = {
    # A copy of NVIDIA's values.yaml defaults, ComputeDomains turned off (they are not
    # supported here) and the GPU part acknowledged as its chart demands.
    "nvidiaDriverRoot": "/",
    "nvidiaCDIHookPath": "",
    "gpuResourcesEnabledOverride": True,
    "consumableShares": "",
    "allowDefaultNamespace": False,
    "resourceApiVersion": "",
    "resources": {
        "gpus": {"enabled": True},
        "computeDomains": {
            "enabled": False,
            "imex": {"mode": "driverManaged", "isolation": "domain", "hostSocketPath": "/etc/nvidia-imex/imex_ctrl.sock"},
        },
    },
    "featureGates": {},
    "logVerbosity": "4",
    "webhook": {"enabled": False},
    "kubeletPlugin": {
        "metrics": {"enabled": True, "gpuHttpEndpoint": ":8080", "computeDomainHttpEndpoint": ":8081", "metricsPath": "/metrics"},
        "priorityClassName": "system-node-critical",
        "kubeletRegistrarDirectoryPath": "/var/lib/kubelet/plugins_registry",
        "kubeletPluginsDirectoryPath": "/var/lib/kubelet/plugins",
        "containers": {
            "computeDomains": {"gpuCliqueLabelEnabled": False},
            "gpus": {"env": [], "securityContext": {"privileged": True}, "resources": {}, "healthcheckPort": 51516},
        },
    },
}
NVIDIA_EQUIVALENTS: list[tuple[str, dict, dict]] = [
    # NVIDIA's install docs: GPU part on a host-installed driver.
    ("nvidia-docs-gpus", {"gpuResourcesEnabledOverride": True, "resources": {"computeDomains": {"enabled": False}}},
     {"deviceClasses": {"gpuExtendedResourceName": "nvidia.com/gpu"}}),
    # Under the GPU operator: its driver root and hook.
    ("nvidia-docs-gpu-operator", {
        "nvidiaDriverRoot": "/run/nvidia/driver",
        "nvidiaCDIHookPath": "/usr/local/nvidia/toolkit/nvidia-cdi-hook",
        "gpuResourcesEnabledOverride": True,
        "resources": {"gpus": {"enabled": True}, "computeDomains": {"enabled": False}},
    }, {
        "kubeletPlugin": {"driverRoot": "/run/nvidia/driver", "nvidiaCdiHookPath": "/usr/local/nvidia/toolkit/nvidia-cdi-hook"},
        "deviceClasses": {"gpuExtendedResourceName": "nvidia.com/gpu"},
    }),
    ("nvidia-values-defaults-copy", NVIDIA_DEFAULTS_COPY,
     {"webhook": {"enabled": False}, "deviceClasses": {"gpuExtendedResourceName": "nvidia.com/gpu"}}),
    # Every gate that maps onto something, consumable shares, the clique label, paths, the
    # metrics endpoint, the container's env and resources, verbosity.
    ("nvidia-gates-and-settings", merge(NVIDIA_DEFAULTS_COPY, {
        "featureGates": {"TimeSlicingSettings": True, "MPSSupport": True, "DynamicMIG": True,
                         "PassthroughSupport": True, "NVMLDeviceHealthCheck": True, "DeviceMetadata": True,
                         "ConsumableShares": True, "IMEXDaemonsWithDNSNames": True, "ComputeDomainCliques": True,
                         "CrashOnNVLinkFabricErrors": False, "DRAListTypeAttributes": False},
        "consumableShares": "memory",
        "logVerbosity": "6",
        "gpuCliqueLabelEnabled": True,
        "resourceApiVersion": "resource.k8s.io/v1",
        "webhook": {"enabled": True, "failurePolicy": "Fail"},
        "kubeletPlugin": {
            "kubeletRegistrarDirectoryPath": "/var/lib/k0s/kubelet/plugins_registry",
            "kubeletPluginsDirectoryPath": "/var/lib/k0s/kubelet/plugins",
            "metrics": {"gpuHttpEndpoint": "0.0.0.0:9400"},
            "containers": {"gpus": {"env": [{"name": "EXTRA", "value": "1"}], "resources": {"limits": {"memory": "1Gi"}}}},
        },
    }), {
        "logLevel": "debug",
        "webhook": {"failurePolicy": "Fail"},
        "deviceClasses": {"gpuExtendedResourceName": "nvidia.com/gpu"},
        "kubeletPlugin": {
            "dynamicMig": True,
            "kubeletRegistrarDir": "/var/lib/k0s/kubelet/plugins_registry",
            "kubeletPluginsDir": "/var/lib/k0s/kubelet/plugins",
            "metrics": {"port": 9400, "bindAddress": "0.0.0.0"},
            "extraArgs": ["--device-metadata=true", "--health=on", "--passthrough", "--consumable-shares=memory",
                          "--gpu-clique-label"],
            "extraEnv": [{"name": "EXTRA", "value": "1"}],
            # NVIDIA's container resources replace this chart's (null deletes a default).
            "resources": {"limits": {"memory": "1Gi"}, "requests": None},
        },
    }),
    # The clique label under NVIDIA's older key, trace verbosity, an IPv6 endpoint, the
    # health monitor (on by default here) turned off as NVIDIA's gate says.
    ("nvidia-clique-label-v6-endpoint", {
        "logVerbosity": 7,
        "featureGates": {"NVMLDeviceHealthCheck": False, "PassthroughSupport": False, "DeviceMetadata": False},
        "kubeletPlugin": {"containers": {"computeDomains": {"gpuCliqueLabelEnabled": True}},
                          "metrics": {"gpuHttpEndpoint": "[::]:8080"}},
    }, {
        "logLevel": "trace",
        "kubeletPlugin": {"extraArgs": ["--device-metadata=false", "--health=off", "--gpu-clique-label"],
                          "metrics": {"bindAddress": "::"}},
    }),
    # This chart's own extended-resource value.
    ("extended-resource", {"deviceClasses": {"gpuExtendedResourceName": "nvidia.com/gpu"}},
     {"deviceClasses": {"gpuExtendedResourceName": "nvidia.com/gpu"}}),
]

# NVIDIA values that must be refused, each naming the value.
REFUSED += [
    ({"resources": {"computeDomains": {"enabled": True}}}, "resources.computeDomains.enabled"),
    ({"resources": {"computeDomains": {"imex": {"mode": "hostManaged"}}}}, "resources.computeDomains.imex.mode"),
    ({"resources": {"computeDomains": {"imex": {"isolation": "channel"}}}}, "resources.computeDomains.imex.isolation"),
    ({"resources": {"gpus": {"enabled": False}}}, "resources.gpus.enabled"),
    ({"featureGates": {"FabricManagerPartitioning": True}}, "featureGates.FabricManagerPartitioning"),
    ({"featureGates": {"DRAListTypeAttributes": True}}, "featureGates.DRAListTypeAttributes"),
    ({"featureGates": {"HostManagedIMEXDaemon": True}}, "featureGates.HostManagedIMEXDaemon"),
    ({"featureGates": {"NoSuchGate": True}}, "featureGates.NoSuchGate"),
    ({"featureGates": {"DynamicMIG": "yes"}}, "featureGates.DynamicMIG"),
    ({"consumableShares": "memory"}, "featureGates.ConsumableShares"),
    ({"consumableShares": "0", "featureGates": {"ConsumableShares": True}}, "consumableShares"),
    ({"consumableShares": "half"}, "consumableShares"),
    ({"consumableShares": "memory", "featureGates": {"ConsumableShares": True},
      "kubeletPlugin": {"memorySharing": "all"}}, "kubeletPlugin.memorySharing"),
    ({"resourceApiVersion": "resource.k8s.io/v1beta1"}, "resourceApiVersion"),
    ({"logVerbosity": "loud"}, "logVerbosity"),
    ({"kubeletPlugin": {"metrics": {"enabled": False}}}, "kubeletPlugin.metrics.enabled"),
    ({"kubeletPlugin": {"metrics": {"metricsPath": "/m"}}}, "kubeletPlugin.metrics.metricsPath"),
    ({"kubeletPlugin": {"metrics": {"gpuHttpEndpoint": "8080"}}}, "kubeletPlugin.metrics.gpuHttpEndpoint"),
    ({"kubeletPlugin": {"metrics": {"gpuHttpEndpoint": ":99999"}}}, "kubeletPlugin.metrics.gpuHttpEndpoint"),
    ({"kubeletPlugin": {"kubeletPluginsDirectoryPath": "var/lib/kubelet/plugins"}}, "kubeletPluginsDirectoryPath"),
    ({"nvidiaDriverRoot": "run/nvidia/driver"}, "nvidiaDriverRoot"),
    # NVIDIA keys with no equivalent here are named by the schema.
    ({"image": {"repository": "registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu"}}, "'image'"),
    ({"maskNvidiaDriverParams": True}, "maskNvidiaDriverParams"),
    ({"webhook": {"tls": {"mode": "secret"}}}, "'mode'"),
    ({"controller": {"leaderElection": {"leaseDuration": "15s"}}}, "leaseDuration"),
    ({"deviceClasses": {"gpuExtendedResourceName": "gpu"}}, "gpuExtendedResourceName"),
]

# The part of cert-manager.io/v1 the chart writes; unknown fields are errors.
_META = {
    "type": "object",
    "required": ["name", "namespace"],
    "properties": {"name": {"type": "string"}, "namespace": {"type": "string"}},
}
_USAGES = [
    "signing", "digital signature", "content commitment", "key encipherment", "key agreement",
    "data encipherment", "cert sign", "crl sign", "encipher only", "decipher only", "any",
    "server auth", "client auth", "code signing", "email protection", "s/mime",
    "ipsec end system", "ipsec tunnel", "ipsec user", "timestamping", "ocsp signing",
    "microsoft sgc", "netscape sgc",
]
CERT_MANAGER_SCHEMAS = {
    "Issuer": {
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "cert-manager.io/v1"},
            "kind": {"const": "Issuer"},
            "metadata": _META,
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "minProperties": 1,
                "maxProperties": 1,
                "properties": {
                    "selfSigned": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {"crlDistributionPoints": {"type": "array", "items": {"type": "string"}}},
                    },
                    "ca": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["secretName"],
                        "properties": {"secretName": {"type": "string"}},
                    },
                },
            },
        },
    },
    "Certificate": {
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "cert-manager.io/v1"},
            "kind": {"const": "Certificate"},
            "metadata": _META,
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "required": ["secretName", "issuerRef"],
                "properties": {
                    "secretName": {"type": "string", "minLength": 1},
                    "dnsNames": {"type": "array", "items": {"type": "string"}},
                    "commonName": {"type": "string"},
                    "duration": {"type": "string"},
                    "renewBefore": {"type": "string"},
                    "isCA": {"type": "boolean"},
                    "usages": {"type": "array", "items": {"enum": _USAGES}},
                    "privateKey": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                            "size": {"type": "integer"},
                            "encoding": {"enum": ["PKCS1", "PKCS8"]},
                            "rotationPolicy": {"enum": ["Never", "Always"]},
                        },
                    },
                    "issuerRef": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["name"],
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "kind": {"type": "string"},
                            "group": {"type": "string"},
                        },
                    },
                },
            },
        },
    },
}


class Failure(Exception):
    """A check failed; the message says which and why."""


def lint(values: dict) -> list[str]:
    report = helm.lint(str(CHART), values or None, strict=True, kube_version=f"v{K8S_VERSION}")
    problems = []
    for msg in report.get("messages") or []:
        # 1 = info ("icon is recommended"); 2 = warning, 3 = error.
        if msg.get("severity", 0) >= 2:
            problems.append(f"{msg.get('path')}: {msg.get('error')}")
    problems.extend(e for e in report.get("errors") or [] if e not in " ".join(problems))
    return problems


def render(values: dict) -> list[tuple[str, dict]]:
    with helm.Chart.load(str(CHART)) as chart:
        files = chart.render(values or None, name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects = []
    for template, text in sorted(files.items()):
        if template.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                objects.append((template, doc))
    return objects


def validate_object(template: str, obj: dict) -> str:
    kind = obj.get("kind")
    where = f"{template}: {kind}/{obj.get('metadata', {}).get('name')}"
    if str(obj.get("apiVersion", "")).startswith("cert-manager.io/"):
        schema = CERT_MANAGER_SCHEMAS.get(kind)
        if schema is None:
            raise Failure(f"{where}: no schema for this cert-manager kind")
        try:
            jsonschema.validate(obj, schema)
        except jsonschema.ValidationError as e:
            raise Failure(f"{where}: {'.'.join(map(str, e.path))}: {e.message}") from None
        return "cert-manager.io/v1 subset"
    try:
        return "Kubernetes " + kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        raise Failure(f"{where}: {'.'.join(map(str, e.path))}: {e.message}") from None
    except kubernetes_validate.SchemaNotFoundError:
        raise Failure(f"{where}: no Kubernetes {K8S_VERSION} schema for {obj.get('apiVersion')}") from None


def find(objects, kind, name=None):
    hits = [o for _, o in objects if o.get("kind") == kind and (name is None or o["metadata"]["name"] == name)]
    return hits


def one(objects, kind, name=None):
    hits = find(objects, kind, name)
    if len(hits) != 1:
        raise Failure(f"expected exactly one {kind}{' ' + name if name else ''}, found {len(hits)}")
    return hits[0]


def expect(cond: bool, message: str) -> None:
    if not cond:
        raise Failure(message)


def container_args(workload: dict) -> list[str]:
    return workload["spec"]["template"]["spec"]["containers"][0].get("args", [])


def component(objects, kind: str, name: str) -> list[dict]:
    return [o for o in find(objects, kind) if o["metadata"]["labels"].get("app.kubernetes.io/component") == name]


def plugin_daemonset(objects) -> dict:
    hits = component(objects, "DaemonSet", "kubelet-plugin")
    expect(len(hits) == 1, f"expected exactly one kubelet-plugin DaemonSet, found {len(hits)}")
    return hits[0]


def check_mps_host(v: dict, objects, plugin: dict) -> None:
    """With mpsHost on: a DaemonSet of its own, updated only on delete, supervised, in the
    host's PID namespace with the plugin, serving the socket the plugin is told, and mounting
    what the plugin names by path (socket directory, driver root, MPS directory, /dev) at the
    same paths. Off: none of it."""
    hosts = component(objects, "DaemonSet", "mps-host")
    plugin_pod = plugin["spec"]["template"]["spec"]
    plugin_args = container_args(plugin)
    flags = [a for a in plugin_args if a.startswith("--mps-host-socket")]
    if not v["kubeletPlugin"]["mpsHost"]["enabled"]:
        expect(not hosts, "an MPS host DaemonSet although mpsHost is off")
        expect(not flags and not plugin_pod.get("hostPID"), f"mpsHost is off but the plugin has {flags}, hostPID")
        return
    expect(len(hosts) == 1, f"expected one MPS host DaemonSet, found {len(hosts)}")
    host = hosts[0]
    pod = host["spec"]["template"]["spec"]
    expect(host["spec"]["updateStrategy"] == {"type": "OnDelete"}, f"the MPS host's updateStrategy is {host['spec']['updateStrategy']}")
    expect(pod.get("hostPID") is True and plugin_pod.get("hostPID") is True, "the plugin and the MPS host must both run with hostPID")
    container = pod["containers"][0]
    expect("livenessProbe" not in container and "readinessProbe" not in container, "a probe could restart the MPS host")
    expect(container["image"] == plugin_pod["containers"][0]["image"], "the MPS host runs another image than the plugin")
    args = container_args(host)
    sockets = [a.split("=", 1)[1] for a in args if a.startswith("--socket=")]
    expect(args[0] == "mps-host" and len(sockets) == 1, f"MPS host args {args}")
    expect("--supervise" in args, "the MPS host runs unsupervised: its crash would end its daemons")
    expect("--container-driver-root=/driver-root" in args and "--container-driver-root=/driver-root" in plugin_args,
           "the MPS host and the plugin see the driver root at different paths")
    expect(flags == [f"--mps-host-socket={sockets[0]}"], f"the plugin's {flags} is not the host's socket {sockets[0]}")
    def mounts(p):
        vols = {vol["name"]: vol.get("hostPath", {}).get("path") for vol in p["volumes"]}
        return {m["mountPath"]: vols.get(m["name"]) for m in p["containers"][0]["volumeMounts"]}
    theirs, ours = mounts(plugin_pod), mounts(pod)
    socket_dir = sockets[0].rsplit("/", 1)[0]
    mps_dirs = [a.split("=", 1)[1] for a in plugin_args if a.startswith("--mps-dir=")]
    for path in [socket_dir, "/driver-root", "/dev", *mps_dirs]:
        expect(path in ours and ours[path] == theirs.get(path),
               f"the MPS host does not mount {path} as the plugin does: {ours.get(path)} vs {theirs.get(path)}")


def check_cross_references(name: str, values: dict, objects) -> None:
    v = merge(yaml.safe_load((CHART / "values.yaml").read_text()), values)
    driver = v["driverName"]
    for template, obj in objects:
        labels = obj.get("metadata", {}).get("labels", {})
        expect(labels.get("app.kubernetes.io/instance") == RELEASE, f"{template}: {obj['kind']} lacks the instance label")
        if obj["kind"] not in {"ClusterRole", "ClusterRoleBinding", "DeviceClass", "ValidatingWebhookConfiguration",
                               "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}:
            expect(obj["metadata"].get("namespace") == NAMESPACE, f"{template}: {obj['kind']} not in the release namespace")

    service_accounts = {o["metadata"]["name"] for o in find(objects, "ServiceAccount")}

    def check_subjects(workload: dict, kind: str):
        sa = workload["spec"]["template"]["spec"]["serviceAccountName"]
        expect(sa in service_accounts, f"{kind} runs as ServiceAccount {sa}, which the chart does not create")
        for binding in find(objects, "ClusterRoleBinding") + find(objects, "RoleBinding"):
            if binding["metadata"]["name"].startswith(workload["metadata"]["name"]):
                subjects = {(s["name"], s["namespace"]) for s in binding["subjects"]}
                expect((sa, NAMESPACE) in subjects, f"{binding['metadata']['name']} does not bind {sa}")
                role_kind = binding["roleRef"]["kind"]
                one(objects, role_kind, binding["roleRef"]["name"])
        return sa

    if v["kubeletPlugin"]["enabled"]:
        ds = plugin_daemonset(objects)
        check_mps_host(v, objects, ds)
        sa = check_subjects(ds, "DaemonSet")
        args = container_args(ds)
        expect(f"--driver-name={driver}" in args, f"DaemonSet args lack --driver-name={driver}: {args}")
        pod = ds["spec"]["template"]["spec"]
        expect(pod.get("priorityClassName") == "system-node-critical" or values.get("kubeletPlugin", {}).get("priorityClassName"),
               "the plugin is not system-node-critical")
        mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        plugin_dir = f"{v['kubeletPlugin']['kubeletPluginsDir'].rstrip('/')}/{driver}"
        for path in (v["kubeletPlugin"]["kubeletRegistrarDir"], plugin_dir, v["kubeletPlugin"]["cdiRoot"], "/dev"):
            expect(path in mounts, f"the plugin does not mount {path} at the same path: {sorted(mounts)}")
        check_mps_dir(name, v["kubeletPlugin"]["mpsDir"], driver, pod)
        check_sysfs_root(name, v["kubeletPlugin"]["sysfsRoot"], pod)
        sockets = f"--per-instance-sockets={v['kubeletPlugin']['perInstanceSockets']}"
        expect(sockets in container_args(ds), f"the plugin is not passed {sockets}")
        rules = one(objects, "ClusterRole", ds["metadata"]["name"])["rules"]
        driver_rules = [r for r in rules if "resourceclaims/driver" in r["resources"]]
        expect(len(driver_rules) == 1 and driver_rules[0].get("resourceNames") == [driver],
               f"resourceclaims/driver is not limited to [{driver}]")
        expect(not any("*" in r["verbs"] or "*" in r["resources"] for r in rules), "wildcard in the plugin's ClusterRole")
        # patch on nodes exactly when the plugin writes the clique label.
        labels_node = any("nodes" in r["resources"] and "patch" in r["verbs"] for r in rules)
        clique = any(a in ("--gpu-clique-label", "--gpu-clique-label=true") for a in args)
        expect(labels_node == clique, f"patch on nodes is {labels_node} but --gpu-clique-label is {clique}")
        if v["resourceSlicePolicy"]["enabled"]:
            policy = one(objects, "ValidatingAdmissionPolicy")
            binding = one(objects, "ValidatingAdmissionPolicyBinding")
            expect(binding["spec"]["policyName"] == policy["metadata"]["name"], "the policy binding names another policy")
            expect(binding["spec"]["validationActions"] == ["Deny"], "the policy binding does not deny")
            user = f"system:serviceaccount:{NAMESPACE}:{sa}"
            expect(any(user in c["expression"] for c in policy["spec"]["matchConditions"]),
                   f"the ResourceSlice policy does not match the plugin's user {user}")
            expect(any(f"'{driver}'" in x["expression"] for x in policy["spec"]["validations"]),
                   "the ResourceSlice policy does not pin the driver name")
        else:
            expect(not find(objects, "ValidatingAdmissionPolicy"), "policy rendered although disabled")

    if v["controller"]["enabled"]:
        dep = one(objects, "Deployment")
        check_subjects(dep, "Deployment")
        args = container_args(dep)
        expect(f"--driver-name={driver}" in args, f"Deployment args lack --driver-name={driver}")
        if v["controller"]["leaderElection"]["enabled"]:
            lease = next(a.split("=", 1)[1] for a in args if a.startswith("--leader-election-lease-name="))
            role = one(objects, "Role")
            named = [r for r in role["rules"] if r.get("resourceNames")]
            expect(named and named[0]["resourceNames"] == [lease], f"the Lease Role does not name the Lease {lease}")
        else:
            expect("--leader-election" not in args and not find(objects, "Role"), "leader election rendered although disabled")

    if v["webhook"]["enabled"]:
        dep = one(objects, "Deployment")
        svc = one(objects, "Service")
        vwc = one(objects, "ValidatingWebhookConfiguration")
        pod = dep["spec"]["template"]["spec"]
        ports = {p["name"]: p["containerPort"] for p in pod["containers"][0]["ports"]}
        expect(svc["spec"]["ports"][0]["targetPort"] in ports, "the Service targets a port the controller lacks")
        expect(f"--webhook-addr=0.0.0.0:{ports['webhook']}" in container_args(dep), "--webhook-addr and the container port differ")
        selector = svc["spec"]["selector"]
        pod_labels = dep["spec"]["template"]["metadata"]["labels"]
        expect(all(pod_labels.get(k) == val for k, val in selector.items()), "the Service does not select the controller pods")
        hook = vwc["webhooks"][0]
        ref = hook["clientConfig"]["service"]
        expect((ref["name"], ref["namespace"]) == (svc["metadata"]["name"], NAMESPACE), "the webhook points at another Service")
        expect(ref["port"] == svc["spec"]["ports"][0]["port"], "the webhook uses a port the Service lacks")
        expect(hook["name"] == f"validate.{driver}", f"webhook name {hook['name']}")
        secret = pod["volumes"][0]["secret"]["secretName"]
        if v["webhook"]["certManager"]["enabled"]:
            cert = one(objects, "Certificate")
            inject = vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
            expect(inject == f"{NAMESPACE}/{cert['metadata']['name']}", f"inject-ca-from {inject} names no rendered Certificate")
            expect(cert["spec"]["secretName"] == secret, "the controller mounts another Secret than the Certificate writes")
            expect(f"{svc['metadata']['name']}.{NAMESPACE}.svc" in cert["spec"]["dnsNames"], "the certificate lacks the Service's DNS name")
            expect("caBundle" not in hook["clientConfig"], "a caBundle next to cert-manager injection")
            issuer = cert["spec"]["issuerRef"]
            if v["webhook"]["certManager"]["issuerRef"]["name"]:
                expect(issuer["name"] == v["webhook"]["certManager"]["issuerRef"]["name"], "issuerRef not passed through")
                expect(not find(objects, "Issuer"), "a self-signed Issuer although an issuer was given")
            else:
                one(objects, "Issuer", issuer["name"])
        else:
            expect(not find(objects, "Certificate") and not find(objects, "Issuer"), "cert-manager objects although disabled")
            expect(secret == v["webhook"]["tls"]["secretName"], "the controller does not mount webhook.tls.secretName")
            expect(hook["clientConfig"].get("caBundle") == v["webhook"]["tls"]["caBundle"], "caBundle not passed through")
            expect("annotations" not in vwc["metadata"], "CA injection annotation although cert-manager is off")
        if name == "defaults":
            check_static_webhook(vwc)
    else:
        expect(not find(objects, "ValidatingWebhookConfiguration") and not find(objects, "Service"), "webhook objects although disabled")
        if v["controller"]["enabled"]:
            expect("--no-webhook" in container_args(one(objects, "Deployment")), "webhook disabled but no --no-webhook")

    classes = {o["metadata"]["name"]: o for o in find(objects, "DeviceClass")}
    if v["deviceClasses"]["enabled"]:
        files = {p.stem: yaml.safe_load(p.read_text()) for p in sorted(DEVICECLASSES.glob("*.yaml"))}
        wanted = set(v["deviceClasses"]["only"]) or set(files)
        expect(set(classes) == wanted, f"DeviceClasses {sorted(classes)} != {sorted(wanted)}")
        for cname, obj in classes.items():
            spec = json.loads(json.dumps(files[cname]["spec"]).replace("'gpu.nvidia.com'", f"'{driver}'"))
            extended = v["deviceClasses"]["gpuExtendedResourceName"]
            if cname == "gpu.nvidia.com" and extended:
                spec["extendedResourceName"] = extended
            expect(obj["spec"] == spec, f"DeviceClass {cname} differs from deviceclasses/{cname}.yaml")
            keep = obj["metadata"].get("annotations", {}).get("helm.sh/resource-policy") == "keep"
            expect(keep == v["deviceClasses"]["keepOnUninstall"], f"DeviceClass {cname}: resource-policy")
    else:
        expect(not classes, "DeviceClasses rendered although disabled")


# The chart's default kubeletPlugin.mpsDir: a tmpfs on systemd hosts.
DEFAULT_MPS_DIR = "/run/gpu-dra-driver/mps"


def check_mps_dir(name: str, mps_root: str, driver: str, pod: dict) -> None:
    """--mps-dir, its mount and its hostPath volume: all three at <mpsDir>/<driverName>
    (one directory per driver name: each plugin stops the daemons in its own that none
    of its claims use), or none of them with mpsDir empty."""
    container = pod["containers"][0]
    flags = [a for a in container.get("args", []) if a.split("=", 1)[0] == "--mps-dir"]
    named = [m for m in container["volumeMounts"] if m["name"] == "mps-dir"]
    volumes = {vol["name"]: vol for vol in pod["volumes"]}
    if name == "defaults":
        expect(mps_root == DEFAULT_MPS_DIR, f"default kubeletPlugin.mpsDir is {mps_root!r}, not {DEFAULT_MPS_DIR!r}")
    if not mps_root:
        expect(not flags, f"mpsDir is empty but the plugin gets {flags}")
        expect(not named and "mps-dir" not in volumes, "mpsDir is empty but the mps-dir volume is rendered")
        return
    mps_dir = f"{mps_root.rstrip('/')}/{driver}"
    expect(flags == [f"--mps-dir={mps_dir}"], f"the plugin's --mps-dir args are {flags}, not [--mps-dir={mps_dir}]")
    mounts = [m for m in container["volumeMounts"] if m["mountPath"] == mps_dir]
    expect(len(mounts) == 1 and mounts[0] in named, f"the plugin does not mount mps-dir at {mps_dir}: {mounts}")
    host = volumes.get(mounts[0]["name"], {}).get("hostPath", {})
    expect(host.get("path") == mps_dir, f"the mps-dir volume is not the host path {mps_dir}: {host}")
    expect(host.get("type") == "DirectoryOrCreate", f"the mps-dir hostPath type is {host.get('type')}")


def check_sysfs_root(name: str, root: str, pod: dict) -> None:
    """kubeletPlugin.sysfsRoot: empty (the default), no sysfs-root volume and, by default,
    no --sysfs-root (the plugin reads the container's /sys); set, the flag, a read-write
    mount at the same path and the host directory."""
    container = pod["containers"][0]
    flags = [a for a in container.get("args", []) if a.split("=", 1)[0] == "--sysfs-root"]
    mounts = [m for m in container["volumeMounts"] if m["name"] == "sysfs-root"]
    volumes = {vol["name"]: vol for vol in pod["volumes"]}
    if not root:
        expect(not mounts and "sysfs-root" not in volumes, "sysfsRoot is empty but a sysfs-root volume is rendered")
        expect(name != "defaults" or not flags, f"the default install passes {flags}")
        return
    expect(flags == [f"--sysfs-root={root}"], f"the plugin's --sysfs-root args are {flags}, not [--sysfs-root={root}]")
    expect(len(mounts) == 1 and mounts[0]["mountPath"] == root and not mounts[0].get("readOnly"),
           f"the plugin does not mount sysfs-root read-write at {root}: {mounts}")
    host = volumes.get("sysfs-root", {}).get("hostPath", {})
    expect(host == {"path": root, "type": "Directory"}, f"the sysfs-root volume is {host}, not the directory {root}")


def check_static_webhook(vwc: dict) -> None:
    """The chart's webhook (default values) agrees with deployments/webhook/."""
    static = yaml.safe_load((STATIC_WEBHOOK / "validating-webhook-configuration.yaml").read_text())
    ours, theirs = copy.deepcopy(vwc["webhooks"][0]), copy.deepcopy(static["webhooks"][0])
    for hook in (ours, theirs):
        hook["clientConfig"]["service"].pop("name")
        hook["clientConfig"]["service"].pop("namespace")
        hook["clientConfig"].pop("caBundle", None)
    expect(ours == theirs, "the chart's webhook differs from deployments/webhook/validating-webhook-configuration.yaml:\n"
           f"  chart:  {json.dumps(ours, sort_keys=True)}\n  static: {json.dumps(theirs, sort_keys=True)}")
    service = yaml.safe_load((STATIC_WEBHOOK / "service.yaml").read_text())
    expect(service["spec"]["ports"][0]["port"] == 443, "the static Service no longer listens on 443")


def help_flags(binary: str, *sub: str) -> set[str]:
    out = subprocess.run([binary, *sub, "--help"], capture_output=True, text=True, check=True).stdout
    return {word.split("=")[0].rstrip(",.") for word in out.split() if word.startswith("--")}


def check_flags(objects, kind: str, binary: str) -> None:
    """Every flag a workload passes is one the program's --help lists (the MPS host's
    `mps-host --help` for its DaemonSet)."""
    for obj in find(objects, kind):
        args = container_args(obj)
        sub = args[:1] if args[:1] == ["mps-host"] else []
        known = help_flags(binary, *sub)
        missing = sorted({arg.split("=", 1)[0] for arg in args[len(sub):]} - known)
        expect(not missing, f"{kind} {obj['metadata']['name']}: {binary} {' '.join(sub)} has no flag {', '.join(missing)}")


def checked_render(name: str, values: dict, refs: dict) -> list:
    """`helm lint --strict` clean, rendered, each object valid, cross-references
    checked against `refs` (the values they follow), and the workloads' flags known
    to the built binaries where named: the rendered objects."""
    problems = lint(values)
    if problems:
        raise Failure("helm lint --strict:\n    " + "\n    ".join(problems))
    objects = render(values)
    expect(bool(objects), "no objects rendered")
    for template, obj in objects:
        validate_object(template, obj)
    check_cross_references(name, refs, objects)
    for env, kind in (("GPU_KUBELET_PLUGIN_BIN", "DaemonSet"), ("GPU_DRA_CONTROLLER_BIN", "Deployment")):
        if os.environ.get(env):
            check_flags(objects, kind, os.environ[env])
    return objects


def variant(name: str, values: dict) -> int:
    """Checks one values variant; the number of objects it renders."""
    objects = checked_render(name, values, values)
    kinds: dict[str, int] = {}
    for _, obj in objects:
        kinds[obj["kind"]] = kinds.get(obj["kind"], 0) + 1
    summary = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    print(f"ok   {name}: lint clean; {len(objects)} objects valid ({summary})")
    return len(objects)


def nvidia_equivalent(name: str, nvidia: dict, ours: dict) -> int:
    """Checks NVIDIA's values file `nvidia`, which must render as `ours` does; the
    number of objects it renders."""
    objects = checked_render(name, nvidia, ours)
    theirs = sorted((json.dumps(o, sort_keys=True) for _, o in objects))
    equivalent = sorted((json.dumps(o, sort_keys=True) for _, o in render(ours)))
    if theirs != equivalent:
        extra = sorted(set(theirs) - set(equivalent))
        missing = sorted(set(equivalent) - set(theirs))
        raise Failure(f"renders differently from {json.dumps(ours)}:\n  only with NVIDIA's values: {extra[:2]}\n  only with ours: {missing[:2]}")
    print(f"ok   {name}: lint clean; {len(objects)} objects valid, the same as {json.dumps(ours, separators=(',', ':'))}")
    return len(objects)


def main() -> int:
    failures = 0
    total = 0
    cases = [(name, variant, (name, values)) for name, values in VARIANTS.items()]
    cases += [(name, nvidia_equivalent, (name, nvidia, ours)) for name, nvidia, ours in NVIDIA_EQUIVALENTS]
    for name, check, args in cases:
        try:
            total += check(*args)
        except Failure as e:
            failures += 1
            print(f"FAIL {name}: {e}")
        except helm.HelmError as e:
            failures += 1
            print(f"FAIL {name}: helm: {e}")

    for values, needle in REFUSED:
        label = json.dumps(values, separators=(",", ":"))
        try:
            render(values)
        except helm.HelmError as e:
            if needle in str(e):
                print(f"ok   refused {label}: {str(e).splitlines()[-1].strip()[:120]}")
            else:
                failures += 1
                print(f"FAIL refused {label}, but the message lacks {needle!r}: {e}")
            continue
        failures += 1
        print(f"FAIL {label} rendered, but must be refused ({needle})")

    if failures:
        print(f"FAILED: {failures} chart check(s) failed", file=sys.stderr)
        return 1
    print(f"ok: chart lint-clean in {len(VARIANTS)} variants and {len(NVIDIA_EQUIVALENTS)} NVIDIA values files "
          f"(each rendering as its equivalent), {total} rendered objects valid "
          f"against Kubernetes {K8S_VERSION}, {len(REFUSED)} bad values refused")
    return 0


if __name__ == "__main__":
    sys.exit(main())
