# syntax=docker/dockerfile:1
# Multi-stage build of aws-cloud-controller-manager (`make image`).
# Build stage: `make release`, the same command a developer or CI runs
# outside Docker (cargo build --release --locked). Run stage: distroless
# (glibc + CA certificates, no shell, no package manager) as UID 65532.
# The image also holds the kubelet's /ecr-credential-provider (`make
# release-ecr`); it runs on nodes, not in this container: a node gets it with
# `/ecr-credential-provider --install-to <host dir>` from a DaemonSet's init
# container, or by copying it out of the image when the node image is built
# (docs/ecr-credential-provider.md).
# scripts/check-dockerfile.sh checks these promises in CI.
#
# Both bases are pinned by digest (tag for humans, digest for the bytes):
# a tag moves when its image is rebuilt. No registry is reachable from the
# development machines, so neither digest could be pulled or checked here;
# each is the multi-platform index digest that public sources record for the
# tag: rust:1.95-bookworm's in a BuildKit log resolving the tag
# ("FROM docker.io/library/rust:1.95-bookworm@sha256:6258...") and in
# several public Dockerfiles and build scripts pinning that tag;
# distroless cc-debian12:nonroot's in many public Dockerfiles pinning that
# tag, one noting it as the multi-platform index reviewed 2026-10-08. To
# move a pin: `docker buildx imagetools inspect <image:tag>` prints the
# digest to paste.

FROM rust:1.95-bookworm@sha256:6258907abe69656e41cd992e0b705cdcfabcbbe3db374f92ed2d47121282d4a1 AS build
WORKDIR /src
ENV CARGO_TARGET_DIR=/src/target
COPY Cargo.toml Cargo.lock Makefile ./
# The workspace: the product crate and the test tools' crate (cargo needs
# every member's manifest; the release build compiles only the product).
COPY crates ./crates
# Cache mounts keep the registry and target dir between builds, so a source
# edit does not rebuild the AWS SDK crates.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    make release release-ecr \
    && cp /src/target/release/aws-cloud-controller-manager /aws-cloud-controller-manager \
    && cp /src/target/release/ecr-credential-provider /ecr-credential-provider

# glibc 2.36 like the build stage's bookworm; nonroot is UID/GID 65532.
FROM gcr.io/distroless/cc-debian12:nonroot@sha256:9dac0a79194e45a7da0158a9c6da57b217585af0786db3845d1f0ec1a0dd182f
COPY --from=build /aws-cloud-controller-manager /usr/local/bin/aws-cloud-controller-manager
COPY --from=build /ecr-credential-provider /ecr-credential-provider
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/aws-cloud-controller-manager"]
