# One image with both binaries: the gateway (`idemgate`, the default command) and the
# example upstream (`order-service`). docker-compose.yml runs the demo stack from it.
#
#     docker build -t idemgate-demo .
#     docker run --rm -p 8080:8080 -v "$PWD/my.toml:/etc/idemgate/gateway.toml:ro" idemgate-demo
#
# A config for a container listens on 0.0.0.0 (see deploy/compose/gateway.toml).

# --- chef: the Rust toolchain plus cargo-chef, shared by the two build stages ----------
FROM rust:1-bookworm AS chef
RUN cargo install cargo-chef --locked
WORKDIR /src

# --- planner: reduce the workspace to its dependency recipe (manifests + lockfile) -----
FROM chef AS planner
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

# --- builder: dependencies first (cached until Cargo.toml/Cargo.lock change), then ours -
FROM chef AS builder
COPY --from=planner /src/recipe.json recipe.json
RUN cargo chef cook --release --locked --recipe-path recipe.json -p idemgate -p order-service
COPY . .
# The release profile ships stripped (Cargo.toml): no strip step here.
RUN cargo build --release --locked -p idemgate -p order-service

# --- runtime ---------------------------------------------------------------------------
FROM debian:bookworm-slim AS runtime
# ca-certificates: the gateway's https upstreams use the system roots.
# curl: the healthchecks in docker-compose.yml.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 idemgate \
    && useradd --system --uid 10001 --gid idemgate --home-dir /data --no-create-home \
        --shell /usr/sbin/nologin idemgate \
    && mkdir -p /data /etc/idemgate \
    && chown idemgate:idemgate /data
COPY --from=builder /src/target/release/idemgate /src/target/release/order-service /usr/local/bin/
# A default config (the compose demo's); mount your own over it.
COPY deploy/compose/gateway.toml /etc/idemgate/gateway.toml
# Writable by the runtime user: the order service's default database, sqlite:orders.db, lands here.
WORKDIR /data
USER 10001:10001
ENV RUST_LOG=info
# 8080: gateway proxy, 9090: gateway admin, 3000: order service.
EXPOSE 8080 9090 3000
STOPSIGNAL SIGTERM
CMD ["idemgate", "--config", "/etc/idemgate/gateway.toml"]
