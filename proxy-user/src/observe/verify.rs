//! `switchboard verify`: do the pinned maps hold exactly the agent's desired
//! state?
//!
//! Only the running agent knows its desired state (it keeps the last good
//! version of objects it could not read, it has the node's addresses under
//! `--nodeport-addresses`, …), so the comparison is a request to the agent:
//! the CLI connects to a Unix socket next to the agent's status file
//! ([`socket_path`], mode 0600, root only) and sends one line, `verify`. A
//! task on the agent's runtime reads it and hands it to the sync loop, which
//! answers between two syncs (never in the middle of one), so the dump and
//! the model it is compared with describe the same moment. The answer is one
//! JSON [`Verification`], then the agent closes the connection. The same
//! socket serves `switchboard trace`: a first line `trace <filter>` hands
//! the connection to the trace hub ([`crate::observe::trace`]), which streams
//! until the client closes it.
//!
//! [`compare`] is the comparison itself: a pure function over the desired
//! state and a [`Dump`] of the maps.
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use proxy_common::{frontend_flags, scope, FrontendSlot};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

use crate::model::{BackendAddr, DesiredState, Frontend, FrontendAddr, IpFamily};
use crate::observe::{status, trace};
use crate::sync::encode::{
    backend_addr, frontend_addr, proto_number, revnat_name, revnat_value, scoped_key,
    slot_zero_attributes, AnyBackend, AnyFrontendKey, AnyRevNat, FrontendDefaults,
};
use crate::sync::store::Dump;

/// The one request the socket serves.
pub const REQUEST: &str = "verify";

/// How long the CLI waits for the answer: the loop answers between syncs,
/// and one sync at 100k Services can take seconds.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

/// How long the agent waits for a client to send its request line.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// What kind of difference a [`Problem`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProblemKind {
    /// Desired, but no slot 0 in the maps.
    Missing,
    /// In the maps, but not desired.
    Extra,
    /// The backend set differs (internal, or the external local-only set).
    WrongBackends,
    /// Slot 0's flags or affinity timeout differ from what the model asks.
    WrongAttributes,
    /// A slot within the count is absent, names a backend id that is not in
    /// the backend map, or a backend of the wrong protocol.
    DanglingSlot,
    /// A slot past its set's count, or of a set with no slot 0.
    OrphanedSlot,
    /// A backend no reachable slot names.
    OrphanedBackend,
    /// A reverse-NAT entry no slot 0 names, or one slot 0 names that is
    /// missing or describes another frontend.
    WrongRevnat,
    /// A hashed frontend's Maglev table is missing or holds other entries
    /// than the ones computed for its backends, or a table no hashed
    /// frontend has is there.
    WrongMaglev,
    /// An uplink map entry differs from what the agent wrote for its
    /// uplinks (`frontend` and `service` empty).
    WrongUplink,
}

impl ProblemKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProblemKind::Missing => "missing",
            ProblemKind::Extra => "extra",
            ProblemKind::WrongBackends => "wrong-backends",
            ProblemKind::WrongAttributes => "wrong-attributes",
            ProblemKind::DanglingSlot => "dangling-slot",
            ProblemKind::OrphanedSlot => "orphaned-slot",
            ProblemKind::OrphanedBackend => "orphaned-backend",
            ProblemKind::WrongRevnat => "wrong-revnat",
            ProblemKind::WrongMaglev => "wrong-maglev",
            ProblemKind::WrongUplink => "wrong-uplink",
        }
    }
}

/// One difference between the maps and the desired state.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Problem {
    /// `IP:PORT/PROTO`, or empty for a map entry of no frontend.
    pub frontend: String,
    /// `namespace/name:port` (from the model, else the reverse-NAT entry).
    pub service: String,
    pub kind: ProblemKind,
    pub detail: String,
}

