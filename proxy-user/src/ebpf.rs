//! Loading the embedded eBPF object with its maps pinned under the pin root.
//!
//! Maps are pinned by name (`<pin root>/<MAP NAME>`). A pinned map that already
//! exists is reused rather than recreated, so a restarted agent keeps the
//! frontends, backends and connection-tracking state the kernel is using.
use std::{
    fs, io,
    path::{Path, PathBuf},
};

use aya::{
    maps::{MapData, ProgramArray},
    programs::{CgroupSock, CgroupSockAddr, Program, ProgramError, SchedClassifier, Xdp},
    Ebpf, EbpfError, EbpfLoader,
};
use proxy_common::{capacity, names, programs, tail};
use tracing::info;

/// The eBPF object built from `proxy-ebpf` by `build.rs` (empty when built
/// without bpf-linker).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/switchboard"));

/// Filesystem magic of bpffs (`BPF_FS_MAGIC` in linux/magic.h).
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("this switchboard binary was built without its eBPF object (bpf-linker was missing); run `cargo xtask setup` and rebuild")]
    NoObject,
    #[error("cannot create pin root {path}")]
    CreatePinRoot { path: PathBuf, source: io::Error },
    #[error("cannot mount bpffs on pin root {path}")]
    MountBpffs { path: PathBuf, source: nix::Error },
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
    #[error("loading program {name} into the kernel")]
    Program {
        name: &'static str,
        source: ProgramError,
    },
}

/// How many entries each map holds. Pinned maps keep the capacity they were
/// created with; a changed capacity takes effect once the pins are removed.
#[derive(Clone, Copy, Debug)]
pub struct Capacities {
    pub frontends: u32,
    pub backends: u32,
    pub conntrack: u32,
    pub services: u32,
}

impl Default for Capacities {
    fn default() -> Self {
        Self {
            frontends: capacity::FRONTENDS,
            backends: capacity::BACKENDS,
            conntrack: capacity::CONNTRACK,
            services: capacity::SERVICES,
        }
    }
}

/// Makes sure `pin_root` exists and is on a bpffs, mounting one there if not.
pub fn ensure_bpffs(pin_root: &Path) -> Result<(), LoadError> {
    fs::create_dir_all(pin_root).map_err(|source| LoadError::CreatePinRoot {
        path: pin_root.to_owned(),
        source,
    })?;
    let stat = nix::sys::statfs::statfs(pin_root).map_err(|source| LoadError::Statfs {
        path: pin_root.to_owned(),
        source,
    })?;
    if stat.filesystem_type().0 as i64 == BPF_FS_MAGIC {
        return Ok(());
    }
    info!(pin_root = %pin_root.display(), "mounting bpffs on the pin root");
    nix::mount::mount(
        Some("bpf"),
        pin_root,
        Some("bpf"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|source| LoadError::MountBpffs {
        path: pin_root.to_owned(),
        source,
    })
}

/// Loads the object: maps pinned (or reused) under `pin_root`, the tc, XDP and
/// socket-layer programs loaded into the kernel (not yet attached).
pub fn load(pin_root: &Path, caps: &Capacities) -> Result<Ebpf, LoadError> {
    ensure_bpffs(pin_root)?;
    load_with(Some(pin_root), caps)
}

/// Loads the object with private, unpinned maps (packet fixtures, benchmarks).
pub fn load_unpinned(caps: &Capacities) -> Result<Ebpf, LoadError> {
    load_with(None, caps)
}

fn load_with(pin_root: Option<&Path>, caps: &Capacities) -> Result<Ebpf, LoadError> {
    if OBJECT.is_empty() {
        return Err(LoadError::NoObject);
    }
    let pins: Vec<(&str, PathBuf)> = match pin_root {
        Some(root) => names::ALL
            .iter()
            .map(|name| (*name, root.join(name)))
            .collect(),
        None => Vec::new(),
    };
    let mut loader = EbpfLoader::new();
    loader
        .map_max_entries(names::FRONTENDS, caps.frontends)
        .map_max_entries(names::BACKENDS, caps.backends)
        .map_max_entries(names::CONNTRACK, caps.conntrack)
        // One socket-layer entry per balanced socket: sized like conntrack.
        .map_max_entries(names::SOCKETS, caps.conntrack)
        .map_max_entries(names::REVNAT, caps.services)
        .map_max_entries(names::SERVICE_STATS, caps.services);
    for (name, path) in &pins {
        loader.map_pin_path(name, path.as_path());
    }
    let mut ebpf = loader.load(OBJECT).map_err(|source| LoadError::Load {
        pin_root: pin_root.map(Path::to_owned).unwrap_or_default(),
        source: Box::new(source),
    })?;
    for name in [
        programs::TC_FROM_POD,
        programs::TC_TO_POD,
        programs::TC_REWRITE,
        programs::TC_FROM_UPLINK,
    ] {
        let result = typed::<SchedClassifier>(&mut ebpf, name)?.load();
        result.map_err(|source| LoadError::Program { name, source })?;
    }
    install_tail_calls(&mut ebpf)?;
    let name = programs::XDP_UPLINK;
    let result = typed::<Xdp>(&mut ebpf, name)?.load();
    result.map_err(|source| LoadError::Program { name, source })?;
    for name in programs::SOCKET_LB {
        let result = typed::<CgroupSockAddr>(&mut ebpf, name)?.load();
        result.map_err(|source| LoadError::Program { name, source })?;
    }
    let name = programs::SOCK_RELEASE;
    let result = typed::<CgroupSock>(&mut ebpf, name)?.load();
    result.map_err(|source| LoadError::Program { name, source })?;
    Ok(ebpf)
}

/// Puts `sb_rewrite` in its slot of the tail-call array (pinned, so an
/// earlier agent's programs, still attached, call the new one at once).
fn install_tail_calls(ebpf: &mut Ebpf) -> Result<(), LoadError> {
    let name = programs::TC_REWRITE;
    let fd = typed::<SchedClassifier>(ebpf, name)?
        .fd()
        .map_err(|source| LoadError::Program { name, source })?
        .try_clone()
        .map_err(|source| LoadError::TailCalls {
            source: aya::maps::MapError::from(source),
        })?;
    let map = ebpf
        .map_mut(names::TAIL_CALLS)
        .ok_or(LoadError::MissingMap {
            name: names::TAIL_CALLS,
        })?;
    let mut tail: ProgramArray<&mut MapData> =
        ProgramArray::try_from(map).map_err(|source| LoadError::TailCalls { source })?;
    tail.set(tail::REWRITE, &fd, 0)
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
