//! The agent's own services on the node: the pin-root lock, the status
//! file, `/healthz`, `/metrics`, the `healthCheckNodePort` servers, the
//! `verify` socket and the live trace it serves, and malloc tuning.
pub mod health;
pub mod healthcheck;
pub mod lock;
pub mod memory;
pub mod metrics;
pub mod status;
pub mod trace;
pub mod verify;
