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
# in `cargo test -p gpu-dra` (cli/tests/lint.rs). Without arguments it then
# runs hack/validate-chart.sh: `helm lint` of the chart and the same schema
# check of everything it renders (needs helm-python-sdk, see that script).
#
# Usage: hack/validate-manifests.sh [FILE|DIR...]   (default: the dirs above, then the chart)
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

# Without arguments, also the YAML examples of the docs (README.md and
# docs/**/*.md): every ```yaml block not marked with a `<!-- lint: ... -->`
# comment (marked ones are fragments or deliberate mistakes; all of them are
# linted by cli/tests/docs_examples.rs), one file per block, named after its
# Markdown file and line.
if [ "$#" -eq 0 ]; then
    docs_dir="$(mktemp -d)"
    trap 'rm -rf "$docs_dir"' EXIT
    while IFS= read -r md; do
        awk -v out="$docs_dir" -v md="$md" '
            /^[ \t]*```/ {
                if (inside) { inside = 0; if (keep) close(file); prev = $0; next }
                inside = 1; keep = 0
                if ($0 ~ /^[ \t]*```ya?ml[ \t]*$/ && prev !~ /^[ \t]*<!-- lint/) {
                    keep = 1; indent = match($0, /[^ \t]/) - 1
                    name = md; gsub("/", "__", name)
                    file = out "/" name "-L" (NR + 1) ".yaml"
                    printf "" > file
                }
                next
            }
            inside { if (keep) print substr($0, indent + 1) > file; next }
            /[^ \t]/ { prev = $0 }
        ' "$md"
    done < <({ [ -f README.md ] && echo README.md; [ -d docs ] && find docs -name '*.md' -type f | sort; } || true)
    while IFS= read -r file; do
        files+=("$file")
    done < <(find "$docs_dir" -type f -name '*.yaml' | sort)
fi

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

if [ "$#" -eq 0 ]; then
    echo "helm chart: lint and rendered manifests (hack/validate-chart.sh):"
    K8S_VERSION="$K8S_VERSION" PYTHON="$PYTHON" hack/validate-chart.sh
fi
