//! The agent's side of IPv6 connection tracking, against the kernel: the
//! collector on a loaded `SB_CT6_V1`, the sync's purges of the IPv6 tables,
//! a pin root without the IPv6 tables (an upgrade), and closing IPv6 UDP
//! sockets through sock_diag. Needs root (CAP_BPF, CAP_SYS_ADMIN for the
//! bpffs mount and the network namespace).
use std::{
    collections::HashMap,
    io,
    net::{Ipv6Addr, SocketAddr, UdpSocket},
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
    process::Command,
};

use crate::support::{
    capacities,
    netns::{in_new_netns, ip},
    require_root,
};
use proxy_common::{
    addr6_be, ct_dir, ct_flags, ct_state, names, proto, Addr6Be, CtEntry, CtEntry6, CtKey, CtKey6,
    SockEntry6, SockKey6,
};
use proxy_user::{
    dataplane::flows::expiry::{self, GcMetrics, Pass, Timeouts},
    dataplane::flows::quiet_pods::Candidates,
    dataplane::flows::udp_sockets,
    dataplane::load::object,
    dataplane::maps::PinnedMaps,
    dataplane::pins::growth::FlowSizes,
    model::BackendAddr,
    sync::store::MapStore as _,
};

const S: u64 = 1_000_000_000;

fn addr(text: &str) -> Addr6Be {
    let ip: Ipv6Addr = text.parse().expect("an IPv6 address");
    addr6_be(ip.octets())
}

fn key(dir: u8, src: (&str, u16), dst: (&str, u16)) -> CtKey6 {
    CtKey6 {
        saddr_be: addr(src.0),
        daddr_be: addr(dst.0),
        sport_be: src.1.to_be(),
        dport_be: dst.1.to_be(),
        proto: proto::TCP,
        dir,
        _pad: [0; 2],
    }
}

/// A TCP flow client:`sport` → [fd00:96::10]:80 → [fd00:244::5]:8080 of
/// service `service`, both entries last seen at `seen_ns`, with `state` bits
/// (forward, reply) and `flags` on both. With SNAT the client is rewritten
/// to the node address [fd00:ff::1] and the same port.
fn flow(
    service: u32,
    sport: u16,
    state: (u8, u8),
    flags: u8,
    seen_ns: u64,
) -> [(CtKey6, CtEntry6); 2] {
    let (client, vip, pod, node) = ("fd00::2", "fd00:96::10", "fd00:244::5", "fd00:ff::1");
    let snat = flags & ct_flags::SNAT != 0;
    let seen_as = if snat { node } else { client };
    let entry = |state, nat: &str, nat_port: u16, snat_to: &str| CtEntry6 {
        backend_id: 3,
        service_id: service,
        nat_addr_be: addr(nat),
        nat_port_be: nat_port.to_be(),
        flags,
        state,
        snat_addr_be: if snat { addr(snat_to) } else { [0; 4] },
        snat_port_be: if snat { sport.to_be() } else { 0 },
        created_ns: seen_ns,
        last_seen_ns: seen_ns,
        ..CtEntry6::default()
    };
    [
        (
            key(ct_dir::FORWARD, (client, sport), (vip, 80)),
            entry(state.0, pod, 8080, node),
        ),
        (
            key(ct_dir::REPLY, (pod, 8080), (seen_as, sport)),
            entry(state.1, vip, 80, client),
        ),
    ]
}

