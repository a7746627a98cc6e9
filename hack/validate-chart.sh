#!/usr/bin/env bash
# Lints the Helm chart (deployments/helm/gpu-dra-driver) and validates every
# object it renders, offline, in several values variants (defaults, cert-manager
# on/off, another driver name, webhook off, MPS directory off, plugin only),
# plus values that must be refused. See hack/validate_chart.py for the checks. Needs two PyPI packages
# (Helm's Go library and the Kubernetes schemas):
#   python3 -m pip install helm-python-sdk==0.2.2 kubernetes-validate==1.37.0
#
# Usage: hack/validate-chart.sh
# Env:   K8S_VERSION (default 1.37.0), PYTHON (default python3),
#        GPU_KUBELET_PLUGIN_BIN / GPU_DRA_CONTROLLER_BIN: built binaries whose
#        --help must list every flag the chart passes (optional).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
for module in helm_python:helm-python-sdk==0.2.2 kubernetes_validate:kubernetes-validate==1.37.0; do
    if ! "$PYTHON" -c "import ${module%%:*}" 2>/dev/null; then
        echo "error: the Python package ${module#*:} is not installed for $PYTHON" >&2
        echo "       install it with: $PYTHON -m pip install ${module#*:}" >&2
        exit 2
    fi
done

# Helm logs at INFO that it follows the chart's deviceclasses link; that is intended.
"$PYTHON" hack/validate_chart.py 2> >(grep -v 'found symbolic link in path' >&2)
