#!/usr/bin/env bash
# Validates every Kubernetes manifest the project ships against the
# Kubernetes OpenAPI schema (1.37 by default), strictly (unknown fields are
# errors), with the PyPI package kubernetes-validate:
#   python3 -m pip install kubernetes-validate==1.37.0
#
# Checked: deviceclasses/, docs/examples/ and deployments/ (*.yaml, *.yml),
# except Helm charts (directories with a Chart.yaml: their templates are not
# plain manifests) and kustomization files. Fails on any invalid manifest,
# on an object whose kind has no schema (it would go unchecked), and when
# nothing was found to check. The engine's own checks (`gpu-dra lint`) run
# in `cargo test -p gpu-dra` (cli/tests/lint.rs).
#
# Usage: hack/validate-manifests.sh [FILE|DIR...]   (default: the dirs above)
# Env:   K8S_VERSION (default 1.37.0), PYTHON (default python3)
set -euo pipefail
cd "$(dirname "$0")/.."

K8S_VERSION="${K8S_VERSION:-1.37.0}"
PYTHON="${PYTHON:-python3}"

if ! "$PYTHON" -c 'import kubernetes_validate' 2>/dev/null; then
    echo "error: the Python package kubernetes-validate is not installed for $PYTHON" >&2
    echo "       install it with: $PYTHON -m pip install kubernetes-validate==1.37.0" >&2
    exit 2
fi

if [ "$#" -gt 0 ]; then
    roots=("$@")
else
    roots=()
    for dir in deviceclasses docs/examples deployments; do
        [ -d "$dir" ] && roots+=("$dir")
    done
fi

# Helm chart roots, to skip.
charts=()
for root in "${roots[@]}"; do
    [ -d "$root" ] || continue
    while IFS= read -r chart; do
        charts+=("$(dirname "$chart")")
    done < <(find "$root" -name Chart.yaml -type f | sort)
done

files=()
for root in "${roots[@]}"; do
    if [ -f "$root" ]; then
        files+=("$root")
        continue
    fi
    if [ ! -d "$root" ]; then
        echo "error: $root: no such file or directory" >&2
        exit 2
    fi
    while IFS= read -r file; do
        skip=""
        for chart in "${charts[@]+"${charts[@]}"}"; do
            case "$file" in "$chart"/*) skip="Helm chart $chart" ;; esac
        done
        case "$(basename "$file")" in
            kustomization.yaml | kustomization.yml) skip="kustomization file" ;;
        esac
        if [ -n "$skip" ]; then
            echo "skip $file ($skip)"
        else
            files+=("$file")
        fi
    done < <(find "$root" -type f \( -name '*.yaml' -o -name '*.yml' \) | sort)
done

if [ "${#files[@]}" -eq 0 ]; then
    echo "error: no manifests found under: ${roots[*]}" >&2
    exit 1
fi

echo "validating ${#files[@]} files against the Kubernetes $K8S_VERSION schema (strict):"
set +e
output="$("$PYTHON" -m kubernetes_validate --kubernetes-version "$K8S_VERSION" --strict "${files[@]}" 2>&1)"
status=$?
set -e
echo "$output"

passed="$(grep -c ' passed for resource ' <<<"$output" || true)"
problems="$(grep -Ev ' passed for resource ' <<<"$output" | grep -Ec '^(WARN|ERROR|FATAL)|^Couldn' || true)"
if [ "$status" -ne 0 ] || [ "$problems" -ne 0 ]; then
    echo "FAILED: $problems problem(s) in the manifests above (kubernetes-validate exit status $status)" >&2
    exit 1
fi
if [ "$passed" -eq 0 ]; then
    echo "FAILED: no Kubernetes object found in ${#files[@]} files" >&2
    exit 1
fi
echo "ok: $passed objects in ${#files[@]} files are valid Kubernetes $K8S_VERSION manifests"
