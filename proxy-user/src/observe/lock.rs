//! One agent per pin root: an exclusive `flock` on a file named after the pin
//! root, next to the status file (bpffs holds only BPF objects). The lock
//! dies with the process, whatever kills it, so a SIGKILLed agent never
//! blocks its successor. The file holds the holder's PID for the error a
//! second agent prints and for `switchboard status` / `doctor`.
use std::{
    fs::File,
    io::{self, Read as _, Seek as _, Write as _},
    path::{Path, PathBuf},
};

use nix::{
    errno::Errno,
    fcntl::{Flock, FlockArg},
};

use crate::{observe::status, util::fsmode};

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("another switchboard agent (pid {pid}) already manages pin root {pin_root} (lock {path}); stop it first, or give this one another --pin-root")]
    Held {
        pid: u32,
        pin_root: PathBuf,
        path: PathBuf,
    },
    #[error(
        "another switchboard agent (pid unknown) already manages pin root {pin_root} (lock {path})"
    )]
    HeldUnknown { pin_root: PathBuf, path: PathBuf },
    #[error("opening the agent lock {path}")]
    Open { path: PathBuf, source: io::Error },
    #[error("taking the agent lock {path}")]
    Flock { path: PathBuf, source: Errno },
    #[error("writing our pid into the agent lock {path}")]
    Write { path: PathBuf, source: io::Error },
}

/// Held for as long as the agent runs; dropping it releases the lock.
#[derive(Debug)]
pub struct AgentLock {
    _file: Flock<File>,
    path: PathBuf,
}

impl AgentLock {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The lock file of `pin_root`: the status file's path with `.lock`.
pub fn lock_path(pin_root: &Path) -> PathBuf {
    status::status_path(pin_root).with_extension("lock")
}

/// Takes the lock of `pin_root` without waiting; fails naming the holder's
/// PID when another agent has it.
pub fn acquire(pin_root: &Path) -> Result<AgentLock, LockError> {
    let path = lock_path(pin_root);
    let file = open(&path)?;
    let mut locked = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(locked) => locked,
        Err((mut file, Errno::EWOULDBLOCK)) => {
            return Err(match read_pid(&mut file) {
                Some(pid) => LockError::Held {
                    pid,
                    pin_root: pin_root.to_owned(),
                    path,
                },
                None => LockError::HeldUnknown {
                    pin_root: pin_root.to_owned(),
                    path,
                },
            })
        }
        Err((_, source)) => return Err(LockError::Flock { path, source }),
    };
    let write = |file: &mut File| -> io::Result<()> {
        file.set_len(0)?;
        file.rewind()?;
        writeln!(file, "{}", std::process::id())?;
        file.flush()
    };
    write(&mut locked).map_err(|source| LockError::Write {
        path: path.clone(),
        source,
    })?;
    Ok(AgentLock {
        _file: locked,
        path,
    })
}

/// The PID of the agent holding the lock of `pin_root`, if one does.
pub fn holder(pin_root: &Path) -> Option<u32> {
    let path = lock_path(pin_root);
    let file = File::open(&path).ok()?;
    match Flock::lock(file, FlockArg::LockSharedNonblock) {
        // We could lock it: nobody holds it (our shared lock goes with `_free`).
        Ok(_free) => None,
        Err((mut file, Errno::EWOULDBLOCK)) => read_pid(&mut file),
        Err(_) => None,
    }
}

fn open(path: &Path) -> Result<File, LockError> {
    let open_error = |source| LockError::Open {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent() {
        fsmode::ensure_dir(dir, fsmode::STATUS_DIR_MODE, fsmode::Existing::Set)
            .map_err(open_error)?;
    }
    fsmode::open_rw(path, fsmode::STATUS_FILE_MODE).map_err(open_error)
}

fn read_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.rewind().ok()?;
    file.read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_fails_naming_the_first_holder_and_frees_on_drop() {
        let pin_root = PathBuf::from(format!("/tmp/sb-lock-test-{}/bpf", std::process::id()));
        let lock = acquire(&pin_root).expect("first lock");
        // flock locks belong to the open file description: a second open in
        // the same process conflicts like a second agent would.
        match acquire(&pin_root) {
            Err(LockError::Held { pid, .. }) => assert_eq!(pid, std::process::id()),
            other => panic!("second acquire: {other:?}"),
        }
        assert_eq!(holder(&pin_root), Some(std::process::id()));
        let path = lock.path().to_owned();
        drop(lock);
        assert_eq!(holder(&pin_root), None);
        let again = acquire(&pin_root).expect("lock after release");
        drop(again);
        let _ = std::fs::remove_file(path);
    }

    /// With umask 000 the lock file was 0666.
    #[test]
    fn the_lock_file_and_its_directory_get_their_modes_whatever_the_umask() {
        let pin_root = PathBuf::from(format!("/tmp/sb-lock-mode-{}/bpf", std::process::id()));
        let lock = fsmode::with_umask(0, || acquire(&pin_root)).expect("lock");
        assert_eq!(
            fsmode::mode_of(lock.path()).expect("mode"),
            fsmode::STATUS_FILE_MODE
        );
        let dir = lock.path().parent().expect("dir").to_owned();
        assert_eq!(
            fsmode::mode_of(&dir).expect("mode"),
            fsmode::STATUS_DIR_MODE
        );
        let path = lock.path().to_owned();
        drop(lock);
        let _ = std::fs::remove_file(path);
    }
}
