#!/usr/bin/env bash
# End-to-end test on a real (kind) cluster, with no GPU: builds the images, creates a kind
# cluster with the DRA feature gates, makes its worker a "GPU node" (the fake NVML library
# with a machine profile, stand-in device nodes and driver files), installs the Helm chart,
# runs every claim of docs/examples/ in a real pod and checks the pod's environment and
# device nodes, then checks that deleting the pods unprepares the claims.
# Needs docker, kind, kubectl (1.34+), helm (3.10+) and openssl. See README.md.
#
# Env: PROFILE (hack/mock-nvml/profiles/<name>.yaml, default dgx-h100),
#      KIND_NODE_IMAGE (default kindest/node:v1.34.0), CLUSTER (default gpu-dra-e2e),
#      KEEP_CLUSTER=1 to keep the cluster afterwards, SKIP_BUILD=1 to reuse built images.
set -euo pipefail
cd "$(dirname "$0")/../.."

PROFILE="${PROFILE:-dgx-h100}"
KIND_NODE_IMAGE="${KIND_NODE_IMAGE:-kindest/node:v1.34.0}"
CLUSTER="${CLUSTER:-gpu-dra-e2e}"
NS=gpu-dra-driver
TEST_NS=gpu-dra-e2e
DRIVER=gpu.nvidia.com
BUSYBOX=busybox:1.36
WORKER="$CLUSTER-worker"
WORK="$(mktemp -d)"

step() { printf '\n== %s\n' "$*"; }
fail() {
    echo "FAILED: $*" >&2
    kubectl get pods,resourceclaims -A -o wide >&2 || true
    kubectl describe pods -n "$TEST_NS" >&2 || true
    kubectl logs -n "$NS" -l app.kubernetes.io/component=kubelet-plugin --tail=200 >&2 || true
    exit 1
}
cleanup() {
    rm -rf "$WORK"
    if [ "${KEEP_CLUSTER:-0}" = 1 ]; then
        echo "cluster kept: kind delete cluster --name $CLUSTER"
    else
        kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
    fi
}
for tool in docker kind kubectl helm openssl; do
    command -v "$tool" >/dev/null || { echo "error: $tool is not installed" >&2; exit 2; }
done
[ -f "hack/mock-nvml/profiles/$PROFILE.yaml" ] || { echo "error: no profile $PROFILE" >&2; exit 2; }

if [ "${SKIP_BUILD:-0}" != 1 ]; then
    step "images"
    docker build --target gpu-kubelet-plugin-fake-nvml -t gpu-kubelet-plugin:e2e .
    docker build --target gpu-dra-controller -t gpu-dra-controller:e2e .
fi
docker pull -q "$BUSYBOX"

step "kind cluster $CLUSTER ($KIND_NODE_IMAGE)"
kind create cluster --name "$CLUSTER" --image "$KIND_NODE_IMAGE" \
    --config e2e/kind/kind-config.yaml --wait 120s
trap cleanup EXIT
kind load docker-image --name "$CLUSTER" gpu-kubelet-plugin:e2e gpu-dra-controller:e2e "$BUSYBOX"

step "fake GPU node $WORKER (profile $PROFILE)"
# Device nodes are character devices with /dev/null's numbers, so the container runtime can
# inject them as CDI asks; one capability node per MIG minor of each GPU (3 + 135 per GPU).
max_minor="$(sed -n 's/^ *minor: *\([0-9]*\).*/\1/p' "hack/mock-nvml/profiles/$PROFILE.yaml" | sort -n | tail -1)"
version="$(sed -n 's/^driverVersion: *"\{0,1\}\([0-9.]*\).*/\1/p' "hack/mock-nvml/profiles/$PROFILE.yaml")"
docker exec -i "$WORKER" bash -s "$max_minor" "$version" <<'NODE'
set -euo pipefail
max_minor=$1 version=$2 root=/var/lib/gpu-dra-e2e
lib="$root/driver-root/usr/lib/$(uname -m)-linux-gnu" bin="$root/driver-root/usr/bin"
mkdir -p "$lib" "$bin" "$root/proc/driver/nvidia" /dev/nvidia-caps
node() { [ -e "$1" ] || mknod -m "$2" "$1" c 1 3; }
for n in nvidiactl nvidia-uvm nvidia-uvm-tools; do node "/dev/$n" 666; done
for ((i = 0; i <= max_minor; i++)); do node "/dev/nvidia$i" 666; done
for ((i = 1; i <= 3 + 135 * (max_minor + 1); i++)); do node "/dev/nvidia-caps/nvidia-cap$i" 444; done
# The user-space files the plugin mounts into containers (empty: nothing runs CUDA here).
for l in libcuda libnvidia-ml; do
    : >"$lib/$l.so.$version"
    ln -sf "$l.so.$version" "$lib/$l.so.1"
