//! Upgrades from the pin roots of earlier versions (root only, netns
//! sandbox): held TCP connections and a UDP stream through a ClusterIP (tc
//! path) lose nothing when this version's agent starts where an earlier
//! one ran.
//!
//! The earlier pin root is made from a running one: the agent is stopped
//! (its programs stay attached and keep serving), and the pins it left are
//! turned into what the earlier version left, its connection-tracking
//! entries rewritten into the earlier layout. The new agent finds only
//! those, as after a real upgrade, and must carry every flow over before its
//! programs replace the running ones:
//! - e805261: `SB_CT_V2` (an LRU table whose entries both name the backend;
//!   replies found the frontend in `SB_RNAT_V1`) and `SB_STATS_V1`, no
//!   format stamp. Its other maps had the names and layouts of today's.
//! - f7bc505: today's layouts without the `loadBalancerSourceRanges` maps
//!   and without a format stamp.
//! - 49c1942 (format 3): `SB_QUIET_V1`, quiet marks without generations,
//!   in place of `SB_QUIET_V2` and `SB_QUIET_GEN_V1`, and `SB_FE_FILTER_V1`.
//! - 0d0aa87 (format 4): `SB_FE_FILTER_V1`, the frontend bitmap at a fixed
//!   2^20 bits, in place of `SB_FE_FILTER_V3`.
//! - 0a02f6a (format 5): `SB_FE_FILTER_V2`, the frontend bitmap sized as
//!   today's but with its bits chosen by another hash.
//! - b867dcc (format 8): today's layouts, but the frontend, backend,
//!   reverse-NAT and conntrack maps of both families preallocated, and the
//!   socket layer's table at its full size.
//!
//! Binaries as in e2e.rs (SWITCHBOARD_BIN, SB_ECHO_BIN).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use aya::maps::{HashMap, IterableMap as _, Map, MapData, PerCpuArray};
use aya_obj::maps::{bpf_map_def, LegacyMap, PinningType};
use aya_obj::EbpfSectionKind;
use proxy_common::{
    ct_dir, ct_flags, names, Backend, Backend6, CtEntry, CtEntry6, CtEntryV2, CtKey, CtKey6,
    FrontendKey, FrontendKey6, FrontendSlot, RevNat, RevNat6, SockEntry, SockKey,
};
use xtask::sandbox::{Attempt, ClientRun, Sandbox, AGENT_READY, CLUSTER_IP};
use xtask::testenv::{
    demo_sandbox_with, open_idle_with, sb_echo_in, switchboard, wait_agent_log, wake, IdleClient,
};

/// Idle connections held across the upgrade.
const IDLE: usize = 6;

const BPF_MAP_TYPE_HASH: u32 = 1;
const BPF_MAP_TYPE_ARRAY: u32 = 2;
const BPF_MAP_TYPE_PERCPU_ARRAY: u32 = 6;
const BPF_MAP_TYPE_LRU_HASH: u32 = 9;

/// Creates a map as an earlier version's loader did and pins it at `path`.
fn create_pinned(
    path: &Path,
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
) -> Map {
    let def = bpf_map_def {
        map_type,
        key_size,
        value_size,
        max_entries,
        map_flags: 0,
        id: 0,
        pinning: PinningType::None,
    };
    let obj = aya_obj::Map::Legacy(LegacyMap {
        def,
        inner_def: None,
        section_index: 0,
        section_kind: EbpfSectionKind::Maps,
        symbol_index: None,
        data: Vec::new(),
    });
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .expect("a map name");
    let data = MapData::create(obj, name, None).unwrap_or_else(|e| panic!("create {name}: {e}"));
    data.pin(path)
        .unwrap_or_else(|e| panic!("pin {}: {e}", path.display()));
    Map::from_map_data(data).expect("a known map type")
}

