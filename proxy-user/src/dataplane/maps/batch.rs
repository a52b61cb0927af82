//! Many map entries in one system call (`BPF_MAP_UPDATE_BATCH` and
//! `BPF_MAP_LOOKUP_BATCH`, Linux 5.6+), and the two single-entry calls aya
//! 0.14 makes in a way the drift check cannot use: a lookup into a
//! caller's buffer (a Maglev table is 64 KiB, which aya copies through the
//! stack) and the next key after a given one (aya's key walk always starts
//! at the first).
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

/// A walk over a map with `BPF_MAP_LOOKUP_BATCH`, up to `CHUNK` entries a
/// call.
struct LookupWalk {
    fd: i32,
    /// The position token: a bucket index for hash maps (8 bytes is room
    /// enough for any map type's token).
    token: [u64; 1],
    first: bool,
}

impl LookupWalk {
    fn new(fd: i32) -> Self {
        Self {
            fd,
            token: [0],
            first: true,
        }
    }

    /// The next batch, written to `keys` and `values`: how many entries it
    /// holds, and whether the walk goes on (the last batch may hold
    /// entries too).
    ///
    /// # Safety
    ///
    /// `keys` and `values` must each have room for `CHUNK` keys and values
    /// of the map's key and value sizes, and any bytes written there must
    /// be valid for what they are read as.
    unsafe fn next(&mut self, keys: *mut u8, values: *mut u8) -> std::io::Result<(usize, bool)> {
        let mut attr = BatchAttr {
            in_batch: if self.first {
                0
            } else {
                self.token.as_ptr() as u64
            },
            out_batch: self.token.as_mut_ptr() as u64,
            keys: keys as u64,
            values: values as u64,
            count: CHUNK as u32,
            map_fd: self.fd as u32,
            ..BatchAttr::default()
        };
        // SAFETY: `attr` is the kernel's `batch` layout; `keys` and `values`
        // have room for `count` keys and values (the caller's promise), and
        // `token` for the position; all outlive the call.
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
        match error {
            None => {
                self.first = false;
                Ok((n, true))
            }
            // The walk reached the end (with the last entries, if any).
            Some(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok((n, false)),
            Some(e) => Err(e),
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

/// Reads every entry of a hash map, `CHUNK` per system call (instead of two
/// system calls per entry). Entries written or removed meanwhile may or may
/// not be seen, as with any walk of a live map.
pub fn lookup_all<K: Pod, V: Pod>(map: &MapData) -> std::io::Result<Vec<(K, V)>> {
    let mut walk = LookupWalk::new(map.fd().as_fd().as_raw_fd());
    let mut out = Vec::new();
    let mut keys: Vec<K> = vec![bytemuck::Zeroable::zeroed(); CHUNK];
    let mut values: Vec<V> = vec![bytemuck::Zeroable::zeroed(); CHUNK];
    loop {
        // SAFETY: `keys` and `values` hold `CHUNK` keys and values of the
        // map's types (Pod: any bytes the kernel writes are valid).
        let (n, more) = unsafe { walk.next(keys.as_mut_ptr().cast(), values.as_mut_ptr().cast())? };
        out.extend(keys[..n].iter().copied().zip(values[..n].iter().copied()));
        if !more {
            return Ok(out);
        }
    }
}

/// How many entries the hash map `map` holds, read in batches of keys and
/// values `CHUNK` at a time (its key and value sizes from the kernel, so
/// any hash map is counted without its types), or key by key where the
/// kernel refuses batches. A map written meanwhile is counted as the walk
/// saw it.
pub fn count(map: &MapData) -> std::io::Result<usize> {
    let info = map
        .info()
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let fd = map.fd().as_fd().as_raw_fd();
    let (key_size, value_size) = (info.key_size() as usize, info.value_size() as usize);
    match count_batched(fd, key_size, value_size) {
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOTSUP)) => {
            count_keys(fd, key_size, info.max_entries() as usize)
        }
        counted => counted,
    }
}

/// [`count`] through `BPF_MAP_LOOKUP_BATCH`.
fn count_batched(fd: i32, key_size: usize, value_size: usize) -> std::io::Result<usize> {
    // u64 words: the kernel copies keys and values packed, at their sizes.
    let words = |size: usize| vec![0u64; (size * CHUNK).div_ceil(8)];
    let (mut keys, mut values) = (words(key_size), words(value_size));
    let mut walk = LookupWalk::new(fd);
    let mut total = 0;
    loop {
        // SAFETY: `keys` and `values` have room for `CHUNK` keys and values
        // of the sizes the kernel reported for this map; they are counted,
        // never read.
        let (n, more) = unsafe { walk.next(keys.as_mut_ptr().cast(), values.as_mut_ptr().cast())? };
        total += n;
        if !more {
            return Ok(total);
        }
    }
}

/// [`count`] one `BPF_MAP_GET_NEXT_KEY` per entry, `limit` at most (a key
/// removed under the walk starts it over from the first).
fn count_keys(fd: i32, key_size: usize, limit: usize) -> std::io::Result<usize> {
    let mut key = vec![0u8; key_size];
    let mut next = vec![0u8; key_size];
    let mut total = 0;
    loop {
        let mut attr = ElemAttr {
            map_fd: fd as u32,
            // No key: the first one.
            key: if total == 0 { 0 } else { key.as_ptr() as u64 },
            value: next.as_mut_ptr() as u64,
            ..ElemAttr::default()
        };
        // `key` and `next` hold one key of the map's size each and outlive
        // the call.
        match map_call(BPF_MAP_GET_NEXT_KEY, &mut attr) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(total),
            Err(e) => return Err(e),
        }
        total += 1;
        if total >= limit {
            return Ok(total);
        }
        std::mem::swap(&mut key, &mut next);
    }
}
