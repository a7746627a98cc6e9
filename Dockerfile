# syntax=docker/dockerfile:1
# Images of the GPU DRA driver, one target per program:
#
#   docker build --target gpu-kubelet-plugin -t gpu-kubelet-plugin .
#   docker build --target gpu-dra-controller -t gpu-dra-controller .
#   docker build --target gpu-kubelet-plugin-fake-nvml -t gpu-kubelet-plugin:fake .   # e2e/kind only
#
# Both programs are built once from the locked workspace: the controller in release mode,
# the plugin in the `plugin` profile (release optimized for size: it runs on every GPU
# node, and its code pages are most of its memory; see Cargo.toml). They link
# glibc dynamically: the plugin dlopen()s libnvidia-ml from the host's driver, which a
# static (musl) binary cannot do. So the runtime images are distroless "cc" (glibc,
# libgcc, CA certificates, no shell), on the same Debian release as the build image.

# Debian 12 (bookworm) throughout: the build image's glibc must not be newer than the
# runtime image's (distroless cc-debian12).
ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src
# The whole workspace (see .dockerignore): cargo needs every member's manifest, and
# protoc comes vendored (protoc-bin-vendored), so nothing else is installed.
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --profile plugin -p gpu-kubelet-plugin --locked --bin gpu-kubelet-plugin \
 && cargo build --release --locked -p gpu-dra-controller --bin gpu-dra-controller \
 && mkdir -p /out \
 && cp target/plugin/gpu-kubelet-plugin target/release/gpu-dra-controller /out/

# The fake NVML library (hack/mock-nvml), for clusters without GPUs (e2e/kind).
FROM build AS build-fake-nvml
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p mock-nvml \
 && cp target/release/libnvidia_ml.so /out/libnvidia-ml.so.1

# The kubelet plugin runs as root and privileged (NVML, MIG, device nodes): the chart
# sets that; the image only carries the binary.
FROM gcr.io/distroless/cc-debian12 AS gpu-kubelet-plugin
COPY --from=build /out/gpu-kubelet-plugin /usr/bin/gpu-kubelet-plugin
# One glibc malloc arena (the chart sets it too): see BENCHMARKS.md, memory.
ENV MALLOC_ARENA_MAX=1
ENTRYPOINT ["/usr/bin/gpu-kubelet-plugin"]

# The plugin with the fake libnvidia-ml and its machine profiles, on a Debian base with a
# shell: the stand-in driver programs of e2e/kind (nvidia-smi, nvidia-cuda-mps-control)
# are shell scripts. Select the profile with MOCK_NVML_PROFILE=/opt/mock-nvml/profiles/<name>.yaml
# and --nvml-lib=/opt/mock-nvml/libnvidia-ml.so.1.
FROM debian:bookworm-slim AS gpu-kubelet-plugin-fake-nvml
COPY --from=build /out/gpu-kubelet-plugin /usr/bin/gpu-kubelet-plugin
COPY --from=build-fake-nvml /out/libnvidia-ml.so.1 /opt/mock-nvml/libnvidia-ml.so.1
COPY hack/mock-nvml/profiles/ /opt/mock-nvml/profiles/
ENV MALLOC_ARENA_MAX=1
ENTRYPOINT ["/usr/bin/gpu-kubelet-plugin"]

# The controller needs no privileges: distroless "nonroot" (uid 65532).
FROM gcr.io/distroless/cc-debian12:nonroot AS gpu-dra-controller
COPY --from=build /out/gpu-dra-controller /usr/bin/gpu-dra-controller
USER 65532:65532
EXPOSE 8443
ENTRYPOINT ["/usr/bin/gpu-dra-controller"]