fn open_pinned(pin: &Path, name: &str) -> Map {
    let data = MapData::from_pin(pin.join(name)).unwrap_or_else(|e| panic!("open {name}: {e}"));
    Map::from_map_data(data).expect("a known map type")
}

fn unpin(pin: &Path, name: &str) {
    std::fs::remove_file(pin.join(name)).unwrap_or_else(|e| panic!("remove {name}: {e}"));
}

/// Turns the stopped agent's pin root into what an agent of e805261 left.
/// Returns how many flows were written into `SB_CT_V2`.
fn as_e805261(pin: &Path) -> usize {
    let current: HashMap<MapData, CtKey, CtEntry> =
        HashMap::try_from(open_pinned(pin, names::CONNTRACK)).expect("the conntrack table");
    let mut v2: HashMap<MapData, CtKey, CtEntryV2> = HashMap::try_from(create_pinned(
        &pin.join("SB_CT_V2"),
        BPF_MAP_TYPE_LRU_HASH,
        16,
        24,
        262_144,
    ))
    .expect("an LRU table");
    let mut written = 0;
    for item in current.iter() {
        let (key, entry) = item.expect("a conntrack entry");
        assert_eq!(
            entry.flags & ct_flags::SNAT,
            0,
            "e805261 had no source NAT: {key:?}"
        );
        // Both entries named the backend: a reply comes from it.
        let (backend_addr_be, backend_port_be) = match key.dir {
            ct_dir::REPLY => (key.saddr_be, key.sport_be),
            _ => (entry.nat_addr_be, entry.nat_port_be),
        };
        let old = CtEntryV2 {
            backend_id: entry.backend_id,
            service_id: entry.service_id,
            backend_addr_be,
            backend_port_be,
            _pad: [0; 2],
            created_ns: entry.created_ns,
        };
        v2.insert(key, old, 0).expect("write a V2 entry");
        written += 1;
    }
    let stats: PerCpuArray<MapData, u64> =
        PerCpuArray::try_from(open_pinned(pin, names::GLOBAL_STATS)).expect("the counters");
    let mut v1: PerCpuArray<MapData, u64> = PerCpuArray::try_from(create_pinned(
        &pin.join("SB_STATS_V1"),
        BPF_MAP_TYPE_PERCPU_ARRAY,
        4,
        8,
        11,
    ))
    .expect("a per-CPU array");
    for index in 1..11 {
        v1.set(index, stats.get(&index, 0).expect("a counter"), 0)
            .expect("write a V1 counter");
    }
    for name in [names::CONNTRACK, names::GLOBAL_STATS, "SB_FORMAT"] {
        unpin(pin, name);
    }
    written
}

/// Turns the stopped agent's pin root into what an agent of f7bc505 left.
fn as_f7bc505(pin: &Path) -> usize {
    for name in [
        names::SOURCE_RANGES,
        names::SOURCE_RANGES6,
        names::SERVICE_DENIED,
        "SB_FORMAT",
    ] {
        unpin(pin, name);
    }
    0
}

/// Turns the stopped agent's pin root into what an agent of 49c1942 (pin
/// root format 3) left: quiet marks that lasted until a flow took them
/// (`SB_QUIET_V1`, a `u32` interface index per slot), no generations.
fn as_49c1942(pin: &Path) -> usize {
    for name in [names::QUIET_PODS, names::QUIET_GENS] {
        unpin(pin, name);
    }
    let _ = create_pinned(&pin.join("SB_QUIET_V1"), BPF_MAP_TYPE_ARRAY, 4, 4, 16_384);
    with_fixed_bitmap(pin, "3")
}

/// Turns the stopped agent's pin root into what an agent of 0d0aa87 (pin
/// root format 4) left: the frontend bitmap at a fixed 2^20 bits.
fn as_0d0aa87(pin: &Path) -> usize {
    with_fixed_bitmap(pin, "4")
}