/// The agent's answer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verification {
    pub frontends_desired: usize,
    /// Frontends with a slot 0 in the maps.
    pub frontends_in_maps: usize,
    pub backends_in_maps: usize,
    /// Sorted by frontend, then kind.
    pub problems: Vec<Problem>,
}

impl Verification {
    pub fn matches(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Why a desired frontend is not in the maps, as the sync reported it
/// (capacity): shown with the `missing` problem.
pub type Unprogrammed = BTreeMap<FrontendAddr, String>;

/// The maps in `dump` against `desired` (`defaults`: what the agent's flags
/// make slot 0 record, such as `--lb-algorithm` for Services that name
/// none).
/// The Maglev tables and the uplink maps are compared by the agent itself
/// (`SyncLoop::verify`), with the comparison its drift repair makes.
pub fn compare(
    desired: &DesiredState,
    defaults: FrontendDefaults,
    dump: &Dump,
    unprogrammed: &Unprogrammed,
) -> Verification {
    let maps = Maps::index(dump);
    let mut problems = Vec::new();
    let mut reachable_backends: HashSet<(IpFamily, u32)> = HashSet::new();
    let mut reachable_slots: HashSet<AnyFrontendKey> = HashSet::new();
    let mut named_services: HashSet<(IpFamily, u32)> = HashSet::new();

    // Every set announced in the maps, desired or not: its slots and
    // backends are reachable by the data path.
    let heads: BTreeMap<FrontendAddr, (AnyFrontendKey, FrontendSlot)> = dump
        .frontends
        .iter()
        .filter(|(k, _)| k.slot() == 0 && k.scope() == scope::INTERNAL)
        .filter_map(|(k, v)| Some((frontend_addr(k)?, (*k, *v))))
        .collect();
    for (addr, (key, head)) in &heads {
        named_services.insert((addr.family(), head.service_id));
        let mut sets = vec![(*key, *head)];
        if frontend_flags::has_external_set(head.flags) {
            let ext = key.at(scope::EXTERNAL, 0);
            if let Some(ext_head) = maps.slots.get(&ext) {
                sets.push((ext, *ext_head));
            }
        }
        for (set_key, set_head) in sets {
            reachable_slots.insert(set_key);
            let decoded = maps.decode_set(addr, &set_key, &set_head);
            reachable_slots.extend(decoded.slots.iter().copied());
            reachable_backends.extend(decoded.ids.iter().map(|id| (addr.family(), *id)));
        }
    }

    for frontend in desired.frontends.values() {
        compare_frontend(&maps, frontend, defaults, unprogrammed, &mut problems);
    }
    for (addr, (key, head)) in heads
        .iter()
        .filter(|(a, _)| !desired.frontends.contains_key(a))
    {
        let set = maps.decode_set(addr, key, head);
        problems.push(Problem {
            frontend: addr.to_string(),
            service: maps.service_name(addr.family(), head.service_id),
            kind: ProblemKind::Extra,
            detail: format!("in the maps (to {}) but not desired", list(&set.addrs)),
        });
    }
    for (key, value) in dump
        .frontends
        .iter()
        .filter(|(k, _)| !reachable_slots.contains(k))
    {
        let frontend = frontend_addr(key)
            .map(|a| a.to_string())
            .unwrap_or_default();
        let set = if key.scope() == scope::EXTERNAL {
            "external"
        } else {
            "internal"
        };
        problems.push(Problem {
            frontend,
            service: maps.service_name(key.family(), value.service_id),
            kind: ProblemKind::OrphanedSlot,
            detail: format!(
                "{set} slot {} (backend id {}) is past its set's count or has no slot 0",
                key.slot(),
                value.backend_id
            ),
        });
    }
    for (id, backend) in dump
        .backends
        .iter()
        .filter(|(id, b)| !reachable_backends.contains(&(b.family(), *id)))
    {
        problems.push(Problem {
            frontend: String::new(),
            service: String::new(),
            kind: ProblemKind::OrphanedBackend,
            detail: format!(
                "{} backend id {id} ({}) is named by no slot",
                backend.family(),
                backend_addr(backend)
            ),
        });
    }
    for (id, rn) in dump
        .revnat
        .iter()
        .filter(|(id, rn)| !named_services.contains(&(rn.family(), *id)))
    {
        problems.push(Problem {
            frontend: String::new(),
            service: revnat_name(rn),
            kind: ProblemKind::WrongRevnat,
            detail: format!(
                "{} reverse-NAT entry of service id {id} is named by no frontend",
                rn.family()
            ),
        });
    }
    problems.sort();
    Verification {
        frontends_desired: desired.frontends.len(),
        frontends_in_maps: heads.len(),
        backends_in_maps: dump.backends.len(),
        problems,
    }
}

fn compare_frontend(
    maps: &Maps,
    frontend: &Frontend,
    defaults: FrontendDefaults,
    unprogrammed: &Unprogrammed,
    problems: &mut Vec<Problem>,
) {
    let addr = &frontend.addr;
    let mut push = |kind, detail: String| {
        problems.push(Problem {
            frontend: addr.to_string(),
            service: frontend.service.to_string(),
            kind,
            detail,
        });
    };
    let key = scoped_key(addr, scope::INTERNAL, 0);
    let Some(head) = maps.slots.get(&key) else {
        let why = unprogrammed
            .get(addr)
            .map(|reason| format!(" (the agent could not program it: {reason})"))
            .unwrap_or_default();
        push(
            ProblemKind::Missing,
            format!(
                "not in the maps; should go to {}{why}",
                list(&frontend.backends)
            ),
        );
        return;
    };
    let (flags, affinity) = slot_zero_attributes(frontend, defaults);
    if head.flags != flags || head.affinity_timeout_s != affinity {
        push(
            ProblemKind::WrongAttributes,
            format!(
                "slot 0 has flags {:#06x}, affinity {} s; desired flags {flags:#06x}, affinity {affinity} s",
                head.flags, head.affinity_timeout_s
            ),
        );
    }
    let expected_name = revnat_value(addr, &frontend.service.to_string());
    match maps.revnat.get(&(addr.family(), head.service_id)) {
        None => push(
            ProblemKind::WrongRevnat,
            format!(
                "slot 0 names service id {} with no reverse-NAT entry",
                head.service_id
            ),
        ),
        Some(rn) if *rn != expected_name => {
            push(
                ProblemKind::WrongRevnat,
                format!(
                    "reverse-NAT entry {} says {:?}, desired {:?}",
                    head.service_id,
                    revnat_name(rn),
                    revnat_name(&expected_name)
                ),
            );
        }
        Some(_) => {}
    }
    let internal = maps.decode_set(addr, &key, head);
    for dangling in &internal.dangling {
        push(ProblemKind::DanglingSlot, dangling.clone());
    }
    if internal.addrs != frontend.backends {
        push(
            ProblemKind::WrongBackends,
            backends_diff("", &internal.addrs, &frontend.backends),
        );
    }
    let wanted_external = frontend_flags::has_external_set(flags)
        .then(|| frontend.external_backends.clone().unwrap_or_default());
    let ext_key = scoped_key(addr, scope::EXTERNAL, 0);
    let external = maps
        .slots
        .get(&ext_key)
        .filter(|_| frontend_flags::has_external_set(head.flags))
        .map(|ext_head| maps.decode_set(addr, &ext_key, ext_head));
    if let Some(ext) = &external {
        for dangling in &ext.dangling {
            push(
                ProblemKind::DanglingSlot,
                format!("external set: {dangling}"),
            );
        }
    }
    match (&wanted_external, &external) {
        (Some(want), Some(have)) if *want != have.addrs => {
            push(
                ProblemKind::WrongBackends,
                backends_diff("external (local-only) set: ", &have.addrs, want),
            );
        }
        (Some(want), None) => push(
            ProblemKind::WrongBackends,
            format!("external (local-only) set missing; desired {}", list(want)),
        ),
        _ => {}
    }
}

/// `in the maps: …; desired: …; missing: …; extra: …`.
fn backends_diff(prefix: &str, have: &[BackendAddr], want: &[BackendAddr]) -> String {
    let have_set: BTreeSet<_> = have.iter().collect();
    let want_set: BTreeSet<_> = want.iter().collect();
    let missing: Vec<_> = want_set
        .difference(&have_set)
        .map(ToString::to_string)
        .collect();
    let extra: Vec<_> = have_set
        .difference(&want_set)
        .map(ToString::to_string)
        .collect();
    format!(
        "{prefix}the maps send to {}, desired {} (missing: {}; extra: {})",
        list(have),
        list(want),
        if missing.is_empty() {
            "none".into()
        } else {
            missing.join(", ")
        },
        if extra.is_empty() {
            "none".into()
        } else {
            extra.join(", ")
        },
    )
}

fn list(v: &[BackendAddr]) -> String {
    if v.is_empty() {
        return "(nothing)".into();
    }
    v.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The dump, indexed.
struct Maps {
    slots: HashMap<AnyFrontendKey, FrontendSlot>,
    /// Ids are shared by both families; each map is indexed by its family.
    backends: HashMap<(IpFamily, u32), AnyBackend>,
    revnat: HashMap<(IpFamily, u32), AnyRevNat>,
}

/// One backend set as the data path sees it.
struct DecodedSet {
    /// Sorted addresses of the backends the slots reach.
    addrs: Vec<BackendAddr>,
    ids: Vec<u32>,
    /// The slots within the count that exist.
    slots: Vec<AnyFrontendKey>,
    /// What is wrong with slots within the count.
    dangling: Vec<String>,
}

impl Maps {
    fn index(dump: &Dump) -> Maps {
        Maps {
            slots: dump.frontends.iter().copied().collect(),
            backends: dump
                .backends
                .iter()
                .map(|(id, b)| ((b.family(), *id), *b))
                .collect(),
            revnat: dump
                .revnat
                .iter()
                .map(|(id, r)| ((r.family(), *id), *r))
                .collect(),
        }
    }

    fn service_name(&self, family: IpFamily, service_id: u32) -> String {
        self.revnat
            .get(&(family, service_id))
            .map(revnat_name)
            .unwrap_or_default()
    }

    fn decode_set(
        &self,
        addr: &FrontendAddr,
        head_key: &AnyFrontendKey,
        head: &FrontendSlot,
    ) -> DecodedSet {
        let mut set = DecodedSet {
            addrs: Vec::new(),
            ids: Vec::new(),
            slots: Vec::new(),
            dangling: Vec::new(),
        };
        for slot in 1..=head.backend_count {
            let key = head_key.at(head_key.scope(), slot);
            let Some(value) = self.slots.get(&key) else {
                set.dangling
                    .push(format!("slot {slot} of {} is absent", head.backend_count));
                continue;
            };
            set.slots.push(key);
            let Some(backend) = self.backends.get(&(addr.family(), value.backend_id)) else {
                set.dangling.push(format!(
                    "slot {slot} names backend id {}, which is not in the {} backend map",
                    value.backend_id,
                    addr.family()
                ));
                continue;
            };
            set.ids.push(value.backend_id);
            if backend.proto() != proto_number(addr.protocol) {
                set.dangling.push(format!(
                    "slot {slot} names backend id {} of protocol {}",
                    value.backend_id,
                    backend.proto()
                ));
            }
            set.addrs.push(backend_addr(backend));
        }
        set.addrs.sort();
        set
    }
}

/// The socket of the agent for `pin_root`: its status file's path with
/// `.sock` for `.json`.
pub fn socket_path(pin_root: &Path) -> PathBuf {
    status::status_path(pin_root).with_extension("sock")
}

/// A request the sync loop answers.
pub struct Request {
    pub reply: oneshot::Sender<Verification>,
}

/// The agent's side: listens on [`socket_path`] and passes each request to
/// the sync loop through the returned channel, and each `trace` request to
/// `traces` ([`crate::observe::trace`]). The socket file is removed when the
/// returned guard drops.
pub fn serve(
    pin_root: &Path,
    traces: trace::hub::Handle,
) -> std::io::Result<(SocketGuard, mpsc::Receiver<Request>)> {
    let path = socket_path(pin_root);
    if let Some(dir) = path.parent() {
        crate::util::fsmode::ensure_dir(
            dir,
            crate::util::fsmode::STATUS_DIR_MODE,
            crate::util::fsmode::Existing::Set,
        )?;
    }
    // The agent holds the pin root's lock: a file here is a dead agent's.
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = tokio::net::UnixListener::bind(&path)?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(accept(listener, tx, traces));
    Ok((SocketGuard(path), rx))
}

/// Removes the socket file when the agent stops.
pub struct SocketGuard(PathBuf);

impl Drop for SocketGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

async fn accept(
    listener: tokio::net::UnixListener,
    tx: mpsc::Sender<Request>,
    traces: trace::hub::Handle,
) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(answer(stream, tx.clone(), traces.clone()));
            }
            Err(error) => {
                warn!(%error, "verify socket: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        if tx.is_closed() {
            return;
        }
    }
}

/// Reads one request line, waits for the loop's answer, writes it; a
/// `trace` request goes to the trace hub with the connection.
async fn answer(
    stream: tokio::net::UnixStream,
    tx: mpsc::Sender<Request>,
    traces: trace::hub::Handle,
) {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = tokio::io::BufReader::new(read.take(4096));
    let read = tokio::time::timeout(REQUEST_TIMEOUT, reader.read_line(&mut line)).await;
    if let (Ok(Ok(_)), Some(spec)) = (&read, line.strip_prefix(trace::REQUEST)) {
        if spec.starts_with([' ', '\n']) {
            let read = reader.into_inner().into_inner();
            traces.join(spec, read, write).await;
            return;
        }
    }
    let body = match read {
        Ok(Ok(_)) if line.trim() == REQUEST => {
            let (reply, answer) = oneshot::channel();
            if tx.send(Request { reply }).await.is_err() {
                return;
            }
            match answer.await {
                Ok(verification) => serde_json::to_vec(&verification).unwrap_or_default(),
                Err(_) => return,
            }
        }
        Ok(Ok(_)) => {
            format!("{{\"error\":\"unknown request; expected {REQUEST:?}\"}}").into_bytes()
        }
        Ok(Err(error)) => {
            debug!(%error, "verify socket: reading the request failed");
            return;
        }
        Err(_) => return,
    };
    let _ = write.write_all(&body).await;
    let _ = write.shutdown().await;
}

/// Why the CLI got no verification.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    #[error("no agent answers on {path} (is one running for this --pin-root?)")]
    NotRunning {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("talking to the agent on {path}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the agent's answer on {path} is not a verification: {answer}")]
    Answer { path: PathBuf, answer: String },
}

/// The CLI's side: asks the agent of `pin_root` to verify.
pub fn ask(pin_root: &Path) -> Result<Verification, AskError> {
    let path = socket_path(pin_root);
    let io = |source| AskError::Io {
        path: path.clone(),
        source,
    };
    let mut stream =
        std::os::unix::net::UnixStream::connect(&path).map_err(|source| AskError::NotRunning {
            path: path.clone(),
            source,
        })?;
    stream.set_read_timeout(Some(ANSWER_TIMEOUT)).map_err(io)?;
    stream
        .write_all(format!("{REQUEST}\n").as_bytes())
        .map_err(io)?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).map_err(io)?;
    serde_json::from_slice(&answer).map_err(|_| AskError::Answer {
        path: path.clone(),
        answer: String::from_utf8_lossy(&answer).chars().take(200).collect(),
    })
}

#[cfg(test)]
mod tests;