/// One collector pass over the kernel's IPv6 table removes each expired
/// flow's two entries and idle orphans, keeps live flows and a closed
/// source-NATed flow whose port may not be reused yet, and leaves the IPv4
/// table alone.
#[test]
fn a_collector_pass_over_the_kernel_ipv6_table() {
    let (_ebpf, mut maps) = crate::support::load(&capacities(64));
    let now = expiry::monotonic_ns();
    let minute_ago = now - 60 * S;
    let fin = ct_state::FIN;
    let live = flow(1, 40001, (ct_state::ACKED, ct_state::REPLIED), 0, now);
    let closed = flow(
        1,
        40002,
        (fin, ct_state::REPLIED | fin),
        ct_flags::CLOSING,
        minute_ago,
    );
    let closed_snat = flow(
        1,
        40003,
        (fin, ct_state::REPLIED | fin),
        ct_flags::CLOSING | ct_flags::SNAT,
        minute_ago,
    );
    let [_, orphan] = flow(1, 40004, (0, ct_state::REPLIED), 0, minute_ago);
    for (k, v) in live
        .iter()
        .chain(&closed)
        .chain(&closed_snat)
        .chain([&orphan])
    {
        maps.conntrack6.insert(k, v, 0).expect("write SB_CT6_V1");
    }
    let v4 = (
        CtKey {
            saddr_be: u32::from_ne_bytes([10, 0, 0, 2]),
            daddr_be: u32::from_ne_bytes([10, 96, 0, 10]),
            sport_be: 40002u16.to_be(),
            dport_be: 80u16.to_be(),
            proto: proto::TCP,
            dir: ct_dir::FORWARD,
            _pad: [0; 2],
        },
        CtEntry {
            service_id: 1,
            last_seen_ns: minute_ago,
            ..CtEntry::default()
        },
    );
    maps.conntrack
        .insert(v4.0, v4.1, 0)
        .expect("write SB_CT_V5");

    let pass = expiry::collect(&mut maps.conntrack6, now, &Timeouts::default()).expect("collect");
    assert_eq!(
        pass,
        Pass {
            entries: 7,
            deleted: 3
        }
    );
    let present = |k: &CtKey6| maps.conntrack6.get(k, 0).is_ok();
    assert!(live.iter().all(|(k, _)| present(k)), "the live flow stays");
    assert!(
        closed_snat.iter().all(|(k, _)| present(k)),
        "its port is not free for 65 s"
    );
    assert!(
        closed.iter().all(|(k, _)| !present(k)),
        "the closed flow goes whole"
    );
    assert!(!present(&orphan.0), "the idle orphan goes");
    assert!(
        maps.conntrack.get(&v4.0, 0).is_ok(),
        "the IPv4 table is not this pass's"
    );
    assert_eq!(maps.conntrack6_len(), 4);
}

/// The sync's purges of a removed service (or a departed UDP backend) for
/// the IPv6 tables remove exactly the selected entries.
#[test]
fn ipv6_purges_remove_the_selected_entries() {
    let (_ebpf, mut maps) = crate::support::load(&capacities(64));
    let now = expiry::monotonic_ns();
    for (k, v) in flow(1, 40001, (0, 0), 0, now)
        .iter()
        .chain(&flow(2, 40002, (0, 0), 0, now))
    {
        maps.conntrack6.insert(k, v, 0).expect("write SB_CT6_V1");
    }
    let socket = |cookie: u64, service_id: u32| {
        (
            SockKey6 {
                cookie,
                addr_be: addr("fd00:244::5"),
                port_be: 53u16.to_be(),
                proto: proto::UDP,
                dir: proxy_common::sock_dir::REVERSE,
                _pad: [0; 4],
            },
            SockEntry6 {
                addr_be: addr("fd00:96::10"),
                port_be: 53u16.to_be(),
                backend_id: 3,
                service_id,
                ..SockEntry6::default()
            },
        )
    };
    for (k, v) in [socket(7, 1), socket(8, 2)] {
        maps.sockets6.insert(k, v, 0).expect("write SB_SOCK6_V1");
    }
    assert_eq!(maps.purge_conntrack6(&|_, e| e.service_id == 1), 2);
    assert_eq!(maps.conntrack6_len(), 2);
    assert!(maps
        .conntrack6
        .iter()
        .filter_map(Result::ok)
        .all(|(_, e)| e.service_id == 2));
    let gone = maps.purge_sockets6(&|_, e| e.service_id == 1);
    assert_eq!(gone, [socket(7, 1).0]);
    assert_eq!(maps.sockets6_len(), 1);
}

/// A bpffs of the test's own, unmounted (and its directory removed) on drop.
struct Bpffs(PathBuf);

impl Bpffs {
    fn mount() -> Self {
        Self::mount_at("collector6")
    }

    /// A bpffs at a directory named after `tag` and this process.
    fn mount_at(tag: &str) -> Self {
        let dir = PathBuf::from(format!(
            "/run/switchboard-test/{tag}-{}",
            std::process::id()
        ));
        let _ = umount(&dir);
        std::fs::create_dir_all(&dir).expect("create the pin root");
        let fs = Self(dir);
        let status = Command::new("mount")
            .args(["-t", "bpf", "bpf"])
            .arg(&fs.0)
            .status()
            .expect("run mount");
        assert!(status.success(), "mount -t bpf on {}", fs.0.display());
        fs
    }
}

