//! Network namespaces for the tests, the benchmarks and the sandboxes: the
//! one place that enters them, makes new ones and asks about interfaces in
//! them.
//!
//! `setns` and `unshare(CLONE_NEWNET)` change the calling thread only, and
//! the commands a thread spawns inherit its namespace. So work in another
//! namespace runs on a thread of its own ([`in_netns`], [`in_new_netns`]),
//! and the thread that asked never leaves its own. A panic on that thread
//! comes back as an error carrying the panic's message.
use std::{
    ffi::CString,
    fs::{self, File},
    io,
    os::{fd::AsRawFd as _, unix::fs::MetadataExt as _},
    path::PathBuf,
    process::Command,
    thread,
};

use anyhow::{anyhow, bail, ensure, Context as _, Result};

/// The inode of the calling thread's network namespace: two threads are in
/// the same namespace exactly when they read the same inode.
pub fn current_inode() -> io::Result<u64> {
    Ok(fs::metadata("/proc/thread-self/ns/net")?.ino())
}

/// The handle of network namespace `ns`: a name as `ip netns add` gives it
/// (`/run/netns/<ns>`), or an absolute path (such as `/proc/PID/ns/net`).
pub fn path(ns: &str) -> PathBuf {
    if ns.starts_with('/') {
        PathBuf::from(ns)
    } else {
        PathBuf::from("/run/netns").join(ns)
    }
}

/// Moves the calling thread into network namespace `ns` (see [`path`]) for
/// good. For a thread of its own; [`in_netns`] is the way back included.
pub fn enter_netns(ns: &str) -> Result<()> {
    let path = path(ns);
    let handle =
        File::open(&path).with_context(|| format!("open network namespace {}", path.display()))?;
    setns(&handle).with_context(|| format!("setns into {}", path.display()))
}

/// Runs `f` on a thread of its own that has entered network namespace `ns`
/// (see [`path`]); the calling thread and the rest of the process stay
/// where they are.
pub fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    let path = path(ns);
    let handle =
        File::open(&path).with_context(|| format!("open network namespace {}", path.display()))?;
    on_thread(&format!("network namespace {ns}"), move || {
        setns(&handle).with_context(|| format!("setns into network namespace {ns}"))?;
        f()
    })
}

/// Runs `f` on a thread of its own that first moves into a new network
/// namespace (holding only a `lo` that is down). The namespace goes away
/// when nothing holds it any more: with the thread, unless `f` leaves
/// threads, processes or handles behind in it. Nothing outside it is
/// touched: the thread checks that it left the namespace it started in.
pub fn in_new_netns<T: Send>(f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    on_thread("a new network namespace", move || {
        let before = current_inode().context("stat /proc/thread-self/ns/net")?;
        // SAFETY: unshare only changes the calling thread's namespaces.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error()).context("unshare(CLONE_NEWNET)");
        }
        ensure!(
            current_inode().context("stat /proc/thread-self/ns/net")? != before,
            "the thread is still in the namespace it started in: refusing to touch it"
        );
        f()
    })
}

/// Runs `f` on a scoped thread; its panic becomes an error naming `where_`.
fn on_thread<T: Send>(where_: &str, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    thread::scope(|scope| match scope.spawn(f).join() {
        Ok(result) => result,
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(anyhow!("the thread in {where_} panicked: {message}"))
        }
    })
}

fn setns(handle: &File) -> io::Result<()> {
    // SAFETY: a namespace handle that stays open for the call; setns only
    // changes the calling thread's namespace.
    if unsafe { libc::setns(handle.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The index of interface `name` in the calling thread's namespace.
pub fn ifindex(name: &str) -> Result<u32> {
    let c_name = CString::new(name).with_context(|| format!("interface name {name:?}"))?;
    // SAFETY: a NUL-terminated string that outlives the call, which only
    // reads it.
    let index = unsafe { libc::if_nametoindex(c_name.as_ptr()) };
    if index == 0 {
        return Err(io::Error::last_os_error())
            .with_context(|| format!("no interface {name} in this namespace"));
    }
    Ok(index)
}

/// A MAC address as `ip` writes it (`02:00:00:00:00:01`).
pub fn mac_text(mac: [u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Runs `ip args…` in the calling thread's namespace; fails with its error
/// output.
pub fn ip(args: &[&str]) -> Result<()> {
    // `output` waits for the child: no process outlives the command, so none
    // keeps a namespace alive after its thread ends.
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("run `ip` (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_under_run_netns_and_a_path_is_itself() {
        assert_eq!(path("sb-a"), PathBuf::from("/run/netns/sb-a"));
        assert_eq!(path("/proc/1/ns/net"), PathBuf::from("/proc/1/ns/net"));
    }

    #[test]
    fn a_mac_is_written_as_ip_writes_it() {
        assert_eq!(mac_text([0x02, 0, 0xab, 0, 0x0f, 1]), "02:00:ab:00:0f:01");
    }

    #[test]
    fn a_panic_on_the_thread_is_an_error_with_its_message() {
        let err = on_thread::<()>("here", || panic!("boom {}", 7)).unwrap_err();
        assert_eq!(err.to_string(), "the thread in here panicked: boom 7");
    }

    #[test]
    fn a_missing_namespace_is_an_error_naming_it() {
        let err = in_netns("sb-testkit-no-such-ns", || Ok(())).unwrap_err();
        assert!(
            format!("{err:#}").contains("/run/netns/sb-testkit-no-such-ns"),
            "{err:#}"
        );
    }
}
