//! The agent's own view of what it could not do, for the CLI: Services that
//! did not fit in the maps, and problems in the input. Kept as a small JSON
//! file next to the pins' name (bpffs holds only BPF objects), rewritten after
//! every sync.
use std::{
    fs, io,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use crate::{dataplane::attach::pods::AttachedInterface, util::fsmode};

/// Where status files live; one per pin root, so two agents on one machine
/// keep theirs apart.
pub const STATUS_DIR: &str = "/run/switchboard/status";

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentStatus {
    pub pid: u32,
    /// The agent's version (`switchboard --version`).
    pub version: String,
    /// Seconds since the epoch when the agent started.
    pub started_unix_s: u64,
    /// Seconds since the epoch of the last write.
    pub updated_unix_s: u64,
    /// `dir:PATH` or `cluster`.
    pub source: String,
    /// `--kubeconfig`, when the cluster source was given one.
    pub kubeconfig: Option<String>,
    /// The node the agent serves (`--node-name` / `--hostname-override`).
    pub node_name: String,
    /// `--proxy-name`, if set.
    pub proxy_name: Option<String>,
    /// `--lb-algorithm`: the default for Services without the annotation.
    pub lb_algorithm: String,
    /// `--nodeport-mode`: `snat` or `dsr` (empty from an agent that
    /// predates it: `snat`).
    pub nodeport_mode: String,
    /// How the tc programs update L4 checksums (empty from an agent that
    /// predates it: through the helper).
    pub l4_checksums: String,
    /// `--max-endpoints-per-service` (`None` from an agent that predates it).
    pub max_endpoints_per_service: Option<u16>,
    /// Seconds since the epoch of the last completed sync.
    pub last_sync_unix_s: u64,
    /// How long the last sync took, in microseconds.
    pub last_sync_us: u64,
    pub frontends_desired: usize,
    pub unprogrammed: Vec<UnprogrammedService>,
    /// Input problems (`object: problem`), as the model reported them
    /// (the source's own problems, such as files that do not parse, among them).
    pub warnings: Vec<String>,
    /// Services and EndpointSlices whose newest version cannot be used:
    /// held at their last good version, or never programmed.
    pub rejected: Vec<RejectedObject>,
    /// The interfaces the agent attached programs to.
    pub interfaces: Vec<AttachedInterface>,
    /// The cgroup the socket layer is attached to (`None`: socket layer off).
    pub socket_lb_cgroup: Option<String>,
    /// `--healthz-bind-address` and `--metrics-bind-address` (empty: off).
    pub healthz_bind: String,
    pub metrics_bind: String,
    /// Drift the agent found in what it owns outside itself and mended
    /// (programs, pins, map entries); see `agent/heal.rs`.
    pub repairs: Repairs,
    /// The connection-tracking timeouts (`--conntrack-*`), for
    /// `switchboard conntrack list`'s time to expiry.
    pub conntrack_timeouts: crate::dataplane::flows::expiry::Timeouts,
    /// The flow tables that grow with their load, and the most each may
    /// hold (`dataplane/pins/growth.rs`).
    pub flow_table_max: std::collections::BTreeMap<String, u32>,
}

/// The agent's repairs of drift, as the status file shows them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Repairs {
    /// Whether the agent repairs at all (`--repair-interval` not 0).
    pub enabled: bool,
    /// Repairs since the agent started.
    pub count: u64,
    /// Seconds since the epoch of the last look at the maps and pins (the
    /// programs are looked at on every interface event and rescan).
    pub last_check_unix_s: u64,
    /// The last repair.
    pub last: Option<Repair>,
}

/// One repair: when, of what, and what was wrong.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Repair {
    pub unix_s: u64,
    /// `programs`, `socket-layer`, `pins`, `maps` or `config`.
    pub kind: String,
    pub what: String,
}