done
# Stand-in programs the plugin runs from the driver root (the e2e plugin image has a shell).
cat >"$bin/nvidia-smi" <<'EOF'
#!/bin/sh
echo "fake nvidia-smi $*" >&2
EOF
cat >"$bin/nvidia-cuda-mps-control" <<'EOF'
#!/bin/sh
# -d: start a "daemon" (a sleeping process) with its control pipe and log; otherwise read
# commands from stdin, log them, and stop the daemon on "quit".
pipe="${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}" log="${CUDA_MPS_LOG_DIRECTORY:-/var/log/nvidia-mps}"
mkdir -p "$pipe" "$log"
if [ "${1:-}" = -d ]; then
    [ -p "$pipe/control" ] || mkfifo "$pipe/control"
    sleep 2147483647 >/dev/null 2>&1 &
    echo $! >"$pipe/fake-daemon.pid"
    echo "$(date '+[%F %T]') Startup" >>"$log/control.log"
    exit 0
fi
while read -r cmd; do
    echo "$(date '+[%F %T]') $cmd" >>"$log/control.log"
    [ "$cmd" = quit ] && kill "$(cat "$pipe/fake-daemon.pid")" 2>/dev/null
done
exit 0
EOF
chmod 755 "$bin"/*
NODE

step "webhook certificate"
svc=gpu-dra-driver-webhook
openssl req -x509 -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -days 2 \
    -subj "/CN=$svc.$NS.svc" -addext "subjectAltName=DNS:$svc.$NS.svc" \
    -keyout "$WORK/tls.key" -out "$WORK/tls.crt" 2>/dev/null
kubectl create namespace "$NS"
kubectl label namespace "$NS" pod-security.kubernetes.io/enforce=privileged
kubectl create secret tls gpu-dra-webhook-tls -n "$NS" --cert "$WORK/tls.crt" --key "$WORK/tls.key"

step "helm install"
helm install gpu-dra-driver deployments/helm/gpu-dra-driver -n "$NS" \
    -f e2e/kind/values.yaml \
    --set webhook.tls.caBundle="$(base64 <"$WORK/tls.crt" | tr -d '\n')" \
    --set-json "kubeletPlugin.extraEnv=[
        {\"name\":\"MOCK_NVML_PROFILE\",\"value\":\"/opt/mock-nvml/profiles/$PROFILE.yaml\"},
        {\"name\":\"MOCK_NVML_PROC_ROOT\",\"value\":\"/host-proc\"},
        {\"name\":\"MOCK_NVML_STATE\",\"value\":\"/var/lib/kubelet/plugins/$DRIVER/mock-nvml-state.json\"}]" \
    --wait --timeout 5m

step "ResourceSlices of $WORKER"
for _ in $(seq 60); do
    slices="$(kubectl get resourceslices -o name --field-selector "spec.driver=$DRIVER,spec.nodeName=$WORKER")"
    [ -n "$slices" ] && break
    sleep 2
done
[ -n "$slices" ] || fail "no ResourceSlices published for $WORKER"
echo "$slices"

step "the admission policy keeps the plugin to its own node"
plugin_pod="$(kubectl get pods -n "$NS" -l app.kubernetes.io/component=kubelet-plugin -o jsonpath='{.items[0].metadata.name}')"
token="$(kubectl create token gpu-dra-driver-kubelet-plugin -n "$NS" --bound-object-kind Pod --bound-object-name "$plugin_pod")"
server="$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')"
foreign="apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: e2e-foreign-slice}
spec: {driver: $DRIVER, nodeName: $CLUSTER-control-plane, pool: {name: e2e, generation: 0, resourceSliceCount: 1}}"
if out="$(kubectl --kubeconfig /dev/null --server "$server" --insecure-skip-tls-verify --token "$token" \
    create -f - <<<"$foreign" 2>&1)"; then
    fail "the plugin's token wrote a ResourceSlice of another node"
fi
grep -q "may not write ResourceSlices of node $CLUSTER-control-plane" <<<"$out" || fail "unexpected refusal: $out"
echo "refused: ${out##*: }"

step "docs/examples claims in pods"
kubectl create namespace "$TEST_NS"
for file in docs/examples/*.yaml; do
    # The examples' own pods run CUDA images; only their claims are applied here.
    awk 'BEGIN { doc = "\n" }
         /^---/ { if (doc !~ /\nkind: Pod\n/) printf "%s", doc; doc = "---\n"; next }
         { doc = doc $0 "\n" }
         END { if (doc !~ /\nkind: Pod\n/) printf "%s", doc }' "$file" |
        kubectl apply -n "$TEST_NS" -f -
done
pods=()
for kind in resourceclaimtemplates resourceclaims; do
    field=resourceClaimName
    [ "$kind" = resourceclaimtemplates ] && field=resourceClaimTemplateName
    for name in $(kubectl get "$kind" -n "$TEST_NS" -o jsonpath='{.items[*].metadata.name}'); do
        kubectl apply -n "$TEST_NS" -f - <<EOF
apiVersion: v1
kind: Pod
metadata: {name: check-$name}
spec:
  restartPolicy: Never
  containers:
    - name: check
      image: $BUSYBOX
      imagePullPolicy: IfNotPresent
      command: ["sh", "-c", "echo NVIDIA_VISIBLE_DEVICES=\$NVIDIA_VISIBLE_DEVICES; ls /dev/nvidiactl /dev/nvidia[0-9]*"]
      resources: {claims: [{name: gpus}]}
  resourceClaims:
    - {name: gpus, $field: $name}
EOF
        pods+=("check-$name")
    done
done
[ "${#pods[@]}" -gt 0 ] || fail "no claims found in docs/examples"
for pod in "${pods[@]}"; do
    kubectl wait -n "$TEST_NS" --for=jsonpath='{.status.phase}'=Succeeded "pod/$pod" --timeout=180s ||
        fail "pod $pod did not succeed"
    log="$(kubectl logs -n "$TEST_NS" "$pod")"
    grep -qx 'NVIDIA_VISIBLE_DEVICES=void' <<<"$log" || fail "$pod: no NVIDIA_VISIBLE_DEVICES=void from the CDI spec: $log"
    grep -q '^/dev/nvidia[0-9]' <<<"$log" || fail "$pod: no GPU device node: $log"
    echo "ok $pod: $(grep -c '^/dev/nvidia[0-9]' <<<"$log") GPU node(s): $(grep '^/dev/nvidia[0-9]' <<<"$log" | tr '\n' ' ')"
done

step "unprepare"
kubectl delete pods -n "$TEST_NS" --all --wait --timeout=120s
leftover="$(docker exec "$WORKER" sh -c "ls /var/run/cdi | grep '^k8s.gpu.nvidia.com-claim_' || true")"
[ -z "$leftover" ] || fail "CDI specs left after the pods were deleted: $leftover"
echo "no claim CDI specs left on $WORKER"

echo
echo "PASSED: ${#pods[@]} claims from docs/examples prepared, used and unprepared on kind ($KIND_NODE_IMAGE)"
