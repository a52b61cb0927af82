//! Directories and files the agent creates, with modes set explicitly so that
//! the umask it was started with does not decide who may change them. With
//! umask 000 the pin and link directories would be 0777: any user could
//! then unlink a link pin, and the programs it holds would detach.
//!
//! The agent and the CLI both run as root: directories are the owner's alone
//! (0700) or readable by root's group (0750); the files hold nothing secret
//! and are 0644, written only by root.
use std::{
    fs::{self, DirBuilder, File, OpenOptions, Permissions},
    io::{self, Write as _},
    os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _},
    path::Path,
};

/// The pin root and its `links` directory: only root may add or remove pins.
pub const PIN_DIR_MODE: u32 = 0o700;
/// The directory of the status, lock and verify-socket files.
pub const STATUS_DIR_MODE: u32 = 0o750;
/// The status and lock files: written by the agent, read by the CLI.
pub const STATUS_FILE_MODE: u32 = 0o644;
/// Parents created on the way to one of the directories above (`/run/switchboard`).
const PARENT_DIR_MODE: u32 = 0o755;

/// What to do with a directory that already exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Existing {
    /// It is switchboard's own: give it exactly the mode.
    Set,
    /// It may be someone else's (a pin root given on the command line, a
    /// bpffs mount point): only take away write access from group and
    /// others.
    Tighten,
}

/// Makes sure directory `path` exists with `mode` (see [`Existing`] for one
/// that does), creating missing parents with 0755.
pub fn ensure_dir(path: &Path, mode: u32, existing: Existing) -> io::Result<()> {
    let created = match DirBuilder::new().mode(mode).create(path) {
        Ok(()) => true,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(parent) = path.parent() {
                DirBuilder::new()
                    .recursive(true)
                    .mode(PARENT_DIR_MODE)
                    .create(parent)?;
            }
            match DirBuilder::new().mode(mode).create(path) {
                Ok(()) => true,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
                Err(e) => return Err(e),
            }
        }
        Err(e) => return Err(e),
    };
    let now = fs::metadata(path)?.permissions().mode() & 0o7777;
    let wanted = match (created, existing) {
        (true, _) | (false, Existing::Set) => mode,
        (false, Existing::Tighten) => now & !0o022,
    };
    if now != wanted {
        fs::set_permissions(path, Permissions::from_mode(wanted))?;
    }
    Ok(())
}

/// Opens (creating) `path` for reading and writing with exactly `mode`,
/// without truncating it.
pub fn open_rw(path: &Path, mode: u32) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(mode)
        .open(path)?;
    file.set_permissions(Permissions::from_mode(mode))?;
    Ok(file)
}

/// Writes `bytes` to `path` atomically (a temporary file beside it, moved
/// over it): a reader sees the old file or the new one, with `mode`.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.{}", std::process::id()));
    let write = || -> io::Result<()> {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        file.set_permissions(Permissions::from_mode(mode))?;
        file.write_all(bytes)?;
        fs::rename(&tmp, path)
    };
    write().inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })
}

/// The permission bits of `path`.
pub fn mode_of(path: &Path) -> io::Result<u32> {
    Ok(fs::metadata(path)?.permissions().mode() & 0o7777)
}

/// Runs `f` with the process's umask set to `mask`, one caller at a time
/// (the umask is the whole process's).
#[cfg(test)]
pub fn with_umask<T>(mask: u32, f: impl FnOnce() -> T) -> T {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = LOCK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // SAFETY: umask only swaps the process's file-creation mask; it cannot fail.
    let old = unsafe { libc::umask(mask as libc::mode_t) };
    let out = f();
    // SAFETY: as above, restoring the previous mask.
    unsafe { libc::umask(old) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("sb-fsmode-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn modes_are_exact_under_umask_000() {
        let root = scratch("exact");
        with_umask(0, || {
            let dir = root.join("a/b/links");
            ensure_dir(&dir, PIN_DIR_MODE, Existing::Set).expect("dir");
            assert_eq!(mode_of(&dir).expect("mode"), 0o700);
            assert_eq!(mode_of(&root.join("a/b")).expect("mode"), 0o755, "a parent");
            let file = root.join("a/status.json");
            write_atomic(&file, b"{}", STATUS_FILE_MODE).expect("write");
            assert_eq!(mode_of(&file).expect("mode"), 0o644);
            assert_eq!(fs::read(&file).expect("read"), b"{}");
            let lock = root.join("a/x.lock");
            drop(open_rw(&lock, STATUS_FILE_MODE).expect("open"));
            assert_eq!(mode_of(&lock).expect("mode"), 0o644);
            // No temporary file is left beside the status file.
            let names: Vec<_> = fs::read_dir(root.join("a"))
                .expect("list")
                .flatten()
                .map(|e| e.file_name())
                .collect();
            assert_eq!(names.len(), 3, "{names:?}");
        });
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn existing_directories_and_files_are_corrected() {
        let root = scratch("existing");
        with_umask(0, || {
            fs::create_dir_all(&root).expect("mkdir");
            let own = root.join("links");
            fs::create_dir(&own).expect("mkdir");
            let given = root.join("pins");
            fs::create_dir(&given).expect("mkdir");
            fs::set_permissions(&given, Permissions::from_mode(0o775)).expect("chmod");
            assert_eq!(mode_of(&own).expect("mode"), 0o777);
            ensure_dir(&own, PIN_DIR_MODE, Existing::Set).expect("set");
            assert_eq!(mode_of(&own).expect("mode"), 0o700);
            ensure_dir(&given, PIN_DIR_MODE, Existing::Tighten).expect("tighten");
            assert_eq!(
                mode_of(&given).expect("mode"),
                0o755,
                "only write access goes"
            );
            let lock = root.join("x.lock");
            fs::write(&lock, "1\n").expect("write");
            assert_eq!(mode_of(&lock).expect("mode"), 0o666);
            drop(open_rw(&lock, STATUS_FILE_MODE).expect("open"));
            assert_eq!(mode_of(&lock).expect("mode"), 0o644);
            assert_eq!(
                fs::read_to_string(&lock).expect("read"),
                "1\n",
                "not truncated"
            );
        });
        let _ = fs::remove_dir_all(&root);
    }
}
