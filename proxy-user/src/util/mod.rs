//! Helpers shared by layers that do not otherwise meet.
pub mod fsmode;
