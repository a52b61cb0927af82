//! Build, demo and test orchestration for switchboard (`cargo xtask ...`).
//!
//! The library half is shared by the `xtask` binary and the netns end-to-end
//! tests in `xtask/tests/e2e/e2e.rs`. The modules behind the `harness`
//! feature (see Cargo.toml) are those only the tests, benchmarks, soak and
//! image use.

#[cfg(feature = "harness")]
pub mod bench;
pub mod build;
pub mod demo;
pub mod docs;
#[cfg(feature = "harness")]
pub mod fake_apiserver;
#[cfg(feature = "harness")]
pub mod image;
pub mod import_cycles;
pub mod kernel_shape;
pub mod sandbox;
pub mod setup;
#[cfg(feature = "harness")]
pub mod soak;
pub mod testcmd;
pub mod testenv;
pub mod testrun;
pub mod util;
