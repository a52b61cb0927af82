//! What a pinned BPF link is attached to, and which programs a cgroup
//! hook runs: two bpf(2) queries aya 0.14 does not make (it gives a
//! link's id and program, not its target, and queries no cgroup hook of
//! the socket layer's types).
//!
//! A link can be detached while its pin stays (`bpftool link detach`):
//! the pin then holds a link attached to nothing, which only its target
//! tells apart (a cgroup id or interface index of 0).
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::path::Path;

/// `BPF_OBJ_GET`, `BPF_OBJ_GET_INFO_BY_FD` and `BPF_PROG_QUERY` from
/// `enum bpf_cmd`.
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_PROG_QUERY: libc::c_long = 16;

/// `enum bpf_link_type`: the kinds whose target is read here.
pub const LINK_TYPE_CGROUP: u32 = 3;
pub const LINK_TYPE_XDP: u32 = 6;
pub const LINK_TYPE_TCX: u32 = 11;

/// What a link is attached to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkTarget {
    /// `enum bpf_link_type`.
    pub link_type: u32,
    pub prog_id: u32,
    /// The cgroup id (cgroup links) or interface index (TCX, XDP); 0 once
    /// the link was detached. `None` for other kinds of link.
    pub target: Option<u64>,
}

impl LinkTarget {
    /// Attached to nothing any more (its pin may still be there).
    pub fn detached(&self) -> bool {
        self.target == Some(0)
    }
}

fn bpf(cmd: libc::c_long, attr: *mut u8, size: usize) -> io::Result<libc::c_long> {
    // SAFETY: every caller passes a pointer to a repr(C) `union bpf_attr`
    // member of `size` bytes whose own pointers outlive the call.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr, size) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc)
}

/// The `obj_get` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct ObjGetAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
    path_fd: i32,
    _pad: u32,
}

/// The `info` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// The link pinned at `path` and what it is attached to.
pub fn link_target(path: &Path) -> io::Result<LinkTarget> {
    use std::os::unix::ffi::OsStrExt as _;
    let name = CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut get = ObjGetAttr {
        pathname: name.as_ptr() as u64,
        ..ObjGetAttr::default()
    };
    let fd = bpf(
        BPF_OBJ_GET,
        (&mut get as *mut ObjGetAttr).cast(),
        std::mem::size_of::<ObjGetAttr>(),
    )?;
    // SAFETY: BPF_OBJ_GET returned a new descriptor, ours to close.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // `struct bpf_link_info`: type, id, prog_id, then (8-aligned) the
    // union of per-type targets. Room to spare, zeroed: the kernel
    // accepts a longer buffer whose tail is zero.
    let mut info = [0u64; 32];
    let mut attr = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: std::mem::size_of_val(&info) as u32,
        info: info.as_mut_ptr() as u64,
    };
    bpf(
        BPF_OBJ_GET_INFO_BY_FD,
        (&mut attr as *mut InfoAttr).cast(),
        std::mem::size_of::<InfoAttr>(),
    )?;
    Ok(parse_link_info(&info))
}

/// A `struct bpf_link_info` as the kernel wrote it into `info`.
fn parse_link_info(info: &[u64; 32]) -> LinkTarget {
    let word = |i: usize| info[i / 2].to_ne_bytes();
    let half = |i: usize| {
        let w = word(i);
        let b = if i.is_multiple_of(2) { &w[..4] } else { &w[4..] };
        u32::from_ne_bytes([b[0], b[1], b[2], b[3]])
    };
    let link_type = half(0);
    let target = match link_type {
        LINK_TYPE_CGROUP => Some(info[2]),
        LINK_TYPE_XDP | LINK_TYPE_TCX => Some(u64::from(half(4))),
        _ => None,
    };
    LinkTarget {
        link_type,
        prog_id: half(2),
        target,
    }
}

/// The `query` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct QueryAttr {
    target_fd: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    prog_cnt: u32,
    _pad: u32,
    prog_attach_flags: u64,
    link_ids: u64,
    link_attach_flags: u64,
    revision: u64,
}

/// The ids of the programs attached to `cgroup` itself (not inherited)
/// at `attach_type` (`enum bpf_attach_type`).
pub fn cgroup_programs(cgroup: &Path, attach_type: u32) -> io::Result<Vec<u32>> {
    let dir = std::fs::File::open(cgroup)?;
    let mut ids = vec![0u32; 64];
    loop {
        let mut attr = QueryAttr {
            target_fd: dir.as_raw_fd() as u32,
            attach_type,
            prog_ids: ids.as_mut_ptr() as u64,
            prog_cnt: ids.len() as u32,
            ..QueryAttr::default()
        };
        match bpf(
            BPF_PROG_QUERY,
            (&mut attr as *mut QueryAttr).cast(),
            std::mem::size_of::<QueryAttr>(),
        ) {
            Ok(_) => {
                ids.truncate(attr.prog_cnt as usize);
                return Ok(ids);
            }
            // More than room for: the kernel says how many.
            Err(e)
                if e.raw_os_error() == Some(libc::ENOSPC) && attr.prog_cnt as usize > ids.len() =>
            {
                ids = vec![0u32; attr.prog_cnt as usize];
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(words: &[(usize, u32)]) -> [u64; 32] {
        let mut halves = [0u32; 64];
        for (i, v) in words {
            halves[*i] = *v;
        }
        let mut info = [0u64; 32];
        for (i, pair) in halves.chunks(2).enumerate() {
            let mut bytes = [0u8; 8];
            bytes[..4].copy_from_slice(&pair[0].to_ne_bytes());
            bytes[4..].copy_from_slice(&pair[1].to_ne_bytes());
            info[i] = u64::from_ne_bytes(bytes);
        }
        info
    }

    /// The union starts at byte 16 (8-aligned after three u32s): a cgroup
    /// link's cgroup id is the u64 there, a TCX or XDP link's interface
    /// index the u32 there (TCX's attach type follows it and is not the
    /// target).
    #[test]
    fn targets_are_read_where_the_kernel_puts_them() {
        let cgroup = parse_link_info(&info(&[
            (0, 3),
            (1, 7),
            (2, 42),
            (4, 0x1234),
            (5, 1),
            (6, 10),
        ]));
        assert_eq!(
            cgroup,
            LinkTarget {
                link_type: LINK_TYPE_CGROUP,
                prog_id: 42,
                target: Some(0x1_0000_1234),
            }
        );
        assert!(!cgroup.detached());
        let tcx = parse_link_info(&info(&[(0, 11), (2, 9), (4, 5), (5, 46)]));
        assert_eq!(tcx.target, Some(5));
        let detached = parse_link_info(&info(&[(0, 11), (2, 9), (5, 46)]));
        assert!(detached.detached());
        let detached_cgroup = parse_link_info(&info(&[(0, 3), (2, 9), (6, 10)]));
        assert!(detached_cgroup.detached());
        let other = parse_link_info(&info(&[(0, 2), (4, 0)]));
        assert_eq!(other.target, None);
        assert!(!other.detached());
    }
}
