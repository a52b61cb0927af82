//! The agent's own services on the node.
pub mod health;
pub mod healthcheck;
pub mod lock;
pub mod memory;
pub mod metrics;
pub mod status;
pub mod verify;