fn umount(dir: &Path) -> io::Result<()> {
    let path =
        std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).map_err(io::Error::other)?;
    // SAFETY: `path` is a NUL-terminated path; MNT_DETACH unmounts lazily.
    match unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        let _ = umount(&self.0);
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// An agent whose pin root holds the IPv4 maps but no IPv6 tables (pinned
/// by an agent from before IPv6) creates and pins the IPv6 tables, adopts
/// the IPv4 flows, and starts the collector on both.
#[test]
fn an_agent_finding_no_ipv6_tables_pinned_creates_them() {
    require_root();
    let fs = Bpffs::mount();
    let pin_root = fs.0.as_path();
    let caps = capacities(64);
    let v4 = CtKey {
        saddr_be: u32::from_ne_bytes([10, 0, 0, 2]),
        daddr_be: u32::from_ne_bytes([10, 96, 0, 10]),
        sport_be: 40000u16.to_be(),
        dport_be: 80u16.to_be(),
        proto: proto::TCP,
        dir: ct_dir::FORWARD,
        _pad: [0; 2],
    };
    {
        let mut ebpf = object::load(
            proxy_object::SWITCHBOARD,
            pin_root,
            &caps,
            &FlowSizes::at_max(&caps),
            &[],
        )
        .expect("first load")
        .ebpf;
        let mut maps = PinnedMaps::take(&mut ebpf).expect("maps");
        maps.conntrack
            .insert(v4, CtEntry::default(), 0)
            .expect("write SB_CT_V5");
    }
    for name in [names::CONNTRACK6, names::SOCKETS6] {
        std::fs::remove_file(pin_root.join(name)).expect("unpin");
    }
    assert!(
        PinnedMaps::open(pin_root).is_err(),
        "the agent's open needs the IPv6 pins"
    );

    let _ebpf = object::load(
        proxy_object::SWITCHBOARD,
        pin_root,
        &caps,
        &FlowSizes::at_max(&caps),
        &[],
    )
    .expect("load onto the older pin root");
    for name in [names::CONNTRACK6, names::SOCKETS6] {
        assert!(pin_root.join(name).exists(), "{name} pinned");
    }
    let mut maps = PinnedMaps::open(pin_root).expect("open every pin");
    assert!(
        maps.conntrack.get(&v4, 0).is_ok(),
        "the IPv4 flow was adopted"
    );
    assert_eq!(maps.conntrack6_len(), 0);

    // The CLI reads both tables from the pins.
    let now = expiry::monotonic_ns();
    for (k, v) in flow(1, 40001, (ct_state::ACKED, ct_state::REPLIED), 0, now) {
        maps.conntrack6.insert(k, v, 0).expect("write SB_CT6_V1");
    }
    let rows = cli(pin_root, &["conntrack", "list", "-o", "json"]);
    let rows = rows.as_array().expect("a list");
    let shown: Vec<(&str, &str, &str)> = rows
        .iter()
        .map(|r| {
            (
                r["family"].as_str().expect("family"),
                r["destination"].as_str().expect("destination"),
                r["state"].as_str().expect("state"),
            )
        })
        .collect();
    assert_eq!(shown.len(), 3, "{rows:?}");
    assert!(
        shown.contains(&("ipv4", "10.96.0.10:80", "orphan")),
        "{shown:?}"
    );
    assert!(
        shown.contains(&("ipv6", "[fd00:96::10]:80", "established")),
        "{shown:?}"
    );
    assert!(
        shown.contains(&("ipv6", "[fd00::2]:40001", "established")),
        "{shown:?}"
    );
    let v6_only = cli(
        pin_root,
        &["conntrack", "list", "--family", "ipv6", "-o", "json"],
    );
    assert_eq!(v6_only.as_array().map(Vec::len), Some(2));
    let stats = cli(pin_root, &["stats", "-o", "json"]);
    let fill = |name: &str| {
        stats["maps"]
            .as_array()
            .and_then(|maps| maps.iter().find(|m| m["map"] == name))
            .map(|m| (m["entries"].as_u64(), m["capacity"].as_u64()))
    };
    assert_eq!(fill(names::CONNTRACK), Some((Some(1), Some(64))), "{stats}");
    assert_eq!(
        fill(names::CONNTRACK6),
        Some((Some(2), Some(64))),
        "{stats}"
    );
    assert_eq!(fill(names::SOCKETS6), Some((Some(0), Some(64))), "{stats}");
    let flushed = cli(
        pin_root,
        &["conntrack", "flush", "--family", "ipv6", "-o", "json"],
    );
    assert_eq!(flushed["removed"], 2);
    assert_eq!(maps.conntrack6_len(), 0);
    assert_eq!(maps.conntrack_len(), 1, "--family ipv6 leaves IPv4 flows");

    let open_flows = proxy_user::dataplane::flows::open_counts::LeastConnMaps {
        counts: aya::maps::HashMap::create(16, 0).expect("a count map"),
        sockets: aya::maps::HashMap::create(16, 0).expect("a socket map"),
    };
    expiry::spawn(
        pin_root,
        Timeouts::default(),
        GcMetrics::default(),
        open_flows,
        Candidates::default(),
    )
    .expect("the collector starts");
}