/// An object whose newest version the model cannot use.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RejectedObject {
    /// `Service` or `EndpointSlice`.
    pub kind: String,
    /// `namespace/name`.
    pub object: String,
    /// The Service (`namespace/name`) whose frontends it affects: the
    /// Service itself, or the one the slice's kept version serves.
    pub service: Option<String>,
    /// `true`: its last good version stays programmed; `false`: nothing of
    /// it is programmed (it was never usable).
    pub held: bool,
    /// `field: problem`, one per bad field.
    pub problems: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnprogrammedService {
    pub service: String,
    pub frontend: String,
    pub reason: String,
}

/// The status file for `pin_root`: its path with `/` turned into `_`.
pub fn status_path(pin_root: &Path) -> PathBuf {
    let name: String = pin_root
        .to_string_lossy()
        .chars()
        .map(|c| if c == '/' { '_' } else { c })
        .collect();
    Path::new(STATUS_DIR).join(format!("{name}.json"))
}

/// Writes the status atomically (a reader never sees half a file).
pub fn write(pin_root: &Path, status: &AgentStatus) -> io::Result<()> {
    let path = status_path(pin_root);
    if let Some(dir) = path.parent() {
        fsmode::ensure_dir(dir, fsmode::STATUS_DIR_MODE, fsmode::Existing::Set)?;
    }
    let json = serde_json::to_vec_pretty(status).map_err(io::Error::other)?;
    fsmode::write_atomic(&path, &json, fsmode::STATUS_FILE_MODE)
}

/// Reads the status for `pin_root`, if an agent ever wrote one.
pub fn read(pin_root: &Path) -> Option<AgentStatus> {
    let bytes = fs::read(status_path(pin_root)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::attach::pods::UplinkXdp;

    #[test]
    fn status_paths_differ_per_pin_root() {
        let a = status_path(Path::new("/sys/fs/bpf/switchboard"));
        let b = status_path(Path::new("/run/x/bpf"));
        assert_ne!(a, b);
        assert_eq!(
            a,
            Path::new("/run/switchboard/status/_sys_fs_bpf_switchboard.json")
        );
    }

    /// With umask 000 the status file was 0666.
    #[test]
    fn the_status_file_is_0644_whatever_the_umask() {
        let pin_root = PathBuf::from(format!("/tmp/sb-status-mode-{}/bpf", std::process::id()));
        let status = AgentStatus {
            pid: 7,
            ..AgentStatus::default()
        };
        fsmode::with_umask(0, || write(&pin_root, &status)).expect("write");
        let path = status_path(&pin_root);
        assert_eq!(
            fsmode::mode_of(&path).expect("mode"),
            fsmode::STATUS_FILE_MODE
        );
        assert_eq!(
            fsmode::mode_of(path.parent().expect("dir")).expect("mode"),
            fsmode::STATUS_DIR_MODE
        );
        assert_eq!(read(&pin_root).map(|s| s.pid), Some(7));
        let _ = fs::remove_file(path);
    }

    #[test]
    fn status_survives_a_json_roundtrip() {
        let status = AgentStatus {
            pid: 1,
            updated_unix_s: 2,
            source: "dir:/x".into(),
            node_name: "node-a".into(),
            interfaces: vec![
                AttachedInterface {
                    name: "veth1".into(),
                    index: 4,
                    role: "pod".into(),
                    hooks: vec!["tcx ingress".into(), "tcx egress".into()],
                    xdp: None,
                },
                AttachedInterface {
                    name: "eth0".into(),
                    index: 2,
                    role: "uplink".into(),
                    hooks: vec!["tcx ingress".into()],
                    xdp: Some(UplinkXdp {
                        mode: "off".into(),
                        reason: "auto: veth uplink".into(),
                    }),
                },
            ],
            frontends_desired: 3,
            unprogrammed: vec![UnprogrammedService {
                service: "a/b:http".into(),
                frontend: "10.96.0.1:80/TCP".into(),
                reason: "frontend map full (4 entries)".into(),
            }],
            warnings: vec!["Service a/c: SCTP is not supported".into()],
            ..AgentStatus::default()
        };
        let json = serde_json::to_string(&status).expect("serialize");
        assert_eq!(
            serde_json::from_str::<AgentStatus>(&json).expect("parse"),
            status
        );
    }
}
