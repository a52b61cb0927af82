//! Helpers shared by layers that do not otherwise meet.
pub mod btree;
pub mod clock;
pub mod cores;
pub mod fsmode;
pub mod heap;
pub mod malloc;
#[cfg(test)]
pub(crate) mod txtar;