/// `switchboard explain` on an IPv6 flow reads the pinned SB_CT6_V1 (the
/// tracked flow keeps its backend) and SB_AFFINITY6_V1 (another port of
/// the same client sticks to its backend).
#[test]
fn explain_reads_ipv6_conntrack_and_affinity_from_the_pins() {
    require_root();
    let fs = Bpffs::mount_at("collector6-explain");
    let pin_root = fs.0.as_path();
    let caps = capacities(64);
    let mut ebpf = object::load(
        proxy_object::SWITCHBOARD,
        pin_root,
        &caps,
        &FlowSizes::at_max(&caps),
        &[],
    )
    .expect("load")
    .ebpf;
    let mut maps = PinnedMaps::take(&mut ebpf).expect("maps");
    let (vip, service) = ("fd00:96::10", 5u32);
    let fe = |slot: u16| proxy_common::FrontendKey6 {
        addr_be: addr(vip),
        port_be: 80u16.to_be(),
        proto: proto::TCP,
        scope: proxy_common::scope::INTERNAL,
        slot,
        _pad1: [0; 2],
    };
    let head = proxy_common::FrontendSlot {
        service_id: service,
        backend_count: 2,
        flags: proxy_common::frontend_flags::AFFINITY_CLIENT_IP,
        affinity_timeout_s: 600,
        ..Default::default()
    };
    maps.frontends6
        .insert(fe(0), head, 0)
        .expect("write SB_FE6_V1");
    for (slot, id, pod) in [(1u16, 21u32, "fd00:244::5"), (2, 22, "fd00:244::6")] {
        let slot_value = proxy_common::FrontendSlot {
            backend_id: id,
            service_id: service,
            ..Default::default()
        };
        maps.frontends6
            .insert(fe(slot), slot_value, 0)
            .expect("write SB_FE6_V1");
        let backend = proxy_common::Backend6 {
            addr_be: addr(pod),
            port_be: 8080u16.to_be(),
            proto: proto::TCP,
            flags: 0,
        };
        maps.backends6
            .insert(id, backend, 0)
            .expect("write SB_BE6_V1");
    }
    let now = expiry::monotonic_ns();
    let client = "fd00:244::99";
    let tracked = CtKey6 {
        saddr_be: addr(client),
        daddr_be: addr(vip),
        sport_be: 40000u16.to_be(),
        dport_be: 80u16.to_be(),
        proto: proto::TCP,
        dir: ct_dir::FORWARD,
        _pad: [0; 2],
    };
    let entry = CtEntry6 {
        backend_id: 22,
        service_id: service,
        nat_addr_be: addr("fd00:244::6"),
        nat_port_be: 8080u16.to_be(),
        created_ns: now,
        last_seen_ns: now,
        ..CtEntry6::default()
    };
    maps.conntrack6
        .insert(tracked, entry, 0)
        .expect("write SB_CT6_V1");
    let mut affinity: aya::maps::HashMap<
        _,
        proxy_common::AffinityKey6,
        proxy_common::AffinityEntry,
    > = aya::maps::Map::from_map_data(
        aya::maps::MapData::from_pin(pin_root.join(names::AFFINITY6))
            .expect("SB_AFFINITY6_V1 pinned"),
    )
    .expect("a map")
    .try_into()
    .expect("the affinity layout");
    let akey = proxy_common::AffinityKey6 {
        client_addr_be: addr(client),
        service_id: service,
    };
    let aentry = proxy_common::AffinityEntry {
        backend_id: 21,
        slot: 1,
        last_used_ns: now,
        ..Default::default()
    };
    affinity
        .insert(akey, aentry, 0)
        .expect("write SB_AFFINITY6_V1");

    let explain = |from: &str| {
        cli_with_stderr(
            pin_root,
            &[
                "explain",
                "[fd00:96::10]:80/TCP",
                "--from",
                from,
                "--scope",
                "internal",
                "-o",
                "json",
            ],
        )
        .0
    };
    let e = explain("[fd00:244::99]:40000");
    assert_eq!(e["backend"], "[fd00:244::6]:8080", "{e}");
    assert!(e["reasons"].to_string().contains("tracked flow"), "{e}");
    let e = explain("[fd00:244::99]:40001");
    assert_eq!(e["backend"], "[fd00:244::5]:8080", "{e}");
    assert!(
        e["reasons"]
            .to_string()
            .contains("sessionAffinity: ClientIP: fd00:244::99"),
        "{e}"
    );
    // Another client: no entry in either table.
    let e = explain("[fd00:244::98]:40000");
    assert_eq!(e["backend"], serde_json::Value::Null, "{e}");
    drop(ebpf);
}

