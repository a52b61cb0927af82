//! The end-to-end tests, in one test binary (one build and one link instead
//! of one per file; `cargo xtask test` runs each test as a job of its own).
//! Each module's comment says what it covers. The netns tests need root and
//! the binaries `cargo xtask test` builds (`SWITCHBOARD_BIN`, `SB_ECHO_BIN`,
//! `SWITCHBOARD_UPGRADE_BIN`), and fail with a message without them.
//!
//! One module: `cargo test --release -p xtask --test e2e e2e_semantics::`.
mod cluster_agent;
mod cluster_churn;
mod e2e;
mod e2e_conntrack;
mod e2e_dsr;
mod e2e_dualstack;
mod e2e_external;
mod e2e_external6;
mod e2e_frag;
mod e2e_heal;
mod e2e_hostnet;
mod e2e_ipv6;
mod e2e_k3s;
mod e2e_lifecycle;
mod e2e_links;
mod e2e_maglev;
mod e2e_memory;
mod e2e_observe;
mod e2e_ops;
mod e2e_reject;
mod e2e_schedulers;
mod e2e_semantics;
mod e2e_socketlb;
mod e2e_trace;
mod e2e_upgrade;
mod fake_apiserver;
mod image;
