//! The socket layer's attachment: the four cgroup `sock_addr` programs on the
//! cgroup root, as BPF links pinned under the pin root so they outlive the
//! agent (a restart keeps balancing host clients).
//!
//! A new agent attaches its links first and only then drops the old ones:
//! while both run, the first rewrites a frontend to a backend and the second
//! sees a backend (not a frontend) and leaves it, so no call is missed or
//! translated twice.
use std::{
    fs, io,
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
};

use aya::{
    programs::{
        links::{FdLink, LinkError},
        CgroupAttachMode, CgroupSock, CgroupSockAddr, ProgramError,
    },
    Ebpf,
};
use proxy_common::{names, programs, Config};
use tracing::{debug, info};

/// Directory under the pin root that holds the pinned links.
const LINK_DIR: &str = "links";

#[derive(Debug, thiserror::Error)]
pub enum SocketLbError {
    #[error("reading {path} to find the cgroup2 mount")]
    Mountinfo { path: PathBuf, source: io::Error },
    #[error("no cgroup2 file system is mounted (see /proc/self/mountinfo); pass --cgroup-root or --socket-lb=false")]
    NoCgroup2,
    #[error("opening cgroup {path}")]
    OpenCgroup { path: PathBuf, source: io::Error },
    #[error("program {0} is missing from the loaded object")]
    MissingProgram(&'static str),
    #[error("attaching {program} to cgroup {cgroup}")]
    Attach {
        program: &'static str,
        cgroup: PathBuf,
        source: ProgramError,
    },
    #[error("the kernel attached {program} without a BPF link (needs Linux 5.7+)")]
    NoLink {
        program: &'static str,
        source: LinkError,
    },
    #[error("pinning the link of {program} at {path}")]
    Pin {
        program: &'static str,
        path: PathBuf,
        source: aya::pin::PinError,
    },
    #[error("replacing the pinned link {path}")]
    Replace { path: PathBuf, source: io::Error },
    #[error("creating the link directory {path}")]
    LinkDir { path: PathBuf, source: io::Error },
    #[error("removing the pinned link {path}")]
    Remove { path: PathBuf, source: io::Error },
    #[error("reading this network namespace's cookie (SO_NETNS_COOKIE, Linux 5.14+)")]
    NetnsCookie(#[source] io::Error),
    #[error("opening the socket layer's switch {name}")]
    Switch {
        name: &'static str,
        #[source]
        source: crate::dataplane::maps::TakeError,
    },
    #[error("writing the socket layer's switch {name}")]
    SwitchWrite {
        name: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
}

/// The mount point of the first cgroup2 file system in `mountinfo` text.
pub fn cgroup2_mount_in(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        // `id parent major:minor root mountpoint options... - fstype source opts`
        let (before, after) = line.split_once(" - ")?;
        if after.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let mount_point = before.split_whitespace().nth(4)?;
        Some(PathBuf::from(unescape_mountinfo(mount_point)))
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo` octal.
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            let digits = std::str::from_utf8(&bytes[i + 1..i + 4]).ok();
            if let Some(code) = digits.and_then(|d| u8::from_str_radix(d, 8).ok()) {
                out.push(code);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The host's cgroup2 mount, found in this process's mount table.
pub fn find_cgroup_root() -> Result<PathBuf, SocketLbError> {
    let path = PathBuf::from("/proc/self/mountinfo");
    let text = fs::read_to_string(&path).map_err(|source| SocketLbError::Mountinfo {
        path: path.clone(),
        source,
    })?;
    cgroup2_mount_in(&text).ok_or(SocketLbError::NoCgroup2)
}

/// The data-path configuration for this agent's network namespace.
pub fn datapath_config() -> Result<Config, SocketLbError> {
    Ok(Config {
        host_netns_cookie: netns_cookie().map_err(SocketLbError::NetnsCookie)?,
    })
}

/// The cookie of the current network namespace (what `bpf_get_netns_cookie`
/// returns for a socket created here).
fn netns_cookie() -> io::Result<u64> {
    let socket = std::net::UdpSocket::bind(("127.0.0.1", 0))
        .or_else(|_| std::net::UdpSocket::bind(("0.0.0.0", 0)))?;
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: the fd is a live socket for the duration of the call, and
    // `cookie`/`len` point to a u64 and its size, as SO_NETNS_COOKIE expects.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cookie)
}

fn link_path(pin_root: &Path, program: &str) -> PathBuf {
    pin_root.join(LINK_DIR).join(program)
}

/// Whose sockets the socket layer balances (`--socket-lb-host-namespace-only`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SocketScope {
    /// Every socket in the cgroup: the node's and the pods'.
    #[default]
    Everywhere,
    /// The node's own network namespace only: pods' sockets reach the
    /// frontend unchanged (a service mesh's sidecar sees the ClusterIP) and
    /// the tc layer balances their packets.
    HostNamespace,
}

/// Attaches the socket-layer programs to `cgroup`, balancing the sockets
/// `scope` names, replacing the links an earlier agent pinned under
/// `pin_root`.
pub fn attach(
    ebpf: &mut Ebpf,
    cgroup: &Path,
    pin_root: &Path,
    scope: SocketScope,
) -> Result<(), SocketLbError> {
    let pod_udp = can_enter_pod_namespaces();
    set_pod_udp_at_connect(ebpf, pod_udp)?;
    set_switch(
        ebpf,
        names::HOST_NAMESPACE_ONLY,
        scope == SocketScope::HostNamespace,
    )?;
    attach_links(ebpf, cgroup, pin_root)?;
    info!(
        cgroup = %cgroup.display(),
        ?scope,
        pod_udp_at_connect = pod_udp,
        "socket-layer balancing attached"
    );
    Ok(())
}

/// Attaches every socket-layer program to `cgroup` as a new link and pins
/// it over the earlier one (which is let go only then): what [`attach`]
/// does after writing its switches, and how links found missing are put
/// back.
pub fn attach_links(ebpf: &mut Ebpf, cgroup: &Path, pin_root: &Path) -> Result<(), SocketLbError> {
    let cgroup_dir = fs::File::open(cgroup).map_err(|source| SocketLbError::OpenCgroup {
        path: cgroup.to_owned(),
        source,
    })?;
    let dir = pin_root.join(LINK_DIR);
    crate::util::fsmode::ensure_dir(
        &dir,
        crate::util::fsmode::PIN_DIR_MODE,
        crate::util::fsmode::Existing::Set,
    )
    .map_err(|source| SocketLbError::LinkDir {
        path: dir.clone(),
        source,
    })?;
    for program in all_programs() {
        let link = attach_one(ebpf, program, &cgroup_dir, cgroup)?;
        pin_replacing(link, program, &link_path(pin_root, program))?;
        debug!(program, cgroup = %cgroup.display(), "socket-layer program attached");
    }
    Ok(())
}

/// Whether this agent can close a pod's connected UDP socket whose backend
/// left: entering another network namespace takes CAP_SYS_ADMIN (and
/// finding the pods' processes, the host's PID namespace).
fn can_enter_pod_namespaces() -> bool {
    crate::dataplane::load::caps::own_has(crate::dataplane::load::caps::CAP_SYS_ADMIN)
}

/// Balances pods' connected UDP sockets at `connect()` (`on`), or leaves
/// them to the tc layer, which checks the backend on every datagram: for
/// an agent that could not close them when their backend leaves.
fn set_pod_udp_at_connect(ebpf: &mut Ebpf, on: bool) -> Result<(), SocketLbError> {
    set_switch(ebpf, names::POD_UDP_AT_CONNECT, on)
}

/// Writes the socket layer's switch `name` (a one-word global of the
/// programs) before they are attached.
fn set_switch(ebpf: &mut Ebpf, name: &'static str, on: bool) -> Result<(), SocketLbError> {
    let mut switch: aya::maps::Array<aya::maps::MapData, u64> =
        crate::dataplane::maps::take_map(ebpf, name)
            .map_err(|source| SocketLbError::Switch { name, source })?;
    switch
        .set(0, u64::from(on), 0)
        .map_err(|source| SocketLbError::SwitchWrite { name, source })
}

/// Every socket-layer program: the `sock_addr` hooks of both families and
/// `sock_release` (each pinned as a link under its own name).
pub fn all_programs() -> impl Iterator<Item = &'static str> {
    programs::SOCKET_LB
        .into_iter()
        .chain([programs::SOCK_RELEASE])
}

/// The cgroup hook (`enum bpf_attach_type`) each socket-layer program is
/// attached at: where to look for other programs on the same hook.
pub fn attach_type(program: &str) -> Option<u32> {
    Some(match program {
        programs::SOCK_CONNECT4 => 10,     // BPF_CGROUP_INET4_CONNECT
        programs::SOCK_CONNECT6 => 11,     // BPF_CGROUP_INET6_CONNECT
        programs::SOCK_SENDMSG4 => 14,     // BPF_CGROUP_UDP4_SENDMSG
        programs::SOCK_SENDMSG6 => 15,     // BPF_CGROUP_UDP6_SENDMSG
        programs::SOCK_RECVMSG4 => 19,     // BPF_CGROUP_UDP4_RECVMSG
        programs::SOCK_RECVMSG6 => 20,     // BPF_CGROUP_UDP6_RECVMSG
        programs::SOCK_GETPEERNAME4 => 29, // BPF_CGROUP_INET4_GETPEERNAME
        programs::SOCK_GETPEERNAME6 => 30, // BPF_CGROUP_INET6_GETPEERNAME
        programs::SOCK_RELEASE => 34,      // BPF_CGROUP_INET_SOCK_RELEASE
        _ => return None,
    })
}

/// Attaches one program to the cgroup as a BPF link.
fn attach_one(
    ebpf: &mut Ebpf,
    program: &'static str,
    cgroup_dir: &fs::File,
    cgroup: &Path,
) -> Result<FdLink, SocketLbError> {
    let attach_error = |source| SocketLbError::Attach {
        program,
        cgroup: cgroup.to_owned(),
        source,
    };
    let no_link = |source| SocketLbError::NoLink { program, source };
    let prog = ebpf
        .program_mut(program)
        .ok_or(SocketLbError::MissingProgram(program))?;
    if program == programs::SOCK_RELEASE {
        let prog: &mut CgroupSock = prog.try_into().map_err(attach_error)?;
        let id = prog
            .attach(cgroup_dir, CgroupAttachMode::Single)
            .map_err(attach_error)?;
        FdLink::try_from(prog.take_link(id).map_err(attach_error)?).map_err(no_link)
    } else {
        let prog: &mut CgroupSockAddr = prog.try_into().map_err(attach_error)?;
        let id = prog
            .attach(cgroup_dir, CgroupAttachMode::Single)
            .map_err(attach_error)?;
        FdLink::try_from(prog.take_link(id).map_err(attach_error)?).map_err(no_link)
    }
}

/// Pins `link` at `path`, replacing the link an earlier agent pinned there.
/// Pinned under a temporary name first, then moved over the old pin: the old
/// link is released (and detached) only once ours is attached. The pin keeps
/// the link, and the attachment, alive after we exit.
fn pin_replacing(link: FdLink, program: &'static str, path: &Path) -> Result<(), SocketLbError> {
    // bpffs refuses names with a dot.
    let fresh = path.with_file_name(format!("{program}_new"));
    remove_if_present(&fresh)?;
    let pinned = link.pin(&fresh).map_err(|source| SocketLbError::Pin {
        program,
        path: fresh.clone(),
        source,
    })?;
    fs::rename(&fresh, path).map_err(|source| SocketLbError::Replace {
        path: path.to_owned(),
        source,
    })?;
    drop(pinned);
    Ok(())
}

/// Removes the socket-layer links an earlier agent pinned (`--socket-lb=false`).
/// Returns how many there were.
pub fn detach(pin_root: &Path) -> Result<usize, SocketLbError> {
    let mut removed = 0;
    for program in all_programs() {
        if remove_if_present(&link_path(pin_root, program))? {
            removed += 1;
        }
    }
    if removed > 0 {
        info!(
            removed,
            "socket-layer balancing detached (--socket-lb=false)"
        );
    }
    Ok(removed)
}

fn remove_if_present(path: &Path) -> Result<bool, SocketLbError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(SocketLbError::Remove {
            path: path.to_owned(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_cgroup2_mount_not_cgroup1() {
        let mountinfo = "\
24 31 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
30 24 0:26 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/cpu rw,nosuid shared:10 - cgroup cgroup rw,cpu
32 30 0:28 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:11 - cgroup2 cgroup2 rw,nsdelegate
";
        assert_eq!(
            cgroup2_mount_in(mountinfo),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
    }

    #[test]
    fn every_socket_layer_program_has_its_own_hook() {
        let types: std::collections::BTreeSet<u32> =
            all_programs().filter_map(attach_type).collect();
        assert_eq!(types.len(), all_programs().count());
        assert_eq!(attach_type("sb_to_pod"), None);
    }

    #[test]
    fn no_cgroup2_mount_is_none() {
        let mountinfo = "24 31 0:22 / /sys rw shared:7 - sysfs sysfs rw\n";
        assert_eq!(cgroup2_mount_in(mountinfo), None);
    }

    #[test]
    fn escaped_mount_points_are_unescaped() {
        let mountinfo = "40 30 0:30 / /run/my\\040cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mount_in(mountinfo),
            Some(PathBuf::from("/run/my cgroup"))
        );
    }
}