/// The `switchboard` binary (a crate of its own): `SWITCHBOARD_BIN`, as
/// `cargo xtask test` sets it, or the one cargo built beside this test.
fn switchboard_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("SWITCHBOARD_BIN") {
        return PathBuf::from(bin);
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("switchboard")));
    match beside {
        Some(bin) if bin.is_file() => bin,
        _ => panic!(
            "no switchboard binary: set SWITCHBOARD_BIN or build it first \
             (`cargo build --release -p switchboard`; `cargo xtask test` does both)"
        ),
    }
}

/// Runs the CLI; its stdout as JSON and its stderr.
fn cli_with_stderr(pin_root: &Path, args: &[&str]) -> (serde_json::Value, String) {
    let out = Command::new(switchboard_bin())
        .args(args)
        .arg("--pin-root")
        .arg(pin_root)
        .output()
        .expect("run switchboard");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "switchboard {args:?}: {stderr}");
    (serde_json::from_slice(&out.stdout).expect("JSON"), stderr)
}

/// `switchboard ARGS --pin-root PIN_ROOT`'s JSON output.
fn cli(pin_root: &Path, args: &[&str]) -> serde_json::Value {
    cli_with_stderr(pin_root, args).0
}

/// `SO_COOKIE` of a socket.
fn cookie(socket: &UdpSocket) -> u64 {
    let mut cookie = 0u64;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: `cookie` has room for the u64 SO_COOKIE writes, `len` says so.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    assert_eq!(rc, 0, "SO_COOKIE: {}", io::Error::last_os_error());
    cookie
}

/// A destroyed UDP socket: its owner's next receive fails with
/// ECONNABORTED, and it is connected no more.
fn assert_destroyed(socket: &UdpSocket) {
    socket.set_nonblocking(true).expect("nonblocking");
    let error = socket.recv(&mut [0u8; 8]).expect_err("destroyed");
    assert_eq!(error.raw_os_error(), Some(libc::ECONNABORTED), "{error}");
    assert!(socket.peer_addr().is_err(), "still connected");
}

