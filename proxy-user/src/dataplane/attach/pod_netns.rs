//! The network namespaces the socket layer serves besides the agent's own:
//! those of the processes in its cgroup (on a node, the pods'). A pod's
//! connected UDP socket is balanced at `connect()` like the node's, so when
//! its backend leaves, the agent looks for it there ([`crate::dataplane::flows::udp_sockets`]).
use std::{
    collections::HashSet,
    fs, io,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use tracing::debug;

/// A network namespace, as the kernel names it: the device and inode of
/// its handle.
type NetnsId = (u64, u64);

fn netns_id(handle: &Path) -> io::Result<NetnsId> {
    let meta = fs::metadata(handle)?;
    Ok((meta.dev(), meta.ino()))
}

/// A handle (`/proc/<pid>/ns/net`) on each network namespace a process in
/// `cgroup` or below lives in, one per namespace, the calling thread's own
/// left out. A process that exits meanwhile is skipped; a cgroup that
/// cannot be read is logged and skipped.
pub fn of_cgroup(cgroup: &Path) -> Vec<PathBuf> {
    let own = netns_id(Path::new("/proc/thread-self/ns/net")).ok();
    let mut seen: HashSet<NetnsId> = own.into_iter().collect();
    let mut found = Vec::new();
    let mut pending = vec![cgroup.to_owned()];
    while let Some(dir) = pending.pop() {
        for pid in pids_of(&dir) {
            let handle = PathBuf::from(format!("/proc/{pid}/ns/net"));
            if let Ok(id) = netns_id(&handle) {
                if seen.insert(id) {
                    found.push(handle);
                }
            }
        }
        match fs::read_dir(&dir) {
            Ok(entries) => pending.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            ),
            Err(error) => debug!(cgroup = %dir.display(), %error, "cgroup not listed"),
        }
    }
    found
}

/// The processes of one cgroup (not its children).
fn pids_of(cgroup: &Path) -> Vec<u32> {
    match fs::read_to_string(cgroup.join("cgroup.procs")) {
        Ok(text) => text.lines().filter_map(|l| l.trim().parse().ok()).collect(),
        Err(error) => {
            debug!(cgroup = %cgroup.display(), %error, "cgroup.procs not read");
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in cgroup tree (plain directories): the namespaces of the
    /// processes it lists, each once, without the caller's own.
    #[test]
    fn each_namespace_of_the_listed_processes_once_without_our_own() {
        let root = std::env::temp_dir().join(format!("sb-netns-test-{}", std::process::id()));
        let child = root.join("pod").join("container");
        fs::create_dir_all(&child).expect("tree");
        let me = std::process::id();
        // Our own process twice (root and child) and a process that does
        // not exist: nothing to search but namespaces that are not ours.
        fs::write(root.join("cgroup.procs"), format!("{me}\n")).expect("procs");
        fs::write(child.join("cgroup.procs"), format!("{me}\n4294967\n")).expect("procs");
        let found = of_cgroup(&root);
        fs::remove_dir_all(&root).expect("cleanup");
        assert_eq!(found, Vec::<PathBuf>::new());
    }
}
