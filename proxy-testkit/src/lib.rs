//! Test and benchmark support for switchboard, kept out of the shipped
//! binary: proxy-user's kernel fixture tests and `sb_bench` use it as a
//! dev-dependency.
pub mod packet;