/// Turns the stopped agent's pin root into what an agent of 0a02f6a (pin
/// root format 5) left: the frontend bitmap of today's size, its bits
/// chosen by MurmurHash3's finalizer.
fn as_0a02f6a(pin: &Path) -> usize {
    with_bitmap(pin, "SB_FE_FILTER_V2", 1 << 15, "5")
}

/// The frontend bitmap of 2^20 bits (`SB_FE_FILTER_V1`) in place of
/// today's, and the format stamp `format`.
fn with_fixed_bitmap(pin: &Path, format: &str) -> usize {
    with_bitmap(pin, "SB_FE_FILTER_V1", 16_384, format)
}

/// An earlier frontend bitmap, pinned as `name` with `words` words, in
/// place of today's, and the format stamp `format`.
fn with_bitmap(pin: &Path, name: &str, words: u32, format: &str) -> usize {
    for name in [names::FRONTEND_FILTER, "SB_FORMAT"] {
        unpin(pin, name);
    }
    let _ = create_pinned(&pin.join(name), BPF_MAP_TYPE_ARRAY, 4, 8, words);
    std::os::unix::fs::symlink(format, pin.join("SB_FORMAT")).expect("stamp the format");
    0
}

/// Replaces the map pinned as `name` with a preallocated hash map of its
/// size holding its entries, as format 8 pinned it; returns how many.
fn preallocated<K: aya::Pod, V: aya::Pod>(pin: &Path, name: &str, map_type: u32) -> usize {
    let current: HashMap<MapData, K, V> =
        HashMap::try_from(open_pinned(pin, name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let max_entries = current.map().info().expect("map info").max_entries();
    let entries: Vec<(K, V)> = current
        .iter()
        .map(|item| item.unwrap_or_else(|e| panic!("an entry of {name}: {e}")))
        .collect();
    drop(current);
    unpin(pin, name);
    let mut old: HashMap<MapData, K, V> = HashMap::try_from(create_pinned(
        &pin.join(name),
        map_type,
        std::mem::size_of::<K>() as u32,
        std::mem::size_of::<V>() as u32,
        max_entries,
    ))
    .expect("a hash map");
    for (key, value) in &entries {
        old.insert(key, value, 0)
            .unwrap_or_else(|e| panic!("write {name}: {e}"));
    }
    entries.len()
}

/// The socket layer's table size format 8 pinned (`--max-conntrack`).
const FORMAT8_SOCKETS: u32 = 524_288;

/// Turns the stopped agent's pin root into what an agent of b867dcc (pin
/// root format 8) left: the frontend, backend, reverse-NAT and conntrack
/// maps of both families preallocated, with their entries, and the socket
/// layer's table at its full size. Returns the conntrack entries.
fn as_b867dcc(pin: &Path) -> usize {
    let h = BPF_MAP_TYPE_HASH;
    preallocated::<FrontendKey, FrontendSlot>(pin, names::FRONTENDS, h);
    preallocated::<u32, Backend>(pin, names::BACKENDS, h);
    preallocated::<u32, RevNat>(pin, names::REVNAT, h);
    preallocated::<FrontendKey6, FrontendSlot>(pin, names::FRONTENDS6, h);
    preallocated::<u32, Backend6>(pin, names::BACKENDS6, h);
    preallocated::<u32, RevNat6>(pin, names::REVNAT6, h);
    preallocated::<CtKey6, CtEntry6>(pin, names::CONNTRACK6, h);
    let flows = preallocated::<CtKey, CtEntry>(pin, names::CONNTRACK, h);
    unpin(pin, names::SOCKETS);
    let _ = create_pinned(
        &pin.join(names::SOCKETS),
        BPF_MAP_TYPE_LRU_HASH,
        std::mem::size_of::<SockKey>() as u32,
        std::mem::size_of::<SockEntry>() as u32,
        FORMAT8_SOCKETS,
    );
    flows
}

/// A UDP stream through the Service from one socket (one flow), a datagram
/// every 20 ms.
fn udp_stream(sb: &Sandbox, ms: u64) -> Child {
    let addr = format!("{CLUSTER_IP}:53");
    let ms = ms.to_string();
    let args = [
        "client",
        "--udp",
        &addr,
        "--udp-mode",
        "shared",
        "--duration-ms",
        &ms,
        "--interval-ms",
        "20",
    ];
    sb_echo_in(sb, &sb.client_ns(), &args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the UDP stream")
}

/// A TCP connection that exchanges a line every 100 ms for `secs`.
fn held_tcp(sb: &Sandbox, secs: f64) -> Child {
    let addr = format!("{CLUSTER_IP}:80");
    let secs = secs.to_string();
    sb_echo_in(
        sb,
        &sb.client_ns(),
        &[
            "client",
            "--tcp",
            &addr,
            "--hold",
            &secs,
            "--timeout-ms",
            "2000",
        ],
    )
    .stdout(Stdio::piped())
    .spawn()
    .expect("start the held connection")
}

fn finish(child: Child, what: &str) -> ClientRun {
    let out = child.wait_with_output().expect("wait for the client");
    ClientRun::parse(&String::from_utf8_lossy(&out.stdout))
        .unwrap_or_else(|e| panic!("{what}: {e:#}"))
}

/// The `forwarded` counter of `switchboard stats`.
fn forwarded(sb: &Sandbox) -> u64 {
    xtask::testenv::counters(&sb.pin_dir)
        .get("forwarded")
        .copied()
        .unwrap_or(0)
}

fn wait_ready(sb: &Sandbox) {
    wait_agent_log(sb, AGENT_READY, Duration::from_secs(15));
}

/// Held connections, a held active one and a UDP stream across a stop, the
/// pin root turned into an earlier version's by `earlier`, and a start of
/// this version's agent: every connection answers from its own pod, the
/// stream never fails nor changes pod, and the earlier pins are gone, each
/// with a log line. Returns the sandbox, its agent running.
fn upgrade_keeps_every_connection(earlier: fn(&Path) -> usize, migrated_pins: &[&str]) -> Sandbox {
    let mut sb = demo_sandbox_with(&[]);
    let addr = format!("{CLUSTER_IP}:80");
    let ns = sb.client_ns();
    let client = |args: &[&str]| sb_echo_in(&sb, &ns, args);
    let idle: Vec<IdleClient> = (0..IDLE).map(|_| open_idle_with(&client, &addr)).collect();
    let run_ms = 6000;
    let udp = udp_stream(&sb, run_ms);
    let active = held_tcp(&sb, run_ms as f64 / 1000.0);
    std::thread::sleep(Duration::from_millis(1000));
    sb.stop_agent().expect("stop the agent");
    let counted = forwarded(&sb);
    let flows = earlier(&sb.pin_dir);
    sb.start_agent(&switchboard())
        .expect("start this version's agent");
    wait_ready(&sb);
    let log = sb.agent_log();
    let counted_after = forwarded(&sb);

    let mut lost = Vec::new();
    for client in idle {
        match wake(client) {
            (pod, Attempt::Ok { name, .. }) if name == pod => {}
            (pod, other) => lost.push(format!("idle, greeted by {pod}, then {other:?}")),
        }
    }
    let active = finish(active, "held connection");
    if !active.all_ok() {
        lost.push(format!("held active connection: {}", active.raw));
    }
    let udp = finish(udp, "UDP stream");
    let pods: BTreeSet<String> = udp.names().into_iter().collect();
    eprintln!(
        "upgrade: {flows} entries in the earlier layout; {IDLE} idle connections and 1 active held, \
         {} lost; UDP stream {} exchanges, {} failed, answered by {pods:?}",
        lost.len(),
        udp.attempts.len(),
        udp.failures()
    );
    assert!(
        lost.is_empty(),
        "connections lost across the upgrade:\n{}\n{log}",
        lost.join("\n")
    );
    assert!(udp.all_ok(), "the UDP stream lost exchanges:\n{}", udp.raw);
    assert_eq!(pods.len(), 1, "the UDP stream changed pods: {pods:?}");
    assert!(
        udp.attempts.len() > 100,
        "too short a UDP stream:\n{}",
        udp.raw
    );
    assert!(
        counted_after >= counted,
        "the counters went back from {counted} to {counted_after} forwarded packets"
    );
    for pin in migrated_pins {
        assert!(!sb.pin_dir.join(pin).exists(), "{pin} is still pinned");
        assert!(
            log.lines()
                .any(|l| l.contains("earlier layout migrated") && l.contains(pin)),
            "no log line for {pin}:\n{log}"
        );
    }
    // The stamp is a symbolic link to the format's number.
    assert!(
        std::fs::read_link(sb.pin_dir.join("SB_FORMAT")).is_ok(),
        "the format was not recorded"
    );
    // Nothing left to report.
    let bin = switchboard().to_string_lossy().into_owned();
    let pin = sb.pin_dir.to_string_lossy().into_owned();
    let doctor = sb
        .command(&sb.node_ns(), &[&bin, "doctor", "--pin-root", &pin])
        .output()
        .expect("run doctor");
    let doctor_out = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        !doctor_out.contains("earlier layout") && !doctor_out.contains("does not use"),
        "doctor still sees the earlier layout:\n{doctor_out}"
    );
    sb
}

#[test]
fn an_upgrade_from_the_e805261_layout_keeps_every_connection() {
    let _ = upgrade_keeps_every_connection(as_e805261, &["SB_CT_V2", "SB_STATS_V1"]);
}

#[test]
fn an_upgrade_from_the_49c1942_layout_keeps_every_connection() {
    let _ = upgrade_keeps_every_connection(as_49c1942, &["SB_QUIET_V1", "SB_FE_FILTER_V1"]);
}

#[test]
fn an_upgrade_from_the_0d0aa87_layout_keeps_every_connection() {
    let _ = upgrade_keeps_every_connection(as_0d0aa87, &["SB_FE_FILTER_V1"]);
}

#[test]
fn an_upgrade_from_the_0a02f6a_layout_keeps_every_connection() {
    let _ = upgrade_keeps_every_connection(as_0a02f6a, &["SB_FE_FILTER_V2"]);
}

#[test]
fn an_upgrade_from_the_f7bc505_layout_keeps_every_connection() {
    let _ = upgrade_keeps_every_connection(as_f7bc505, &[]);
}

/// Format 8's preallocated maps are recreated allocated per entry, online
/// (every connection kept, above), and its empty full-size socket table
/// starts over small.
#[test]
fn an_upgrade_from_the_b867dcc_layout_keeps_every_connection() {
    let sb = upgrade_keeps_every_connection(as_b867dcc, &[]);
    let log = sb.agent_log();
    for name in [
        names::FRONTENDS,
        names::BACKENDS,
        names::REVNAT,
        names::CONNTRACK,
        names::FRONTENDS6,
        names::BACKENDS6,
        names::REVNAT6,
        names::CONNTRACK6,
    ] {
        let data = MapData::from_pin(sb.pin_dir.join(name)).expect("pinned");
        let flags = data.info().expect("map info").map_flags();
        assert_eq!(flags & 1, 1, "{name} is allocated per entry (flags {flags:#x})");
        assert!(
            log.lines()
                .any(|l| l.contains(name) && l.contains("recreated allocated per entry")),
            "no log line for {name}:\n{log}"
        );
    }
    let data = MapData::from_pin(sb.pin_dir.join(names::SOCKETS)).expect("pinned");
    let size = data.info().expect("map info").max_entries();
    assert!(
        size < FORMAT8_SOCKETS / 16,
        "the empty socket table starts over small: {size}"
    );
}
