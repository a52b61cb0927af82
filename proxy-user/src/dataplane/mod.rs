//! The data plane: everything that talks to the kernel. Loading the
//! programs and pinning their maps, attaching them (pod interfaces,
//! uplinks, the cgroup socket hooks), the pinned maps themselves (opened
//! only through [`pins`]), their resize, growth and migration, the conntrack
//! collector and socket closing. It implements the sync's `MapStore`.
pub mod attach;
pub mod btf;
pub mod caps;
pub mod conntrack;
pub mod conntrack_entry;
pub mod ctgen;
pub mod ebpf;
pub mod growth;
pub mod kctx;
pub mod kmem;
pub mod mapbatch;
pub mod maps;
pub mod migrate;
pub mod namespaces;
pub mod openflows;
pub mod pinroot;
pub mod pins;
pub mod prefilter;
pub mod quiet;
pub mod readout;
pub mod resize;
pub mod sockdiag;
pub mod socketlb;
pub mod uplink;
