# syntax=docker/dockerfile:1
# Multi-stage build of aws-cloud-controller-manager.
# Build stage: the same `cargo build --release --locked` CI checks; run stage:
# distroless (glibc + CA certificates, no shell) as UID 65532.

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
COPY tests ./tests
# Cache mounts keep the registry and target dir between builds, so a source
# edit does not rebuild the AWS SDK crates.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin aws-cloud-controller-manager \
    && cp target/release/aws-cloud-controller-manager /aws-cloud-controller-manager

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /aws-cloud-controller-manager /usr/local/bin/aws-cloud-controller-manager
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/aws-cloud-controller-manager"]
