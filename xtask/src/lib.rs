//! Build, demo and test orchestration for switchboard (`cargo xtask ...`).
//!
//! The library half is shared by the `xtask` binary and the netns end-to-end
//! tests in `xtask/tests/e2e/e2e.rs`.

pub mod bench;
pub mod build;
pub mod demo;
pub mod docs;
pub mod fake_apiserver;
pub mod image;
pub mod import_cycles;
pub mod kernel_shape;
pub mod sandbox;
pub mod setup;
pub mod soak;
pub mod testcmd;
pub mod testenv;
pub mod testrun;
pub mod util;
