//! Many map entries in one system call (`BPF_MAP_UPDATE_BATCH`, Linux 5.6+),
//! and the two single-entry calls aya 0.14 makes in a way the drift check
//! cannot use: a lookup into a caller's buffer (a Maglev table is 64 KiB,
//! which aya copies through the stack) and the next key after a given one
//! (aya's key walk always starts at the first).
//!
//! A start at 100k Services writes over two million entries; one
//! `bpf(BPF_MAP_UPDATE_ELEM)` each spends more time entering the kernel than
//! updating the map. aya 0.14 has no batch operations, so this is the one
//! place that issues the `bpf` system call on maps itself.

use std::os::fd::{AsFd as _, AsRawFd as _};

use aya::maps::MapData;
use bytemuck::Pod;

/// Entries per system call: the kernel copies keys and values in, so this
/// bounds the buffers (and the time between reschedules) per call.
const CHUNK: usize = 8192;

/// `BPF_MAP_UPDATE_BATCH` from `enum bpf_cmd`.
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;

/// The `batch` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Why a batch stopped: how many entries it wrote first, and the error.
#[derive(Debug)]
pub struct BatchError {
    pub written: usize,
    pub error: std::io::Error,
}

/// Writes `entries` into `map` (create or replace), in order, `CHUNK` at a
/// time.
pub fn update<K: Pod, V: Pod>(map: &MapData, entries: &[(K, V)]) -> Result<(), BatchError> {
    update_fd(map.fd().as_fd(), entries)
}

/// [`update`] into the map behind `fd` (a thread of its own may hold a
/// duplicate of the map's descriptor).
pub fn update_fd<K: Pod, V: Pod>(
    fd: std::os::fd::BorrowedFd<'_>,
    entries: &[(K, V)],
) -> Result<(), BatchError> {
    let fd = fd.as_raw_fd();
    let mut written = 0;
    for chunk in entries.chunks(CHUNK) {
        let keys: Vec<K> = chunk.iter().map(|(k, _)| *k).collect();
        let values: Vec<V> = chunk.iter().map(|(_, v)| *v).collect();
        let mut attr = BatchAttr {
            keys: keys.as_ptr() as u64,
            values: values.as_ptr() as u64,
            count: chunk.len() as u32,
            map_fd: fd as u32,
            ..BatchAttr::default()
        };
        // SAFETY: `attr` is the kernel's `batch` layout (repr(C), sized as
        // passed); `keys` and `values` hold `count` tightly packed keys and
        // values of the map's key and value types (Pod, so their bytes are
        // exactly what the kernel reads) and outlive the call; the kernel
        // writes back only `attr.count`.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_UPDATE_BATCH,
                &mut attr as *mut BatchAttr,
                std::mem::size_of::<BatchAttr>(),
            )
        };
        if rc < 0 {
            return Err(BatchError {
                written: written + attr.count as usize,
                error: std::io::Error::last_os_error(),
            });
        }
        written += chunk.len();
    }
    Ok(())
}

/// `BPF_MAP_LOOKUP_BATCH` from `enum bpf_cmd`.
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// Reads every entry of a hash map, `CHUNK` per system call (instead of two
/// system calls per entry). Entries written or removed meanwhile may or may
/// not be seen, as with any walk of a live map.
pub fn lookup_all<K: Pod, V: Pod>(map: &MapData) -> std::io::Result<Vec<(K, V)>> {
    let fd = map.fd().as_fd().as_raw_fd();
    let mut out = Vec::new();
    let mut keys: Vec<K> = vec![bytemuck::Zeroable::zeroed(); CHUNK];
    let mut values: Vec<V> = vec![bytemuck::Zeroable::zeroed(); CHUNK];
    // The position token: a bucket index for hash maps (8 bytes is room
    // enough for any map type's token).
    let mut token = [0u64; 1];
    let mut first = true;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { token.as_ptr() as u64 },
            out_batch: token.as_mut_ptr() as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: CHUNK as u32,
            map_fd: fd as u32,
            ..BatchAttr::default()
        };
        // SAFETY: `attr` is the kernel's `batch` layout; `keys` and `values`
        // have room for `count` keys and values of the map's types (Pod: any
        // bytes the kernel writes are valid), and `token` for the position;
        // all outlive the call.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &mut attr as *mut BatchAttr,
                std::mem::size_of::<BatchAttr>(),
            )
        };
        let error = (rc < 0).then(std::io::Error::last_os_error);
        let n = (attr.count as usize).min(CHUNK);
        out.extend(keys[..n].iter().copied().zip(values[..n].iter().copied()));
        match error {
            None => first = false,
            // The walk reached the end (with the last entries, if any).
            Some(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(out),
            Some(e) => return Err(e),
        }
    }
}

/// `BPF_MAP_LOOKUP_ELEM` and `BPF_MAP_GET_NEXT_KEY` from `enum bpf_cmd`.
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;

/// The element member of `union bpf_attr` (`value` is `next_key` for
/// `BPF_MAP_GET_NEXT_KEY`).
#[repr(C)]
#[derive(Default)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

fn map_call(cmd: libc::c_long, attr: &mut ElemAttr) -> std::io::Result<()> {
    // SAFETY: `attr` is the kernel's element layout (repr(C), sized as
    // passed); the caller's pointers in it point to a key and a value (or
    // next key) of the map's types that outlive the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut ElemAttr,
            std::mem::size_of::<ElemAttr>(),
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Reads the value of `key` into `value`; `Ok(false)` when the map has no
/// such key.
pub fn lookup_into<K: Pod, V: Pod>(map: &MapData, key: &K, value: &mut V) -> std::io::Result<bool> {
    let mut attr = ElemAttr {
        map_fd: map.fd().as_fd().as_raw_fd() as u32,
        key: key as *const K as u64,
        value: value as *mut V as u64,
        ..ElemAttr::default()
    };
    match map_call(BPF_MAP_LOOKUP_ELEM, &mut attr) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The key after `after` in the map's own order (the first key when
/// `after` is `None`, and, for a hash map, when `after` is no longer
/// there); `None` past the last.
pub fn next_key<K: Pod>(map: &MapData, after: Option<&K>) -> std::io::Result<Option<K>> {
    let mut next: K = bytemuck::Zeroable::zeroed();
    let mut attr = ElemAttr {
        map_fd: map.fd().as_fd().as_raw_fd() as u32,
        key: after.map_or(0, |k| k as *const K as u64),
        value: &mut next as *mut K as u64,
        ..ElemAttr::default()
    };
    match map_call(BPF_MAP_GET_NEXT_KEY, &mut attr) {
        Ok(()) => Ok(Some(next)),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}
