//! How the running agent shows itself to operators and load balancers: the
//! pin-root lock that says which agent runs, the status file, `/healthz`,
//! `/metrics`, the `healthCheckNodePort` servers, the `verify` socket and the
//! live trace it serves.
pub mod health;
pub mod healthcheck;
pub mod lock;
pub mod metrics;
pub mod status;
pub mod trace;
pub mod verify;
