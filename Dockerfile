# syntax=docker/dockerfile:1
# Multi-stage build of aws-cloud-controller-manager (`make image`).
# Build stage: `make release`, the same command a developer or CI runs
# outside Docker (cargo build --release --locked). Run stage: distroless
# (glibc + CA certificates, no shell, no package manager) as UID 65532.
# scripts/check-dockerfile.sh checks these promises in CI.

FROM rust:1.95-bookworm AS build
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
    make release \
    && cp /src/target/release/aws-cloud-controller-manager /aws-cloud-controller-manager

# glibc 2.36 like the build stage's bookworm; nonroot is UID/GID 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /aws-cloud-controller-manager /usr/local/bin/aws-cloud-controller-manager
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/aws-cloud-controller-manager"]
