//! switchboard's userspace: the agent (source → model → sync → maps), the
//! loader and attach logic, and the CLI.
// The agent handles every failure: no unwrap, expect or panic outside tests.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
pub mod agent;
pub mod args;
pub mod attach;
pub mod caps;
pub mod cidr;
pub mod cli;
pub mod conntrack;
pub mod ebpf;
pub mod encode;
pub mod fsmode;
pub mod health;
pub mod healthcheck;
pub mod lock;
pub mod maglev;
pub mod mapbatch;
pub mod maps;
pub mod memory;
pub mod metrics;
pub mod migrate;
pub mod model;
pub mod packet;
pub mod pinroot;
pub mod resize;
pub mod sockdiag;
pub mod socketlb;
pub mod source;
pub mod status;
pub mod sync;
pub mod syncloop;
pub mod uplink;
pub mod verify;

/// How many cases a property test runs: `default` in `cargo test`, or
/// `PROPTEST_CASES` when set (`cargo xtask soak` runs many more).
#[cfg(test)]
fn test_cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(default)
}
