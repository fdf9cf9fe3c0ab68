# rolegate: multi-stage build, small non-root runtime image.
#
#   docker build -t rolegate .
#   docker run -v $PWD/rolegate.yaml:/etc/rolegate/rolegate.yaml:ro -p 8080:8080 -p 9090:9090 rolegate
#
# The config is read from /etc/rolegate/rolegate.yaml. In a container, set
# `listen: 0.0.0.0:8080`, `admin_listen: 0.0.0.0:9090` and `instance.advertise`
# to the address other instances reach this one at.

FROM rust:1-bookworm AS build
# protoc for the etcd client.
RUN apt-get update && apt-get install -y --no-install-recommends protobuf-compiler libprotobuf-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Dependencies first, so source edits do not rebuild them.
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src examples && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && printf 'fn main() {}\n' > examples/axum_app.rs \
    && cargo build --release --locked --features redis,etcd,otel 2>/dev/null || true
COPY src ./src
COPY examples ./examples
COPY docs ./docs
RUN touch src/main.rs src/lib.rs && cargo build --release --locked --features redis,etcd,otel --bin rolegate

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /var/lib/rolegate --create-home rolegate \
    && mkdir -p /etc/rolegate
COPY --from=build /src/target/release/rolegate /usr/local/bin/rolegate
COPY config.example.yaml /etc/rolegate/config.example.yaml
USER rolegate
WORKDIR /var/lib/rolegate
EXPOSE 8080 9090
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["rolegate", "probe", "http://127.0.0.1:9090/healthz"]
ENTRYPOINT ["rolegate"]
CMD ["run", "--config", "/etc/rolegate/rolegate.yaml"]
