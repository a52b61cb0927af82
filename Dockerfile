# The switchboard image, for machines with Docker (or any Dockerfile builder):
#
#   docker build -t switchboard:0.1.0 .
#
# `cargo xtask image` builds an equivalent image without a container engine
# (see docs/install.md, "Building the image"). This file is not run by CI.

# --- build: the toolchains `cargo xtask setup` installs -----------------------
# Stable builds the agent; the eBPF programs are built by proxy-object/build.rs
# with `cargo +nightly` (rust-src for build-std) and linked by bpf-linker
# 0.10.4, which uses the LLVM of the Rust toolchain it is built with. If a
# newer nightly than the one this repository was tested with (1.97,
# 2026-05) fails to build proxy-ebpf, pin the stable and nightly releases of
# that time.
FROM rust:1.95-bookworm AS build
RUN rustup toolchain install nightly --profile minimal --component rust-src \
 && cargo install bpf-linker --version 0.10.4 --locked
WORKDIR /src
COPY . .
RUN cargo build --release -p switchboard --bin switchboard \
 && install -D -m 0755 target/release/switchboard /out/switchboard

# --- runtime -------------------------------------------------------------------
# debian-slim has what the binary links against (glibc, libgcc) and what the
# DaemonSet's bpffs init step runs (sh, grep, mount).
FROM debian:bookworm-slim
COPY --from=build /out/switchboard /usr/local/bin/switchboard
LABEL org.opencontainers.image.title="switchboard" \
      org.opencontainers.image.description="eBPF Service load balancer (kube-proxy replacement)" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="MIT OR Apache-2.0"
ENTRYPOINT ["/usr/local/bin/switchboard"]
