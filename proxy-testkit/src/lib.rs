//! Test and benchmark support for switchboard, kept out of the shipped
//! binary: proxy-user's kernel fixture tests and `sb_bench` use it as a
//! dev-dependency, xtask's sandboxes and end-to-end tests as a dependency.
//! The one home of the frame builders of both families: [`packet`] (IPv4),
//! [`packet6`] (IPv6), and [`Frame`], what a test written once for both
//! families builds its frames with; of the network namespace helpers,
//! [`netns`]; and of the uplink node the fixtures and benchmarks build,
//! [`node`].
pub mod frame;
pub mod netns;
pub mod node;
pub mod packet;
pub mod packet6;

pub use frame::Frame;
