# The image the Kubernetes manifests name (deploy/kubernetes/*.yaml): ghcr.io/gpuledger/gpuledger,
# with `gpuledger` (aggregator, scheduler, CLI) and `gpuledger-exporter` (the node agent, without
# the query engine) in /usr/local/bin.
#
#   docker build -t ghcr.io/gpuledger/gpuledger:0.1.0 .
#
# No image is built on the project's test machines (they have no container runtime); the tests
# check that the manifests name this image and binaries and pass arguments the binaries accept.
FROM rust:1.94-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p gpuledger -p gpuledger-exporter \
    && strip target/release/gpuledger target/release/gpuledger-exporter

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 65532 --no-create-home --shell /usr/sbin/nologin gpuledger
COPY --from=build /src/target/release/gpuledger /src/target/release/gpuledger-exporter /usr/local/bin/
USER 65532
ENTRYPOINT []
CMD ["/usr/local/bin/gpuledger", "--help"]
