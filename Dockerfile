# syntax=docker/dockerfile:1
# tally: build from source, run on a slim Debian.
#
#   docker build -t tally .
#   docker run --rm tally --help
#
# RocksDB and librdkafka compile from source (about 10 minutes on 2 cores the
# first time); the cache mounts keep the cargo registry and target dir between
# builds (BuildKit, the default builder of current Docker).

FROM rust:1-bookworm AS builder
# libclang: rocksdb's bindgen; clang: builds RocksDB faster than g++
# (scripts/toolchain/); OpenSSL, libcurl (OIDC) and zstd: librdkafka's TLS, SASL
# and codecs. make, gcc/g++, pkg-config and zlib headers are in the base image.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libclang-dev clang libssl-dev libcurl4-openssl-dev libzstd-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin tally \
 && cp target/release/tally /usr/local/bin/tally

FROM debian:bookworm-slim
# libstdc++ (RocksDB) and zlib (librdkafka) are already in the base image; the
# others are what librdkafka and the PostgreSQL TLS connector link.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 libcurl4 libzstd1 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /var/lib/tally --create-home --shell /usr/sbin/nologin tally \
 && install -d -o tally -g tally -m 0700 /var/lib/tally-api
COPY --from=builder /usr/local/bin/tally /usr/local/bin/tally
USER tally
WORKDIR /var/lib/tally
# State (RocksDB) and checkpoints: mount a volume here and point
# TALLY_STATE__DIR / TALLY_CHECKPOINT__DIR into it.
VOLUME ["/var/lib/tally"]
ENTRYPOINT ["tally"]
CMD ["--help"]
