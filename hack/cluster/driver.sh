# shellcheck shell=bash
# The driver on the real test cluster (hack/cluster/up --with-driver): release
# binaries, images imported into containerd, this machine made a fake GPU node
# of machine profile $PROFILE, and the Helm chart installed as users install
# it. Sourced by up, which sets BIN, STATE, PKI, PROFILE, HELM_SETS, ctr_k8s...

DRIVER_NS=gpu-dra-driver
RELEASE=gpu-dra-driver
# Cargo profile of the driver's binaries (GPU_DRA_CLUSTER_CARGO_PROFILE): release
# by default, as shipped.
CARGO_PROFILE="${GPU_DRA_CLUSTER_CARGO_PROFILE:-release}"

# Builds the plugin, controller, fake NVML and fake driver root; prints the
# folder holding them.
build_driver() {
    local dir
    log "building the driver (cargo, profile $CARGO_PROFILE)"
    # Target flags apply to every package named: --lib brings mock-nvml's cdylib.
    (cd "$REPO_ROOT" && cargo build --locked --profile "$CARGO_PROFILE" \
        -p gpu-kubelet-plugin -p gpu-dra-controller -p mock-nvml -p fake-driver-root \
        --lib --bin gpu-kubelet-plugin --bin gpu-dra-controller --bin fake-driver-root >&2) ||
        die "building the driver failed (cargo above): not installing the binaries of an earlier build"
    dir="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/$CARGO_PROFILE"
    [ "$CARGO_PROFILE" = dev ] && dir="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/debug"
    echo "$dir"
}

# Stand-in device nodes in the host's /dev (char devices with /dev/null's
# numbers, as the container runtime checks what CDI specs name), one per GPU
# minor of the profile plus the control nodes and the MIG capability nodes.
# Each node made is listed in $STATE/dev-nodes for down.
make_device_nodes() {
    local profile=$1 max_minor i node
    max_minor="$(sed -n 's/^ *minor: *\([0-9]*\).*/\1/p' "$profile" | sort -n | tail -1)"
    [ -n "$max_minor" ] || die "no GPU minor numbers in $profile"
    mkdir -p /dev/nvidia-caps
    touch "$STATE/dev-nodes"
    mk() {
        [ -e "$1" ] && return
        mknod -m "$2" "$1" c 1 3
        echo "$1" >>"$STATE/dev-nodes"
    }
    for node in nvidiactl nvidia-uvm nvidia-uvm-tools; do mk "/dev/$node" 666; done
    for ((i = 0; i <= max_minor; i++)); do mk "/dev/nvidia$i" 666; done
    for ((i = 1; i <= 3 + 135 * (max_minor + 1); i++)); do mk "/dev/nvidia-caps/nvidia-cap$i" 444; done
}