/// In a network namespace of its own: connected IPv6 UDP sockets whose
/// peer left are destroyed (see [`assert_destroyed`]), an
/// IPv6 socket connected to an IPv4 peer (mapped) too, and a socket whose
/// peer is another is left alone.
#[test]
fn departed_peers_ipv6_udp_sockets_are_closed() {
    in_new_netns(|| {
        ip(&["link", "set", "lo", "up"]);

        let server6 = UdpSocket::bind("[::1]:0").expect("bind ::1");
        let other6 = UdpSocket::bind("[::1]:0").expect("bind ::1");
        let server4 = UdpSocket::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let port6 = server6.local_addr().expect("addr").port();
        let port4 = server4.local_addr().expect("addr").port();
        let doomed6 = UdpSocket::bind("[::1]:0").expect("bind");
        doomed6
            .connect(server6.local_addr().expect("addr"))
            .expect("connect");
        let kept6 = UdpSocket::bind("[::1]:0").expect("bind");
        kept6
            .connect(other6.local_addr().expect("addr"))
            .expect("connect");
        let mapped = UdpSocket::bind("[::]:0").expect("bind ::");
        mapped
            .connect(format!("[::ffff:127.0.0.1]:{port4}"))
            .expect("connect to a mapped address");

        let peers: HashMap<u64, SocketAddr> = [
            (
                cookie(&doomed6),
                SocketAddr::from((Ipv6Addr::LOCALHOST, port6)),
            ),
            // Recorded with the port of the socket it does not talk to.
            (
                cookie(&kept6),
                SocketAddr::from((Ipv6Addr::LOCALHOST, port6)),
            ),
        ]
        .into_iter()
        .collect();
        let closed = udp_sockets::close_udp_peers(&peers).expect("sock_diag");
        assert_eq!(
            closed,
            udp_sockets::Closed {
                closed: 1,
                refused: vec![],
                unfound: 0,
            }
        );
        assert_destroyed(&doomed6);
        kept6.send(b"x").expect("untouched");
        assert!(kept6.peer_addr().is_ok());

        let backend = BackendAddr {
            ip: "127.0.0.1".parse().expect("address"),
            port: port4,
        };
        let doomed: HashMap<u64, BackendAddr> = [(cookie(&mapped), backend)].into_iter().collect();
        let closed = udp_sockets::close_udp_sockets(&doomed, Vec::new).expect("sock_diag");
        assert_eq!(closed.closed, 1);
        assert_destroyed(&mapped);
    });
}

/// A pod's connected UDP socket, balanced at `connect()` like the node's:
/// the agent does not find it in its own namespace, so it looks in the
/// namespaces it is given (a pod's), destroys it there, and leaves the
/// pod's other sockets alone.
#[test]
fn a_departed_peers_udp_socket_in_another_namespace_is_closed() {
    use std::sync::mpsc;

    // The agent's namespace, and the pod's on a thread of its own inside it.
    in_new_netns(|| {
        let (to_agent, from_pod) = mpsc::channel();
        let (to_pod, from_agent) = mpsc::channel::<()>();
        let pod = std::thread::spawn(move || {
            in_new_netns(move || {
                ip(&["link", "set", "lo", "up"]);
                let server = UdpSocket::bind("127.0.0.1:0").expect("bind");
                let doomed = UdpSocket::bind("127.0.0.1:0").expect("bind");
                doomed
                    .connect(server.local_addr().expect("addr"))
                    .expect("connect");
                let kept = UdpSocket::bind("127.0.0.1:0").expect("bind");
                kept.connect(doomed.local_addr().expect("addr"))
                    .expect("connect");
                // SAFETY: gettid has no preconditions.
                let tid = unsafe { libc::gettid() };
                let handle = PathBuf::from(format!("/proc/self/task/{tid}/ns/net"));
                let peer = server.local_addr().expect("addr");
                to_agent
                    .send((handle, cookie(&doomed), cookie(&kept), peer))
                    .expect("to the agent");
                from_agent.recv().expect("the agent searched");
                assert_destroyed(&doomed);
                kept.send(b"x").expect("untouched");
                assert!(kept.peer_addr().is_ok());
            })
        });
        let (handle, doomed, kept, peer) = from_pod.recv().expect("the pod's sockets");
        let backend = BackendAddr {
            ip: peer.ip(),
            port: peer.port(),
        };
        let elsewhere = BackendAddr {
            ip: peer.ip(),
            port: peer.port().wrapping_add(1),
        };
        // `kept` is recorded with a peer it does not talk to.
        let departed: HashMap<u64, BackendAddr> =
            [(doomed, backend), (kept, elsewhere)].into_iter().collect();
        let closed = udp_sockets::close_udp_sockets(&departed, || vec![handle]).expect("sock_diag");
        // `kept` talks to another peer: found in no namespace as recorded.
        assert_eq!((closed.closed, closed.unfound), (1, 1), "{closed:?}");
        to_pod.send(()).expect("to the pod");
        pod.join().expect("the pod's thread");
    });
}
