//! Churn under traffic, the short CI version of `cargo xtask soak`: 1,000
//! Service and EndpointSlice changes per second from the fake API server
//! for 10 s (after 3 s of warm-up) while a client in a pod namespace keeps
//! connecting to a Service that does not change. No connection may fail,
//! the agent's RSS after the churn stays within its warm-up figure plus a
//! margin, the maps converge to the API server's final state and
//! `switchboard verify` passes. Root only; run by `cargo xtask test`.
use std::time::Duration;

use xtask::soak::{self, ChurnOptions};
use xtask::testenv::{sb_echo, switchboard};

#[test]
fn churn_at_1000_changes_per_second_fails_no_request_and_leaves_exact_maps() {
    xtask::testenv::require_root();
    let rate = 1000;
    let report = soak::run(&ChurnOptions {
        warmup: Duration::from_secs(3),
        churn: Duration::from_secs(10),
        rate,
        services: 1000,
        faults: false,
        switchboard: switchboard(),
        sb_echo: sb_echo(),
    })
    .expect("churn run");
    eprint!("{}", report.render());
    let failures = report.failures(rate);
    assert!(
        failures.is_empty(),
        "{}\n{}",
        failures.join("\n"),
        report.render()
    );
}