install_driver() {
    local out profile version tag plugin_image controller_image work ca slices i
    command -v cargo >/dev/null || die "cargo is not installed (the driver is built from this clone)"
    out="$(build_driver)"
    profile="$REPO_ROOT/hack/mock-nvml/profiles/$PROFILE.yaml"
    version="$(sed -n 's/^driverVersion: *"\{0,1\}\([0-9.]*\).*/\1/p' "$profile")"

    # The tag is the binaries' digest: a rebuild is a new tag (a rolling update).
    # Helm gets it with --set-string: a digest of only digits is still a tag, not a number.
    tag="$(cat "$out/gpu-kubelet-plugin" "$out/libnvidia_ml.so" "$REPO_ROOT"/hack/mock-nvml/profiles/*.yaml |
        sha256sum | cut -c1-12)"
    plugin_image="gpu-dra.local/gpu-kubelet-plugin:$tag"
    import_image "$plugin_image" plugin_archive_of "$out"
    tag_c="$(sha256sum "$out/gpu-dra-controller" | cut -c1-12)"
    controller_image="gpu-dra.local/gpu-dra-controller:$tag_c"
    import_image "$controller_image" controller_archive_of "$out"

    log "fake GPU node: profile $PROFILE, driver $version, root $FAKE_ROOT"
    make_device_nodes "$profile"
    "$out/fake-driver-root" --driver-root "$FAKE_ROOT/driver-root" --proc-root "$FAKE_ROOT/proc" \
        --driver-version "$version" >&2
    kubectl label node "$NODE_NAME" nvidia.com/gpu.present=true --overwrite >/dev/null

    log "namespace $DRIVER_NS and the webhook's serving certificate (the chart's own-Secret path)"
    kubectl get namespace "$DRIVER_NS" >/dev/null 2>&1 || kubectl create namespace "$DRIVER_NS" >/dev/null
    kubectl label namespace "$DRIVER_NS" pod-security.kubernetes.io/enforce=privileged --overwrite >/dev/null
    work="$(mktemp -d)"
    svc="$RELEASE-webhook"
    openssl req -x509 -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -days 30 \
        -subj "/CN=$svc.$DRIVER_NS.svc" -addext "subjectAltName=DNS:$svc.$DRIVER_NS.svc,DNS:$svc.$DRIVER_NS.svc.cluster.local" \
        -keyout "$work/tls.key" -out "$work/tls.crt" 2>/dev/null
    if kubectl get secret -n "$DRIVER_NS" gpu-dra-webhook-tls >/dev/null 2>&1; then
        kubectl get secret -n "$DRIVER_NS" gpu-dra-webhook-tls -o jsonpath='{.data.tls\.crt}' | base64 -d >"$work/tls.crt"
    else
        kubectl create secret tls gpu-dra-webhook-tls -n "$DRIVER_NS" \
            --cert "$work/tls.crt" --key "$work/tls.key" >/dev/null
    fi
    ca="$(base64 <"$work/tls.crt" | tr -d '\n')"
    rm -rf "$work"

    log "helm upgrade --install $RELEASE deployments/helm/gpu-dra-driver"
    helm --kubeconfig "$KUBECONFIG_ADMIN" upgrade --install "$RELEASE" "$REPO_ROOT/deployments/helm/gpu-dra-driver" \
        -n "$DRIVER_NS" -f "$CLUSTER_DIR/values.yaml" \
        --set-string "kubeletPlugin.image.tag=$tag" --set-string "controller.image.tag=$tag_c" \
        --set "webhook.tls.caBundle=$ca" \
        --set-json "kubeletPlugin.extraEnv=[
            {\"name\":\"MOCK_NVML_PROFILE\",\"value\":\"/opt/mock-nvml/profiles/$PROFILE.yaml\"},
            {\"name\":\"MOCK_NVML_PROC_ROOT\",\"value\":\"/host-proc\"},
            {\"name\":\"MOCK_NVML_STATE\",\"value\":\"/var/lib/kubelet/plugins/$DRIVER_NAME/mock-nvml-state.json\"},
            {\"name\":\"MOCK_NVML_CONTROL\",\"value\":\"/var/lib/kubelet/plugins/$DRIVER_NAME/mock-nvml-control\"}]" \
        "${HELM_SETS[@]}" --wait=legacy --timeout 5m >&2

    log "waiting for the node's ResourceSlices"
    for ((i = 0; i < 120; i++)); do
        slices="$(kubectl get resourceslices -o name --field-selector "spec.driver=$DRIVER_NAME,spec.nodeName=$NODE_NAME")"
        [ -n "$slices" ] && break
        sleep 1
    done
    [ -n "$slices" ] || {
        kubectl logs -n "$DRIVER_NS" -l app.kubernetes.io/component=kubelet-plugin --tail 50 >&2 || true
        die "the plugin published no ResourceSlices for $NODE_NAME"
    }
    log "driver installed: $plugin_image, $controller_image; $(wc -l <<<"$slices") ResourceSlice(s)"
}

plugin_archive_of() { # <out dir> <tar> <name>
    plugin_archive "$2" "$3" "$1/gpu-kubelet-plugin" "$1/libnvidia_ml.so"
}
controller_archive_of() { # <out dir> <tar> <name>
    controller_archive "$2" "$3" "$1/gpu-dra-controller"
}
