//! switchboard's userspace: the agent (source → model → sync → maps), the
//! loader and attach logic, and the CLI, grouped by layer. Each layer
//! imports only from the ones below it (bottom first): `util`, `model`,
//! `source`, `sync`, `dataplane`, `observe`, `cli`, then the composition root
//! (`agent`, `args`; the `switchboard` binary's `main.rs` in its own
//! crate). See `docs/layout.md`; the test in `layers.rs` checks the rule.
// The agent handles every failure: no unwrap, expect or panic outside tests.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
pub mod agent;
pub mod args;
pub mod cli;
pub mod dataplane;
pub mod model;
pub mod observe;
pub mod source;
pub mod sync;
pub mod util;

#[cfg(test)]
mod layers;

/// How many cases a property test runs: `default` in `cargo test`, or
/// `PROPTEST_CASES` when set (`cargo xtask soak` runs many more).
#[cfg(test)]
fn test_cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(default)
}
