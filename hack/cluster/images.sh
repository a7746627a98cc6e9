# shellcheck shell=bash
# OCI image archives made by hand, for a cluster that can pull nothing (no
# registry is reachable): each image is one uncompressed layer tar, a config,
# a manifest and an index naming the image, as the OCI image-spec lays them
# out, so `ctr images import` takes the archive as it is. Sourced by up.
#
# Why by hand: no base image can be pulled, and the tools that assemble
# images without a daemon (umoci, buildah, crane) would add a build of their
# own for what is four JSON documents and a tar.

# Writes <out> (an OCI archive) of image <name> from the folder <rootfs>.
oci_archive() { # <out.tar> <name> <rootfs> <config JSON fragment>
    local out=$1 name=$2 rootfs=$3 config=$4 work layer config_json manifest
    work="$(mktemp -d)"
    mkdir -p "$work/blobs/sha256"
    # Reproducible: the same files give the same digest (sorted, no times, root-owned).
    tar -C "$rootfs" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
        -cf "$work/layer.tar" .
    layer="$(sha256sum "$work/layer.tar" | cut -d' ' -f1)"
    mv "$work/layer.tar" "$work/blobs/sha256/$layer"
    config_json="{\"architecture\":\"amd64\",\"os\":\"linux\",\"config\":$config,\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[\"sha256:$layer\"]}}"
    blob "$work" "$config_json" >"$work/config.digest"
    manifest="{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"config\":{\"mediaType\":\"application/vnd.oci.image.config.v1+json\",\"digest\":\"sha256:$(cut -d' ' -f1 "$work/config.digest")\",\"size\":$(cut -d' ' -f2 "$work/config.digest")},\"layers\":[{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar\",\"digest\":\"sha256:$layer\",\"size\":$(stat -c %s "$work/blobs/sha256/$layer")}]}"
    blob "$work" "$manifest" >"$work/manifest.digest"
    printf '{"imageLayoutVersion":"1.0.0"}' >"$work/oci-layout"
    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
        "$(cut -d' ' -f1 "$work/manifest.digest")" "$(cut -d' ' -f2 "$work/manifest.digest")" \
        "$name" "${name##*:}" >"$work/index.json"
    rm -f "$work/config.digest" "$work/manifest.digest"
    tar -C "$work" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$out" .
    rm -rf "$work"
}

# Stores <content> as a blob; prints "<hex digest> <size>".
blob() { # <layout dir> <content>
    local digest
    digest="$(printf '%s' "$2" | sha256sum | cut -d' ' -f1)"
    printf '%s' "$2" >"$1/blobs/sha256/$digest"
    echo "$digest ${#2}"
}

# Copies a dynamically linked program into <rootfs> at <path>, with the shared
# libraries ldd names, at the paths they have on this machine (the images run
# on the machine that built them).
add_program() { # <rootfs> <program> <path in image>
    local rootfs=$1 program=$2 path=$3 lib
    install -D -m 755 "$program" "$rootfs$path"
    for lib in $(ldd "$program" 2>/dev/null | grep -o '/[^ ]*' | sort -u); do
        [ -e "$rootfs$lib" ] || install -D -m 755 "$(readlink -f "$lib")" "$rootfs$lib"
    done
}

# busybox (Debian's static build) with its applets linked under /bin.
add_busybox() { # <rootfs>
    local rootfs=$1 applet
    [ -x /bin/busybox ] || die "busybox-static is not installed (apt-get install busybox-static)"
    install -D -m 755 /bin/busybox "$rootfs/bin/busybox"
    for applet in $(/bin/busybox --list); do
        [ -e "$rootfs/bin/$applet" ] || ln -s busybox "$rootfs/bin/$applet"
    done
    mkdir -p "$rootfs/tmp" "$rootfs/etc"
    chmod 1777 "$rootfs/tmp"
    printf 'root:x:0:0:root:/root:/bin/sh\nnonroot:x:65532:65532:nonroot:/home/nonroot:/bin/sh\n' >"$rootfs/etc/passwd"
    printf 'root:x:0:\nnonroot:x:65532:\n' >"$rootfs/etc/group"
}

# The sandbox image containerd pins (our own pause program).
pause_archive() { # <out.tar> <name>
    local rootfs
    rootfs="$(mktemp -d)"
    gcc -static -O2 -o "$rootfs/pause" "$CLUSTER_DIR/images/pause.c"
    strip "$rootfs/pause"
    oci_archive "$1" "$2" "$rootfs" '{"Entrypoint":["/pause"]}'
    rm -rf "$rootfs"
}

busybox_archive() { # <out.tar> <name>
    local rootfs
    rootfs="$(mktemp -d)"
    add_busybox "$rootfs"
    oci_archive "$1" "$2" "$rootfs" '{"Cmd":["sh"],"Env":["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]}'
    rm -rf "$rootfs"
}

# The kubelet plugin with the fake NVML library and its machine profiles, and a
# shell for the fake driver's scripts (nvidia-smi and friends are `sh` scripts).
plugin_archive() { # <out.tar> <name> <plugin binary> <libnvidia-ml.so>
    local rootfs
    rootfs="$(mktemp -d)"
    add_busybox "$rootfs"
    add_program "$rootfs" "$3" /usr/bin/gpu-kubelet-plugin
    install -D -m 755 "$4" "$rootfs/opt/mock-nvml/libnvidia-ml.so.1"
    mkdir -p "$rootfs/opt/mock-nvml/profiles"
    cp "$REPO_ROOT"/hack/mock-nvml/profiles/*.yaml "$rootfs/opt/mock-nvml/profiles/"
    oci_archive "$1" "$2" "$rootfs" \
        '{"Entrypoint":["/usr/bin/gpu-kubelet-plugin"],"Env":["PATH=/usr/sbin:/usr/bin:/sbin:/bin","MALLOC_ARENA_MAX=1"]}'
    rm -rf "$rootfs"
}

controller_archive() { # <out.tar> <name> <controller binary>
    local rootfs
    rootfs="$(mktemp -d)"
    add_program "$rootfs" "$3" /usr/bin/gpu-dra-controller
    mkdir -p "$rootfs/tmp" "$rootfs/etc"
    printf 'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$rootfs/etc/passwd"
    oci_archive "$1" "$2" "$rootfs" \
        '{"Entrypoint":["/usr/bin/gpu-dra-controller"],"User":"65532:65532","ExposedPorts":{"8443/tcp":{}}}'
    rm -rf "$rootfs"
}

# Imports image <name> into containerd's k8s.io namespace unless it is there,
# from the archive <builder> writes (called with <args...> <out.tar> <name>).
# --pinned: kubelet's image GC never removes it.
import_image() { # [--pinned] <name> <builder> [<args>...]
    local label=() name tar_file
    if [ "$1" = --pinned ]; then
        label=(--label io.cri-containerd.pinned=pinned)
        shift
    fi
    name=$1
    shift
    if ctr_k8s images ls -q | grep -qx "$name"; then
        log "image $name is there"
        return
    fi
    tar_file="$(mktemp --suffix .tar)"
    "$@" "$tar_file" "$name"
    ctr_k8s images import "${label[@]}" "$tar_file" >/dev/null
    rm -f "$tar_file"
    log "imported $name"
}
