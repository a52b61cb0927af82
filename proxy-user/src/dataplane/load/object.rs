//! Loading the eBPF object (the bytes the `switchboard` binary embeds from
//! `proxy-object`) with its maps pinned under the pin root.
//!
//! Maps are pinned by name (`<pin root>/<MAP NAME>`). A pinned map that already
//! exists is reused rather than recreated, so a restarted agent keeps the
//! frontends, backends and connection-tracking state the kernel is using.
use std::{
    io,
    path::{Path, PathBuf},
};

use aya::{
    maps::{MapData, ProgramArray},
    programs::{Program, ProgramError},
    Ebpf, EbpfError, EbpfLoader,
};
use proxy_common::{names, prefilter, programs, tail};

use crate::{
    dataplane::{
        load::ip_summed::{self, Access},
        pins::growth::FlowSizes,
        pins::resize::CapacityMismatch,
        pins::Pins,
    },
    sync::store::Capacities,
};

/// Filesystem magic of bpffs (`BPF_FS_MAGIC` in linux/magic.h).
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("this switchboard binary was built without its eBPF object (bpf-linker was missing); run `cargo xtask setup` and rebuild")]
    NoObject,
    #[error("cannot create pin root {path}")]
    CreatePinRoot { path: PathBuf, source: io::Error },
    #[error("pin root {path} is not on a bpffs: maps pinned there would not outlive this process's mount namespace, and a restart would reset every connection; mount one on the host (`mount -t bpf bpf /sys/fs/bpf`; the DaemonSet's init container does) or point --pin-root at one")]
    NotBpffs { path: PathBuf },
    #[error("cannot check the filesystem of pin root {path}")]
    Statfs { path: PathBuf, source: nix::Error },
    #[error("loading the eBPF object with maps pinned under {pin_root}")]
    Load {
        pin_root: PathBuf,
        source: Box<EbpfError>,
    },
    #[error("program {name} is missing from the eBPF object")]
    MissingProgram { name: &'static str },
    #[error("map {name} is missing from the eBPF object")]
    MissingMap { name: &'static str },
    #[error("filling the tail-call program array")]
    TailCalls { source: aya::maps::MapError },
    #[error("patching the eBPF object for the kernel's sk_buff")]
    Patch {
        source: crate::dataplane::load::ip_summed::KctxError,
    },
    #[error("loading program {name} into the kernel")]
    Program {
        name: &'static str,
        source: ProgramError,
    },
}

/// Makes sure `pin_root` exists on a bpffs. A plain directory is refused
/// rather than mounted over: a bpffs mounted by the agent lives in the agent's
/// mount namespace (under `ip netns exec` or in a container, a private one)
/// and vanishes with it, taking every pin, so the next agent would start
/// from empty maps and reset every connection.
pub fn check_pin_root(pin_root: &Path) -> Result<(), LoadError> {
    // Judge the directory, or the nearest one that exists: nothing is
    // created outside a bpffs.
    let existing = pin_root
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"));
    let stat = nix::sys::statfs::statfs(existing).map_err(|source| LoadError::Statfs {
        path: existing.to_owned(),
        source,
    })?;
    if stat.filesystem_type().0 as i64 != BPF_FS_MAGIC {
        return Err(LoadError::NotBpffs {
            path: pin_root.to_owned(),
        });
    }
    // Only root may add or remove pins, whatever the umask.
    crate::util::fsmode::ensure_dir(
        pin_root,
        crate::util::fsmode::PIN_DIR_MODE,
        crate::util::fsmode::Existing::Tighten,
    )
    .map_err(|source| LoadError::CreatePinRoot {
        path: pin_root.to_owned(),
        source,
    })
}

/// The resizable maps: name, the flag that sizes it, and its wanted size.
/// The flow tables that grow ([`growth::TABLES`]) are sized by `flows`;
/// each IPv6 twin of the others is sized by the same flag as its IPv4 map.
/// The frontend bitmap grows with the frontend map, so that few
/// destinations that are no frontend share a bit with one.
fn sized_maps(caps: &Capacities, flows: &FlowSizes) -> Vec<(&'static str, &'static str, u32)> {
    let mut sized = vec![
        (names::FRONTENDS, "--max-frontend-entries", caps.frontends),
        (
            names::FRONTEND_FILTER,
            "--max-frontend-entries",
            caps.frontend_filter_words(),
        ),
        (names::BACKENDS, "--max-backends", caps.backends),
        (names::CONNTRACK, "--max-conntrack", caps.conntrack),
        (names::REVNAT, "--max-services", caps.services),
        (
            names::SERVICE_STATS,
            "--max-services",
            caps.service_stats_entries(),
        ),
        (
            names::SERVICE_DENIED,
            "--max-services",
            caps.service_stats_entries(),
        ),
        (names::FRONTENDS6, "--max-frontend-entries", caps.frontends),
        (names::BACKENDS6, "--max-backends", caps.backends),
        (names::CONNTRACK6, "--max-conntrack", caps.conntrack),
        (names::REVNAT6, "--max-services", caps.services),
    ];
    sized.extend(flows.iter().map(|(table, size)| (table.map, GROWTH, size)));
    sized
}

/// What sizes the flow tables that grow.
const GROWTH: &str = "its load (--flow-table-start-entries and its maximum)";

/// The pinned maps the object allocates per entry (`BPF_F_NO_PREALLOC`),
/// among the resizable ones: one pinned without the flag is recreated with
/// it, online, like a map of another size.
pub const PER_ENTRY: [&str; 8] = [
    names::FRONTENDS,
    names::BACKENDS,
    names::CONNTRACK,
    names::REVNAT,
    names::FRONTENDS6,
    names::BACKENDS6,
    names::CONNTRACK6,
    names::REVNAT6,
];

/// `BPF_F_NO_PREALLOC` from linux/bpf.h.
pub const BPF_F_NO_PREALLOC: u32 = 1;

/// The maps pinned under `pin_root` whose size differs from `caps` and
/// `flows`, or that are preallocated where the object allocates per entry
/// (aya would reuse them as they are).
pub fn capacity_mismatches(
    pin_root: &Path,
    caps: &Capacities,
    flows: &FlowSizes,
) -> Vec<CapacityMismatch> {
    sized_maps(caps, flows)
        .into_iter()
        .filter_map(|(map, flag, wanted)| {
            let info = Pins::new(pin_root).data(map).ok()?.info().ok()?;
            let pinned = info.max_entries();
            let preallocated =
                PER_ENTRY.contains(&map) && info.map_flags() & BPF_F_NO_PREALLOC == 0;
            (pinned != wanted || preallocated).then_some(CapacityMismatch {
                map,
                flag,
                pinned,
                wanted,
                preallocated,
            })
        })
        .collect()
}

/// Loads `object`: maps pinned (or reused) under `pin_root`, the tc, XDP and
/// socket-layer programs loaded into the kernel (not yet attached).
///
/// Nothing the running data path uses changes: maps are created or adopted
/// but not written, and the tail-call slots still hold the running agent's
/// IPv6 uplink programs until [`install_tail_calls`] (called right before
/// the programs are attached).
///
/// The maps named in `staged` are created fresh at their staging pins
/// ([`crate::dataplane::pins::resize::staging_path`]) instead of adopted: they are being
/// resized.
pub fn load(
    object: &[u8],
    pin_root: &Path,
    caps: &Capacities,
    flows: &FlowSizes,
    staged: &[&'static str],
) -> Result<Loaded, LoadError> {
    check_pin_root(pin_root)?;
    load_with(object, Some((pin_root, staged)), caps, flows)
}

/// A loaded object, and how its programs update L4 checksums.
pub struct Loaded {
    pub ebpf: Ebpf,
    pub checksums: Access,
}

/// Loads `object` with private, unpinned maps (packet fixtures,
/// benchmarks), tail calls installed; the flow tables at their maximum.
pub fn load_unpinned(object: &[u8], caps: &Capacities) -> Result<Ebpf, LoadError> {
    let mut ebpf = load_with(object, None, caps, &FlowSizes::at_max(caps))?.ebpf;
    install_tail_calls(&mut ebpf)?;
    Ok(ebpf)
}

/// [`load_unpinned`] with the checksum state read as `access` says, and no
/// second try (the fixtures of either way).
pub fn load_unpinned_as(
    object: &[u8],
    caps: &Capacities,
    access: &Access,
) -> Result<Ebpf, LoadError> {
    let mut ebpf = load_once(object, None, caps, &FlowSizes::at_max(caps), access)?;
    install_tail_calls(&mut ebpf)?;
    Ok(ebpf)
}

/// [`load_unpinned_as`] with no program loaded yet: each goes in with
/// [`load_unpinned_program`] when it is first used. The kernel's verifier
/// spends seconds on the whole object, most of them on the programs a
/// packet fixture of another hook never runs.
pub fn load_unpinned_maps_as(
    object: &[u8],
    caps: &Capacities,
    access: &Access,
) -> Result<Ebpf, LoadError> {
    create_maps(object, None, caps, &FlowSizes::at_max(caps), access)
}

/// Loads program `name` of an object from [`load_unpinned_maps_as`], unless
/// it is loaded already; an uplink program together with the IPv6 program
/// it tail-calls, the tail call installed.
pub fn load_unpinned_program(ebpf: &mut Ebpf, name: &'static str) -> Result<(), LoadError> {
    load_program(ebpf, name)?;
    for call in TAIL_CALLS.iter().filter(|call| call.caller == name) {
        load_program(ebpf, call.program)?;
        install_tail_call(ebpf, call)?;
    }
    Ok(())
}

/// [`load_once`] with the checksum state read through the kfunc where the
/// kernel has it; a program the kernel refuses that way is loaded again
/// with the checksum helper (said at warning level), before giving up.
fn load_with(
    object: &[u8],
    pins_at: Option<(&Path, &[&'static str])>,
    caps: &Capacities,
    flows: &FlowSizes,
) -> Result<Loaded, LoadError> {
    let access = Access::detect();
    let (ebpf, checksums) = match load_once(object, pins_at, caps, flows, &access) {
        Err(LoadError::Program { name, source }) if access != Access::Helper => {
            tracing::warn!(
                program = name,
                error = %source,
                "the kernel refused the in-place checksum update; loading with the checksum helper"
            );
            (
                load_once(object, pins_at, caps, flows, &Access::Helper)?,
                Access::Helper,
            )
        }
        loaded => (loaded?, access),
    };
    Ok(Loaded { ebpf, checksums })
}

/// Whether the running kernel lets XDP programs call `bpf_xdp_adjust_meta`,
/// through which `sb_xdp_uplink` tells tc which direct-server-return
/// arrivals it tracked. Some hardened kernels refuse that helper to XDP;
/// there the program leaves those packets to tc (said at info level), and
/// everything else stays at the driver. A probe that fails outright counts
/// as a refusal: the object then still loads wherever XDP loads at all.
/// Probed once per process.
pub fn xdp_metadata_supported() -> bool {
    static SUPPORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SUPPORTED.get_or_init(probe_xdp_metadata)
}

fn probe_xdp_metadata() -> bool {
    use aya::{programs::ProgramType, sys::BpfHelper};
    match aya::sys::is_helper_supported(ProgramType::Xdp, BpfHelper::BPF_FUNC_xdp_adjust_meta) {
        Ok(true) => true,
        Ok(false) => {
            tracing::info!(
                "the kernel refuses bpf_xdp_adjust_meta to XDP programs: packets carrying the direct-server-return option are tracked by tc alone"
            );
            false
        }
        Err(error) => {
            tracing::warn!(%error, "probing bpf_xdp_adjust_meta for XDP failed; loading as if the kernel refused it");
            false
        }
    }
}

/// Loads `object` once, its checksum markers patched for `access`
/// ([`crate::dataplane::load::ip_summed`]).
fn load_once(
    object: &[u8],
    pins_at: Option<(&Path, &[&'static str])>,
    caps: &Capacities,
    flows: &FlowSizes,
    access: &Access,
) -> Result<Ebpf, LoadError> {
    let mut ebpf = create_maps(object, pins_at, caps, flows, access)?;
    let socket_layer = programs::SOCKET_LB.into_iter();
    for name in PACKET_PROGRAMS
        .into_iter()
        .chain(socket_layer)
        .chain([programs::SOCK_RELEASE])
    {
        load_program(&mut ebpf, name)?;
    }
    Ok(ebpf)
}

/// The tc and XDP programs, in the order a load verifies them (the socket
/// layer's follow).
const PACKET_PROGRAMS: [&str; 6] = [
    programs::TC_FROM_POD,
    programs::TC_TO_POD,
    programs::TC_FROM_UPLINK,
    programs::TC_FROM_UPLINK6,
    programs::XDP_UPLINK,
    programs::XDP_UPLINK6,
];

/// Verifies program `name` of `ebpf` and loads it into the kernel, unless
/// it is loaded already.
fn load_program(ebpf: &mut Ebpf, name: &'static str) -> Result<(), LoadError> {
    let program = ebpf
        .program_mut(name)
        .ok_or(LoadError::MissingProgram { name })?;
    if program.fd().is_ok() {
        return Ok(());
    }
    let result = match program {
        Program::SchedClassifier(p) => p.load(),
        Program::Xdp(p) => p.load(),
        Program::CgroupSockAddr(p) => p.load(),
        Program::CgroupSock(p) => p.load(),
        _ => Err(ProgramError::UnexpectedProgramType),
    };
    result.map_err(|source| LoadError::Program { name, source })
}

/// The object's maps created (pinned under `pins_at` when given) and its
/// programs relocated against them, none of them loaded yet.
fn create_maps(
    object: &[u8],
    pins_at: Option<(&Path, &[&'static str])>,
    caps: &Capacities,
    flows: &FlowSizes,
    access: &Access,
) -> Result<Ebpf, LoadError> {
    if object.is_empty() {
        return Err(LoadError::NoObject);
    }
    let patched = ip_summed::patch(object, access).map_err(|source| LoadError::Patch { source })?;
    let pin_root = pins_at.map(|(root, _)| root);
    let pins: Vec<(&str, PathBuf)> = match pins_at {
        Some((root, staged)) => names::ALL
            .iter()
            .map(|name| match staged.contains(name) {
                true => (
                    *name,
                    crate::dataplane::pins::resize::staging_path(root, name),
                ),
                false => (*name, root.join(name)),
            })
            .collect(),
        None => Vec::new(),
    };
    let mut loader = EbpfLoader::new();
    for (name, _, size) in sized_maps(caps, flows) {
        loader.map_max_entries(name, size);
    }
    // Not pinned, so never resized: sized at each load like the maps they
    // are indexed alongside (the open sockets are allocated per entry).
    loader.map_max_entries(names::ROUND_ROBIN, caps.service_stats_entries());
    loader.map_max_entries(names::OPEN_FLOWS, caps.backends);
    loader.map_max_entries(names::OPEN_SOCKETS, caps.conntrack);
    // The programs index the bitmap for the size it is loaded with.
    let shift = prefilter::frontends::shift_for(caps.frontend_filter_words());
    loader.override_global(names::FRONTEND_FILTER_SHIFT, &shift, true);
    let summed_shift = access.shift();
    loader.override_global(proxy_common::ip_summed::SUMMED_SHIFT, &summed_shift, true);
    let xdp_meta = u32::from(xdp_metadata_supported());
    loader.override_global(names::XDP_META, &xdp_meta, true);
    for (name, path) in &pins {
        loader.map_pin_path(name, path.as_path());
    }
    loader
        .load(patched.bytes())
        .map_err(|source| LoadError::Load {
            pin_root: pin_root.map(Path::to_owned).unwrap_or_default(),
            source: Box::new(source),
        })
}

/// A program another one tail-calls: the IPv6 body of an uplink program,
/// in its slot of a tail-call array.
struct TailCall {
    /// The program that calls it.
    caller: &'static str,
    array: &'static str,
    slot: u32,
    program: &'static str,
}

/// Every tail call of the object.
const TAIL_CALLS: [TailCall; 2] = [
    TailCall {
        caller: programs::TC_FROM_UPLINK,
        array: names::TAIL_CALLS6,
        slot: tail::FROM_UPLINK6,
        program: programs::TC_FROM_UPLINK6,
    },
    TailCall {
        caller: programs::XDP_UPLINK,
        array: names::XDP_TAIL_CALLS6,
        slot: tail::XDP_UPLINK6,
        program: programs::XDP_UPLINK6,
    },
];

/// Puts the IPv6 uplink programs in their slots of the tail-call arrays
/// (pinned, so the uplink programs still attached, a running agent's
/// included, call the new ones at once).
pub fn install_tail_calls(ebpf: &mut Ebpf) -> Result<(), LoadError> {
    TAIL_CALLS
        .iter()
        .try_for_each(|call| install_tail_call(ebpf, call))
}

/// Puts `call`'s program, loaded, in its slot.
fn install_tail_call(ebpf: &mut Ebpf, call: &TailCall) -> Result<(), LoadError> {
    let name = call.program;
    let fd = ebpf
        .program(name)
        .ok_or(LoadError::MissingProgram { name })?
        .fd()
        .map_err(|source| LoadError::Program { name, source })?
        .try_clone()
        .map_err(|source| LoadError::TailCalls {
            source: aya::maps::MapError::from(source),
        })?;
    let map = ebpf
        .map_mut(call.array)
        .ok_or(LoadError::MissingMap { name: call.array })?;
    let mut tail: ProgramArray<&mut MapData> =
        ProgramArray::try_from(map).map_err(|source| LoadError::TailCalls { source })?;
    tail.set(call.slot, &fd, 0)
        .map_err(|source| LoadError::TailCalls { source })
}

/// Program `name` of the object as its aya type `T`.
pub fn typed<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut T, LoadError>
where
    &'a mut T: TryFrom<&'a mut Program, Error = ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or(LoadError::MissingProgram { name })?
        .try_into()
        .map_err(|source| LoadError::Program { name, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_ipv6_map_is_sized_like_its_ipv4_twin() {
        let caps = Capacities {
            frontends: 11,
            backends: 22,
            conntrack: 33,
            services: 44,
            flow_start: 5,
        };
        let sized = sized_maps(&caps, &FlowSizes::at_start(&caps, 0));
        let size = |name| {
            sized
                .iter()
                .find(|(n, _, _)| *n == name)
                .map(|(_, flag, size)| (*flag, *size))
        };
        for (v4, v6) in [
            (names::FRONTENDS, names::FRONTENDS6),
            (names::BACKENDS, names::BACKENDS6),
            (names::CONNTRACK, names::CONNTRACK6),
            (names::SOCKETS, names::SOCKETS6),
            (names::REVNAT, names::REVNAT6),
            (names::AFFINITY, names::AFFINITY6),
            (names::FRAGMENTS, names::FRAGMENTS6),
        ] {
            assert!(size(v4).is_some(), "{v4}");
            assert_eq!(size(v4), size(v6), "{v6}");
        }
        assert_eq!(size(names::CONNTRACK6), Some(("--max-conntrack", 33)));
        assert_eq!(size(names::SOCKETS6), Some((GROWTH, 5)));
    }

    #[test]
    fn every_map_allocated_per_entry_is_resizable() {
        let caps = Capacities::default();
        let sized = sized_maps(&caps, &FlowSizes::at_start(&caps, 0));
        for map in PER_ENTRY {
            assert!(sized.iter().any(|(n, _, _)| *n == map), "{map}");
            assert!(
                crate::dataplane::pins::growth::TABLES
                    .iter()
                    .all(|t| t.map != map),
                "{map}: an LRU table cannot be allocated per entry"
            );
        }
    }
}
