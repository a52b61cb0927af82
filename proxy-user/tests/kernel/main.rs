//! The kernel programs under test, in one test binary (one build and one
//! link instead of one per file; `cargo xtask test` still runs each module
//! as a job of its own). Each module's comment says what it covers; most
//! need root (CAP_BPF, BPF_PROG_TEST_RUN) and say so when they fail without
//! it. `support` is the harness they share.
//!
//! One module: `cargo test --release -p proxy-user --test kernel datapath::`.
mod support;

mod collector6;
mod datapath;
mod datapath_conntrack;
mod datapath_frag;
mod datapath_fuzz;
mod datapath_reject;
mod datapath_uplink;
mod growth;
mod prefilter;
mod schedulers;
mod sock6;
mod sync_kernel;
mod trace;
