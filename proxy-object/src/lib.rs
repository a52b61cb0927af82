//! The eBPF objects `build.rs` compiled from `proxy-ebpf`, embedded as bytes.
//!
//! Both are empty when the build had no bpf-linker (or `AYA_BUILD_SKIP=1`):
//! `cargo check` and clippy still work, and the agent says what is missing
//! when it tries to load the programs.

/// switchboard's programs (proxy-ebpf's `switchboard` binary).
pub static SWITCHBOARD: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/switchboard"));

/// Empty tc and XDP programs (proxy-ebpf's `sb-empty` binary): the floor the
/// benchmarks measure the programs against.
pub static EMPTY: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sb-empty"));
