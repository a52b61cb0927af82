//! The data plane: everything that talks to the kernel.
pub mod attach;
pub mod caps;
pub mod conntrack;
pub mod ebpf;
pub mod mapbatch;
pub mod maps;
pub mod migrate;
pub mod pinroot;
pub mod pins;
pub mod readout;
pub mod resize;
pub mod sockdiag;
pub mod socketlb;
pub mod uplink;
