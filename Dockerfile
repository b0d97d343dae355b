# fleetscope's container image: built with the toolchain named below and the locked
# dependencies, run as a non-root user on a read-only root filesystem (the data
# directory and /tmp are volumes).
#
#   docker build -t fleetscope:dev .
#   docker run --rm -p 50051:50051 fleetscope:dev demo --listen 0.0.0.0:50051

ARG RUST_VERSION=1.95.0

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin fleetscope \
    && install -D target/release/fleetscope /out/fleetscope

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/fleetscope /usr/local/bin/fleetscope
# mimalloc returns freed memory to the system after 1 s instead of at once: faster
# restarts and syncs (see the README).
ENV MIMALLOC_PURGE_DELAY=1000
# distroless's nonroot user.
USER 65532:65532
EXPOSE 50051 9090
ENTRYPOINT ["/usr/local/bin/fleetscope"]
CMD ["serve", "--config", "/etc/fleetscope/config/fleetscope.yaml"]
