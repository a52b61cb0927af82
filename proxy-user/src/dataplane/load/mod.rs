//! Loading the eBPF object the `switchboard` binary embeds: its maps pinned
//! under the pin root ([`object`]), the facts of the running kernel the loader
//! reads from its BTF ([`btf`], [`ip_summed`]), and the permission errors a
//! load or attach can meet ([`caps`]).
pub mod btf;
pub mod caps;
pub mod ip_summed;
pub mod object;
