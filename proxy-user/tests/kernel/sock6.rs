//! The IPv6 socket layer on a real kernel (root only): `connect6`, `sendmsg6`,
//! `recvmsg6`, `getpeername6` and `sock_release`, attached to a cgroup this
//! test creates (never the root cgroup), exercised by real sockets.
//!
//! Each test loads the object unpinned, writes its frontends and backends
//! straight into the maps (`SB_FE6_V1`/`SB_BE6_V1`, and `SB_FE_V1`/`SB_BE_V1`
//! for the IPv4-mapped case), attaches the socket programs to a fresh child of
//! the cgroup2 mount, and then, on a thread of its own that first moves into a
//! private network namespace (`unshare(CLONE_NEWNET)`: the thread and the `ip`
//! commands and threads it spawns), puts the backend addresses on `lo`
//! (`nodad`), runs TCP and UDP servers on them, and moves the test process
//! into the cgroup only while its clients create their sockets (cgroup
//! hooks apply to sockets created inside the cgroup). The frontend addresses
//! exist nowhere: only the socket layer can make them answer.
//!
//! Nothing here touches the namespace or the cgroup the tests were started in
//! beyond moving this process out of its cgroup and back.
use std::{
    collections::BTreeSet,
    fs,
    io::{ErrorKind, Read as _, Write as _},
    net::{
        IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, TcpListener, TcpStream, UdpSocket,
    },
    path::PathBuf,
    sync::Mutex,
    thread,
    time::Duration,
};

use crate::support::{
    capacities,
    netns::{in_new_netns, ip},
    require_root,
};
use aya::{
    maps::{Array, HashMap, PerCpuArray, SkStorage},
    programs::{CgroupAttachMode, CgroupSock, CgroupSockAddr},
    Ebpf,
};
use proxy_common::{
    addr6_be, frontend_flags, names, programs, proto, scope, sock_conn_flags, sock_dir, stat,
    Backend, Backend6, Config, FrontendKey, FrontendKey6, FrontendSlot, SockConn6, SockEntry6,
    SockKey6,
};
use proxy_user::dataplane::{attach::socket_layer, load::object};

/// An IPv6 Service: TCP on 80, UDP on 53, over two backends.
const FE6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x10);
/// An IPv6 Service without endpoints.
const FE6_EMPTY: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x11);
const BE6: [Ipv6Addr; 2] = [
    Ipv6Addr::new(0xfd00, 0x10, 0, 1, 0, 0, 0, 2),
    Ipv6Addr::new(0xfd00, 0x10, 0, 2, 0, 0, 0, 2),
];
/// An IPv4 Service (reached through `::ffff:10.96.0.10`) and its backends.
const FE4: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const BE4: [Ipv4Addr; 2] = [Ipv4Addr::new(10, 244, 1, 2), Ipv4Addr::new(10, 244, 2, 2)];
const TCP_PORT: u16 = 80;
const UDP_PORT: u16 = 53;
const POD_TCP: u16 = 8080;
const POD_UDP: u16 = 5353;
/// Enough attempts that both backends of a random pick show up (a miss is
/// 2 in 2^20).
const ATTEMPTS: usize = 20;

/// One test at a time moves this process between cgroups.
static SERIAL: Mutex<()> = Mutex::new(());

// ---------------------------------------------------------------------------
// Maps.

fn key6(addr: Ipv6Addr, port: u16, protocol: u8, slot: u16) -> FrontendKey6 {
    FrontendKey6 {
        addr_be: addr6_be(addr.octets()),
        port_be: port.to_be(),
        proto: protocol,
        scope: scope::INTERNAL,
        slot,
        _pad1: [0; 2],
    }
}

fn key4(addr: Ipv4Addr, port: u16, protocol: u8, slot: u16) -> FrontendKey {
    FrontendKey {
        addr_be: u32::from_ne_bytes(addr.octets()),
        port_be: port.to_be(),
        proto: protocol,
        scope: scope::INTERNAL,
        slot,
        _pad1: [0; 2],
    }
}

fn slot0(service_id: u32, backend_count: u16) -> FrontendSlot {
    FrontendSlot {
        backend_id: 0,
        service_id,
        backend_count,
        flags: 0,
        affinity_timeout_s: 0,
    }
}

fn slot(service_id: u32, backend_id: u32) -> FrontendSlot {
    FrontendSlot {
        backend_id,
        ..slot0(service_id, 0)
    }
}

/// Writes the IPv6 frontends (TCP and UDP of [`FE6`] and of [`FE6_EMPTY`])
/// and the IPv4 ones (TCP and UDP of [`FE4`]), as the agent would: backend
/// ids and service ids from one space shared by both families.
fn program_maps(ebpf: &mut Ebpf) {
    {
        let mut be6: HashMap<_, u32, Backend6> =
            HashMap::try_from(ebpf.map_mut(names::BACKENDS6).expect("SB_BE6_V1")).expect("typed");
        for (i, ip) in BE6.iter().enumerate() {
            for (offset, (port, protocol)) in [(POD_TCP, proto::TCP), (POD_UDP, proto::UDP)]
                .into_iter()
                .enumerate()
            {
                let backend = Backend6 {
                    addr_be: addr6_be(ip.octets()),
                    port_be: port.to_be(),
                    proto: protocol,
                    flags: 0,
                };
                let id = 1 + i as u32 + 10 * offset as u32;
                be6.insert(id, backend, 0).expect("write SB_BE6_V1");
            }
        }
    }
    {
        let mut fe6: HashMap<_, FrontendKey6, FrontendSlot> =
            HashMap::try_from(ebpf.map_mut(names::FRONTENDS6).expect("SB_FE6_V1")).expect("typed");
        // Service 1: FE6 TCP over backends 1 and 2; service 2: FE6 UDP over
        // 11 and 12; services 3 and 6: FE6_EMPTY TCP and UDP, no endpoints.
        for (service, port, protocol, first_id) in
            [(1, TCP_PORT, proto::TCP, 1), (2, UDP_PORT, proto::UDP, 11)]
        {
            fe6.insert(key6(FE6, port, protocol, 0), slot0(service, 2), 0)
                .expect("write SB_FE6_V1");
            for s in 1..=2u16 {
                let id = first_id + u32::from(s) - 1;
                fe6.insert(key6(FE6, port, protocol, s), slot(service, id), 0)
                    .expect("write SB_FE6_V1");
            }
        }
        for (service, port, protocol) in [(3, TCP_PORT, proto::TCP), (6, UDP_PORT, proto::UDP)] {
            fe6.insert(key6(FE6_EMPTY, port, protocol, 0), slot0(service, 0), 0)
                .expect("write SB_FE6_V1");
        }
    }
    {
        let mut be4: HashMap<_, u32, Backend> =
            HashMap::try_from(ebpf.map_mut(names::BACKENDS).expect("SB_BE_V1")).expect("typed");
        for (i, ip) in BE4.iter().enumerate() {
            for (offset, (port, protocol)) in [(POD_TCP, proto::TCP), (POD_UDP, proto::UDP)]
                .into_iter()
                .enumerate()
            {
                let backend = Backend {
                    addr_be: u32::from_ne_bytes(ip.octets()),
                    port_be: port.to_be(),
                    proto: protocol,
                    flags: 0,
                };
                let id = 21 + i as u32 + 10 * offset as u32;
                be4.insert(id, backend, 0).expect("write SB_BE_V1");
            }
        }
    }
    {
        let mut fe4: HashMap<_, FrontendKey, FrontendSlot> =
            HashMap::try_from(ebpf.map_mut(names::FRONTENDS).expect("SB_FE_V1")).expect("typed");
        // Service 4: FE4 TCP over 21 and 22; service 5: FE4 UDP over 31 and 32.
        for (service, port, protocol, first_id) in
            [(4, TCP_PORT, proto::TCP, 21), (5, UDP_PORT, proto::UDP, 31)]
        {
            fe4.insert(key4(FE4, port, protocol, 0), slot0(service, 2), 0)
                .expect("write SB_FE_V1");
            for s in 1..=2u16 {
                let id = first_id + u32::from(s) - 1;
                fe4.insert(key4(FE4, port, protocol, s), slot(service, id), 0)
                    .expect("write SB_FE_V1");
            }
        }
    }
    mark_frontends(ebpf);
}

/// Sets the frontend bitmap's bits of every frontend above, as the agent
/// does before it writes a frontend: the socket hooks look a destination up
/// only where its bits are set.
fn mark_frontends(ebpf: &mut Ebpf) {
    use proxy_common::prefilter::frontends::{bit4, bit6, port_bit, shift_for, word_and_mask};
    let mut filter: Array<_, u64> = Array::try_from(
        ebpf.map_mut(names::FRONTEND_FILTER)
            .expect("SB_FE_FILTER_V3"),
    )
    .expect("typed");
    let shift = shift_for(filter.len());
    let ports = [(TCP_PORT, proto::TCP), (UDP_PORT, proto::UDP)];
    let addr_bits = [
        bit6(&addr6_be(FE6.octets()), shift),
        bit6(&addr6_be(FE6_EMPTY.octets()), shift),
        bit4(u32::from_ne_bytes(FE4.octets()), shift),
    ];
    for addr_bit in addr_bits {
        let port_bits =
            ports.map(|(port, protocol)| port_bit(addr_bit, port.to_be(), protocol, shift));
        for bit in [addr_bit].into_iter().chain(port_bits) {
            let (word, mask) = word_and_mask(bit);
            let old = filter.get(&word, 0).expect("read SB_FE_FILTER_V3");
            filter
                .set(word, old | mask, 0)
                .expect("write SB_FE_FILTER_V3");
        }
    }
}

/// Global counter `index`, summed over CPUs.
fn counter(ebpf: &Ebpf, index: u32) -> u64 {
    let stats: PerCpuArray<_, u64> =
        PerCpuArray::try_from(ebpf.map(names::GLOBAL_STATS).expect("SB_STATS_V5")).expect("typed");
    stats.get(&index, 0).expect("read counter").iter().sum()
}

// ---------------------------------------------------------------------------
// The cgroup.

/// A child of the cgroup2 mount, with the socket programs attached; removed
/// on drop, after this process has left it.
struct TestCgroup {
    path: PathBuf,
    /// The cgroup this process came from.
    home: PathBuf,
}

impl TestCgroup {
    fn create(name: &str) -> Self {
        let root = socket_layer::find_cgroup_root().expect("a cgroup2 mount");
        let own = fs::read_to_string("/proc/self/cgroup").expect("/proc/self/cgroup");
        let relative = own
            .lines()
            .find_map(|line| line.strip_prefix("0::"))
            .expect("a cgroup2 entry in /proc/self/cgroup");
        let home = root.join(relative.trim_start_matches('/'));
        let path = root.join(format!("sb-test-{name}-{}", std::process::id()));
        assert_ne!(path, root, "never the root cgroup");
        let _ = fs::remove_dir(&path);
        fs::create_dir(&path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        Self { path, home }
    }

    fn attach(&self, ebpf: &mut Ebpf) {
        let dir = fs::File::open(&self.path).expect("open the test cgroup");
        for name in programs::SOCKET_LB {
            let prog: &mut CgroupSockAddr = crate::support::loaded_program(ebpf, name);
            prog.attach(&dir, CgroupAttachMode::Single)
                .unwrap_or_else(|e| panic!("attaching {name}: {e}"));
        }
        let prog: &mut CgroupSock = crate::support::loaded_program(ebpf, programs::SOCK_RELEASE);
        prog.attach(&dir, CgroupAttachMode::Single)
            .expect("attaching sock_release");
    }

    fn member(&self) -> Member {
        Member {
            path: self.path.clone(),
            home: self.home.clone(),
        }
    }
}

/// What a thread needs to move the process into the test cgroup and back.
#[derive(Clone)]
struct Member {
    path: PathBuf,
    home: PathBuf,
}

impl Member {
    /// Runs `body` with this process inside the cgroup: sockets it creates
    /// are the cgroup's.
    fn inside<T>(&self, body: impl FnOnce() -> T) -> T {
        move_to(&self.path);
        let guard = Leave(&self.home);
        let value = body();
        drop(guard);
        value
    }
}

/// Moves the process back to its cgroup, even when the body panics.
struct Leave<'a>(&'a PathBuf);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        move_to(self.0);
    }
}

fn move_to(cgroup: &std::path::Path) {
    let procs = cgroup.join("cgroup.procs");
    fs::write(&procs, std::process::id().to_string())
        .unwrap_or_else(|e| panic!("moving into {}: {e}", procs.display()));
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // A cgroup whose last process just left may take a moment to empty.
        for _ in 0..50 {
            if fs::remove_dir(&self.path).is_ok() {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        eprintln!("could not remove {}", self.path.display());
    }
}

// ---------------------------------------------------------------------------
// The namespace and its servers.

/// Runs `body` on a thread of its own inside a new network namespace whose
/// `lo` carries the backend addresses and servers; re-raises its panic. The
/// servers' threads stay in that namespace until the process exits.
fn in_netns<T: Send>(body: impl FnOnce() -> T + Send) -> T {
    in_new_netns(|| {
        ip(&["link", "set", "lo", "up"]);
        for be in BE6 {
            ip(&[
                "-6",
                "addr",
                "add",
                &format!("{be}/128"),
                "dev",
                "lo",
                "nodad",
            ]);
        }
        for be in BE4 {
            ip(&["addr", "add", &format!("{be}/32"), "dev", "lo"]);
        }
        let backends = BE6
            .iter()
            .map(|&a| IpAddr::from(a))
            .chain(BE4.iter().map(|&a| IpAddr::from(a)));
        for addr in backends {
            serve_tcp(SocketAddr::new(addr, POD_TCP));
            serve_udp(SocketAddr::new(addr, POD_UDP));
        }
        body()
    })
}

/// A TCP server that writes its own address to every connection. Its thread
/// lives in the namespace and blocks in accept until the process exits.
fn serve_tcp(at: SocketAddr) {
    let listener = TcpListener::bind(at).unwrap_or_else(|e| panic!("bind {at}: {e}"));
    thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut stream = stream;
            let _ = stream.write_all(at.ip().to_string().as_bytes());
        }
    });
}

/// A UDP server that answers every datagram with its own address.
fn serve_udp(at: SocketAddr) {
    let socket = UdpSocket::bind(at).unwrap_or_else(|e| panic!("bind {at}: {e}"));
    thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((_, from)) = socket.recv_from(&mut buf) {
            let _ = socket.send_to(at.ip().to_string().as_bytes(), from);
        }
    });
}

/// One TCP connection: the backend that answered and the peer the client saw.
fn tcp_once(to: SocketAddr) -> std::io::Result<(String, SocketAddr)> {
    let mut stream = TcpStream::connect_timeout(&to, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    let peer = stream.peer_addr()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok((answer, peer))
}

/// One datagram and its answer on `socket`: the backend that answered and
/// the source the client saw.
fn udp_once(socket: &UdpSocket, to: SocketAddr) -> (String, SocketAddr) {
    socket
        .send_to(b"hello", to)
        .unwrap_or_else(|e| panic!("send_to {to}: {e}"));
    let mut buf = [0u8; 512];
    let (len, from) = socket
        .recv_from(&mut buf)
        .unwrap_or_else(|e| panic!("recv_from ({to}): {e}"));
    (String::from_utf8_lossy(&buf[..len]).into_owned(), from)
}

fn udp_client() -> UdpSocket {
    let socket = UdpSocket::bind((Ipv6Addr::UNSPECIFIED, 0)).expect("bind [::]:0");
    socket
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    socket
}

fn mapped(v4: Ipv4Addr, port: u16) -> SocketAddr {
    SocketAddr::V6(SocketAddrV6::new(v4.to_ipv6_mapped(), port, 0, 0))
}

fn names_of(list: &[Ipv6Addr]) -> BTreeSet<String> {
    list.iter().map(ToString::to_string).collect()
}

// ---------------------------------------------------------------------------
// The world: the object loaded and programmed, the cgroup with its hooks.

struct World {
    // Dropped first: the programs detach before the cgroup goes.
    ebpf: Ebpf,
    cgroup: TestCgroup,
}

fn world(name: &str) -> World {
    require_root();
    let mut ebpf = object::load_unpinned_maps_as(
        proxy_object::SWITCHBOARD,
        &capacities(1024),
        &proxy_user::dataplane::load::ip_summed::Access::detect(),
    )
    .expect("load the eBPF object");
    program_maps(&mut ebpf);
    let cgroup = TestCgroup::create(name);
    cgroup.attach(&mut ebpf);
    World { ebpf, cgroup }
}

/// The socket map's reverse entries of `protocol` (IPv6 map).
fn reverse_entries6(ebpf: &Ebpf, protocol: u8) -> usize {
    let socks: HashMap<_, SockKey6, SockEntry6> =
        HashMap::try_from(ebpf.map(names::SOCKETS6).expect("SB_SOCK6_V1")).expect("typed");
    socks
        .keys()
        .flatten()
        .filter(|k| k.dir == sock_dir::REVERSE && k.proto == protocol)
        .count()
}

/// The socket layer's counters as they were.
struct Counters {
    before: Vec<(u32, u64)>,
}

const SOCK_COUNTERS: [u32; 6] = [
    stat::SOCK_CONNECT,
    stat::SOCK_SENDMSG,
    stat::SOCK_REVERSED,
    stat::SOCK_NO_BACKEND,
    stat::SOCK_RESELECTED,
    stat::SOCK_RELEASED,
];

impl Counters {
    fn new(ebpf: &Ebpf) -> Self {
        let before = SOCK_COUNTERS
            .iter()
            .map(|&i| (i, counter(ebpf, i)))
            .collect();
        Self { before }
    }

    /// How much counter `index` grew since.
    fn grew(&self, ebpf: &Ebpf, index: u32) -> u64 {
        let (_, then) = self
            .before
            .iter()
            .find(|(i, _)| *i == index)
            .expect("tracked counter");
        counter(ebpf, index) - then
    }
}

/// TCP to an IPv6 frontend reaches both backends, and `getpeername` (the
/// client's `peer_addr`) shows the frontend, from the socket's own storage:
/// no socket-map entry is written, so none is left or removed at close.
#[test]
fn tcp_to_an_ipv6_frontend_is_balanced_and_shows_the_frontend_as_peer() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let w = world("sock6-tcp");
    let counters = Counters::new(&w.ebpf);
    let frontend = SocketAddr::from((FE6, TCP_PORT));
    let member = w.cgroup.member();
    let runs: Vec<(String, SocketAddr)> = in_netns(|| {
        member.inside(|| {
            (0..ATTEMPTS)
                .map(|_| tcp_once(frontend).unwrap_or_else(|e| panic!("connect {frontend}: {e}")))
                .collect()
        })
    });
    let reached: BTreeSet<String> = runs.iter().map(|(who, _)| who.clone()).collect();
    assert_eq!(reached, names_of(&BE6), "both backends answer: {runs:?}");
    assert!(
        runs.iter().all(|(_, peer)| *peer == frontend),
        "getpeername shows the frontend: {runs:?}"
    );
    assert_eq!(counters.grew(&w.ebpf, stat::SOCK_CONNECT), ATTEMPTS as u64);
    assert!(counters.grew(&w.ebpf, stat::SOCK_REVERSED) >= ATTEMPTS as u64);
    assert_eq!(
        counters.grew(&w.ebpf, stat::SOCK_RELEASED),
        0,
        "a TCP socket's frontend is in its storage, not the socket map"
    );
    assert_eq!(
        reverse_entries6(&w.ebpf, proto::TCP),
        0,
        "TCP sockets wrote socket-map entries"
    );
}

/// Unconnected UDP to an IPv6 frontend: one socket keeps its backend, new
/// sockets spread, and every reply's source (`recvmsg6`) is the frontend.
/// When the kept backend leaves, the socket's next datagram goes to a live
/// one. A connected UDP socket outside the node's namespace is not balanced
/// at connect (the tc layer checks its backend per datagram).
#[test]
fn unconnected_udp_to_an_ipv6_frontend_keeps_a_live_backend_and_replies_come_from_the_frontend() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut w = world("sock6-udp");
    let counters = Counters::new(&w.ebpf);
    let frontend = SocketAddr::from((FE6, UDP_PORT));
    let member = w.cgroup.member();
    let ebpf = &mut w.ebpf;
    let (shared, spread, moved) = in_netns(|| {
        let (socket, shared, spread) = member.inside(|| {
            let socket = udp_client();
            let shared: Vec<_> = (0..ATTEMPTS).map(|_| udp_once(&socket, frontend)).collect();
            let spread: Vec<_> = (0..ATTEMPTS)
                .map(|_| udp_once(&udp_client(), frontend))
                .collect();
            (socket, shared, spread)
        });
        // The shared socket's backend leaves: the agent would drop it from
        // the backend map and the frontend's slots.
        let kept = shared[0].0.parse::<Ipv6Addr>().expect("a backend address");
        let (gone, live) = match BE6.iter().position(|b| *b == kept) {
            Some(i) => (i, 1 - i),
            None => panic!("answered by {kept}, not a backend"),
        };
        remove_udp_backend6(ebpf, gone, live);
        let moved: Vec<_> = (0..5).map(|_| udp_once(&socket, frontend)).collect();
        // Outside the node's namespace (this one is not: the config names
        // none), a connected UDP socket is left to the tc layer: its peer
        // stays the frontend address itself. A route lets the connect succeed.
        ip(&["-6", "route", "add", "fd00:96::/64", "dev", "lo"]);
        let peer = member.inside(|| {
            let connected = udp_client();
            connected
                .connect(frontend)
                .expect("connect a UDP socket to the frontend");
            connected.peer_addr().expect("peer_addr")
        });
        assert_eq!(peer, frontend);
        (shared, spread, moved)
    });
    let backends: BTreeSet<String> = shared.iter().map(|(who, _)| who.clone()).collect();
    assert_eq!(backends.len(), 1, "one socket, one backend: {shared:?}");
    let reached: BTreeSet<String> = spread.iter().map(|(who, _)| who.clone()).collect();
    assert_eq!(reached, names_of(&BE6), "new sockets spread: {spread:?}");
    for (who, from) in shared.iter().chain(&spread).chain(&moved) {
        assert_eq!(*from, frontend, "the reply from {who} shows the frontend");
    }
    let kept = shared[0].0.clone();
    assert!(
        moved.iter().all(|(who, _)| *who != kept),
        "still sent to the departed backend {kept}: {moved:?}"
    );
    let grew = |index| counters.grew(&w.ebpf, index);
    assert_eq!(
        grew(stat::SOCK_SENDMSG),
        2 * ATTEMPTS as u64 + 5,
        "one per datagram"
    );
    assert_eq!(
        grew(stat::SOCK_RESELECTED),
        1,
        "once, when the backend left"
    );
    assert_eq!(
        grew(stat::SOCK_CONNECT),
        0,
        "a pod's connected UDP socket is not balanced at connect"
    );
}

/// Removes backend `gone` of the IPv6 UDP frontend: only `live` is left in
/// its slots, and `gone` leaves the backend map.
fn remove_udp_backend6(ebpf: &mut Ebpf, gone: usize, live: usize) {
    let live_id = 11 + live as u32;
    let gone_id = 11 + gone as u32;
    {
        let mut fe6: HashMap<_, FrontendKey6, FrontendSlot> =
            HashMap::try_from(ebpf.map_mut(names::FRONTENDS6).expect("SB_FE6_V1")).expect("typed");
        fe6.insert(key6(FE6, UDP_PORT, proto::UDP, 1), slot(2, live_id), 0)
            .expect("write SB_FE6_V1");
        fe6.insert(key6(FE6, UDP_PORT, proto::UDP, 0), slot0(2, 1), 0)
            .expect("write SB_FE6_V1");
        fe6.remove(&key6(FE6, UDP_PORT, proto::UDP, 2))
            .expect("remove slot 2");
    }
    let mut be6: HashMap<_, u32, Backend6> =
        HashMap::try_from(ebpf.map_mut(names::BACKENDS6).expect("SB_BE6_V1")).expect("typed");
    be6.remove(&gone_id).expect("remove the backend");
}

/// A frontend without endpoints refuses TCP connects and UDP sends with
/// ECONNREFUSED, as a kube-proxy reject does.
#[test]
fn an_ipv6_frontend_without_backends_refuses_with_econnrefused() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let w = world("sock6-empty");
    let counters = Counters::new(&w.ebpf);
    let member = w.cgroup.member();
    let (tcp, udp) = in_netns(|| {
        member.inside(|| {
            let tcp = TcpStream::connect_timeout(
                &SocketAddr::from((FE6_EMPTY, TCP_PORT)),
                Duration::from_secs(2),
            );
            let udp = udp_client().send_to(b"hello", SocketAddr::from((FE6_EMPTY, UDP_PORT)));
            (tcp.map(|_| ()), udp.map(|_| ()))
        })
    });
    let tcp = tcp.expect_err("a TCP connect to a frontend without backends succeeded");
    assert_eq!(tcp.kind(), ErrorKind::ConnectionRefused, "{tcp}");
    let udp = udp.expect_err("a UDP send to a frontend without backends succeeded");
    assert_eq!(udp.kind(), ErrorKind::ConnectionRefused, "{udp}");
    assert_eq!(counters.grew(&w.ebpf, stat::SOCK_NO_BACKEND), 2);
}

/// A dual-stack client (an `AF_INET6` socket) reaching an IPv4 Service
/// through its IPv4-mapped address (`::ffff:10.96.0.10`) is balanced through
/// the IPv4 maps and sees the mapped frontend as its peer, over TCP and UDP.
#[test]
fn a_v4_mapped_destination_is_balanced_through_the_ipv4_maps() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let w = world("sock6-mapped");
    let counters = Counters::new(&w.ebpf);
    let tcp_frontend = mapped(FE4, TCP_PORT);
    let udp_frontend = mapped(FE4, UDP_PORT);
    let member = w.cgroup.member();
    let (tcp, udp) = in_netns(|| {
        member.inside(|| {
            let tcp: Vec<_> = (0..ATTEMPTS)
                .map(|_| {
                    tcp_once(tcp_frontend).unwrap_or_else(|e| panic!("connect {tcp_frontend}: {e}"))
                })
                .collect();
            let udp: Vec<_> = (0..ATTEMPTS)
                .map(|_| udp_once(&udp_client(), udp_frontend))
                .collect();
            (tcp, udp)
        })
    });
    let be4: BTreeSet<String> = BE4.iter().map(ToString::to_string).collect();
    for (what, runs, frontend) in [("tcp", &tcp, tcp_frontend), ("udp", &udp, udp_frontend)] {
        let reached: BTreeSet<String> = runs.iter().map(|(who, _)| who.clone()).collect();
        assert_eq!(reached, be4, "{what}: both IPv4 backends answer: {runs:?}");
        assert!(
            runs.iter().all(|(_, peer)| *peer == frontend),
            "{what}: the peer is the mapped frontend: {runs:?}"
        );
    }
    assert_eq!(counters.grew(&w.ebpf, stat::SOCK_CONNECT), ATTEMPTS as u64);
    assert_eq!(counters.grew(&w.ebpf, stat::SOCK_SENDMSG), ATTEMPTS as u64);
    assert_eq!(
        counters.grew(&w.ebpf, stat::SOCK_RELEASED),
        0,
        "the mapped TCP sockets keep their frontend in their storage (IPv4's)"
    );
}

/// In the node's namespace a connected IPv6 UDP socket is balanced at
/// connect (its peer is the frontend); `sessionAffinity: ClientIP` sends
/// every new connection of one namespace to one backend.
#[test]
fn host_connected_udp_is_balanced_at_connect_and_affinity_holds_per_netns() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut w = world("sock6-host");
    let counters = Counters::new(&w.ebpf);
    let udp_frontend = SocketAddr::from((FE6, UDP_PORT));
    let tcp_frontend = SocketAddr::from((FE6, TCP_PORT));
    let member = w.cgroup.member();
    let ebpf = &mut w.ebpf;
    let (connected, sticky) = in_netns(|| {
        // This namespace plays the node's.
        let config = socket_layer::datapath_config().expect("this namespace's cookie");
        let mut array: Array<_, Config> =
            Array::try_from(ebpf.map_mut(names::CONFIG).expect("SB_CONFIG_V1")).expect("typed");
        array.set(0, config, 0).expect("write SB_CONFIG_V1");
        let mut fe6: HashMap<_, FrontendKey6, FrontendSlot> =
            HashMap::try_from(ebpf.map_mut(names::FRONTENDS6).expect("SB_FE6_V1")).expect("typed");
        let with_affinity = FrontendSlot {
            flags: frontend_flags::AFFINITY_CLIENT_IP,
            affinity_timeout_s: 60,
            ..slot0(1, 2)
        };
        fe6.insert(key6(FE6, TCP_PORT, proto::TCP, 0), with_affinity, 0)
            .expect("write SB_FE6_V1");
        member.inside(|| {
            let connected: Vec<_> = (0..4)
                .map(|_| {
                    let socket = udp_client();
                    socket
                        .connect(udp_frontend)
                        .expect("connect the UDP socket");
                    let peer = socket.peer_addr().expect("peer_addr");
                    socket.send(b"hello").expect("send");
                    let mut buf = [0u8; 512];
                    let (len, from) = socket.recv_from(&mut buf).expect("an answer");
                    (
                        String::from_utf8_lossy(&buf[..len]).into_owned(),
                        peer,
                        from,
                    )
                })
                .collect();
            let sticky: Vec<_> = (0..ATTEMPTS)
                .map(|_| {
                    tcp_once(tcp_frontend).unwrap_or_else(|e| panic!("connect {tcp_frontend}: {e}"))
                })
                .collect();
            (connected, sticky)
        })
    });
    for (who, peer, from) in &connected {
        assert!(
            BE6.iter().any(|b| b.to_string() == *who),
            "answered by {who}"
        );
        assert_eq!(*peer, udp_frontend, "getpeername of a connected UDP socket");
        assert_eq!(*from, udp_frontend, "recvmsg of a connected UDP socket");
    }
    assert_eq!(
        counters.grew(&w.ebpf, stat::SOCK_CONNECT),
        4 + ATTEMPTS as u64
    );
    assert_eq!(
        counters.grew(&w.ebpf, stat::SOCK_SENDMSG),
        0,
        "connected: no per-datagram work"
    );
    let backends: BTreeSet<String> = sticky.iter().map(|(who, _)| who.clone()).collect();
    assert_eq!(
        backends.len(),
        1,
        "affinity: one backend per namespace: {sticky:?}"
    );
    assert!(sticky.iter().all(|(_, peer)| *peer == tcp_frontend));
}

/// `loadBalancerSourceRanges` at the socket layer, which sees no source
/// address at `connect()`: a socket outside the node's namespace (a pod) is
/// left untranslated, for the tc program on its interface to judge by the
/// packet's source; a socket of the node is refused with EPERM unless a
/// block holds a node address (`SOURCE_RANGES_NODE`), and then balanced.
#[test]
fn a_frontend_restricted_by_source_ranges_is_left_to_tc_for_pods_and_gated_for_the_node() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut w = world("sock6-ranges");
    let counters = Counters::new(&w.ebpf);
    let frontend = SocketAddr::from((FE6, TCP_PORT));
    let member = w.cgroup.member();
    let ebpf = &mut w.ebpf;
    let set_flags = |ebpf: &mut Ebpf, flags: u16| {
        let mut fe6: HashMap<_, FrontendKey6, FrontendSlot> =
            HashMap::try_from(ebpf.map_mut(names::FRONTENDS6).expect("SB_FE6_V1")).expect("typed");
        let head = FrontendSlot {
            flags: frontend_flags::KIND_LOAD_BALANCER | flags,
            ..slot0(1, 2)
        };
        fe6.insert(key6(FE6, TCP_PORT, proto::TCP, 0), head, 0)
            .expect("write SB_FE6_V1");
    };
    let (pod, node_denied, node_allowed) = in_netns(|| {
        set_flags(ebpf, frontend_flags::SOURCE_RANGES);
        // Not the node's namespace: the configuration names another one.
        let pod = member.inside(|| TcpStream::connect_timeout(&frontend, Duration::from_secs(1)));
        let config = socket_layer::datapath_config().expect("this namespace's cookie");
        let mut array: Array<_, Config> =
            Array::try_from(ebpf.map_mut(names::CONFIG).expect("SB_CONFIG_V1")).expect("typed");
        array.set(0, config, 0).expect("write SB_CONFIG_V1");
        let node_denied =
            member.inside(|| TcpStream::connect_timeout(&frontend, Duration::from_secs(1)));
        set_flags(
            ebpf,
            frontend_flags::SOURCE_RANGES | frontend_flags::SOURCE_RANGES_NODE,
        );
        let node_allowed = member.inside(|| tcp_once(frontend));
        (pod.map(|_| ()), node_denied.map(|_| ()), node_allowed)
    });
    let pod =
        pod.expect_err("the frontend exists nowhere: untranslated, the connect cannot succeed");
    assert_ne!(
        pod.kind(),
        ErrorKind::PermissionDenied,
        "a pod's socket is not judged here: {pod}"
    );
    let denied = node_denied.expect_err("the node may not reach the frontend");
    assert_eq!(denied.kind(), ErrorKind::PermissionDenied, "{denied}");
    let (who, peer) = node_allowed.expect("a block holds a node address: balanced");
    assert!(
        BE6.iter().any(|b| b.to_string() == who),
        "answered by {who}"
    );
    assert_eq!(peer, frontend);
    assert_eq!(
        counters.grew(&w.ebpf, stat::SOCK_CONNECT),
        1,
        "only the allowed connect was balanced"
    );
    let denied: PerCpuArray<_, u64> =
        PerCpuArray::try_from(w.ebpf.map(names::SERVICE_DENIED).expect("SB_SVC_DENIED_V1"))
            .expect("typed");
    assert_eq!(
        denied.get(&1, 0).expect("read").iter().sum::<u64>(),
        1,
        "the node's refused connect is counted"
    );
}

/// Least-connection's open flows in the loaded object: the counts' sum and
/// the counted sockets.
fn least_conn_open(ebpf: &Ebpf) -> (u64, usize) {
    let counts: HashMap<_, u32, u64> =
        HashMap::try_from(ebpf.map(names::OPEN_FLOWS).expect("SB_LC_V1")).expect("typed");
    let sockets: HashMap<_, u64, u32> =
        HashMap::try_from(ebpf.map(names::OPEN_SOCKETS).expect("SB_LC_SOCK_V1")).expect("typed");
    (
        counts.iter().flatten().map(|(_, n)| n).sum(),
        sockets.keys().flatten().count(),
    )
}

/// Makes [`FE6`]'s TCP frontend pick by least connections.
fn pick_least_conn(ebpf: &mut Ebpf) {
    let mut fe6: HashMap<_, FrontendKey6, FrontendSlot> =
        HashMap::try_from(ebpf.map_mut(names::FRONTENDS6).expect("SB_FE6_V1")).expect("typed");
    let key = key6(FE6, TCP_PORT, proto::TCP, 0);
    let mut head = fe6.get(&key, 0).expect("slot 0 of the TCP frontend");
    head.flags |= frontend_flags::PICK_LEAST_CONN;
    fe6.insert(key, head, 0).expect("write slot 0");
}

/// One TCP connection to `frontend`, held while its socket's own storage
/// (`SB_SOCK_CONN6_V2`) is read.
fn storage_of_one(ebpf: &Ebpf, frontend: SocketAddr) -> SockConn6 {
    let conns: SkStorage<_, SockConn6> =
        SkStorage::try_from(ebpf.map(names::SOCK_CONNS6).expect("SB_SOCK_CONN6_V2"))
            .expect("typed");
    let stream = TcpStream::connect_timeout(&frontend, Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("connect {frontend}: {e}"));
    conns.get(&stream, 0).expect("the socket's storage")
}

/// A connected TCP socket's own storage names its frontend and backend and
/// says whether the socket counts on its backend: one of a frontend that
/// picks at random does not (so it closes with no least-connection
/// lookup), one of a least-connection frontend does.
#[test]
fn a_sockets_storage_says_whether_it_counts_on_its_backend() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut w = world("sock6-conn");
    let frontend = SocketAddr::from((FE6, TCP_PORT));
    let member = w.cgroup.member();
    let random = in_netns(|| member.inside(|| storage_of_one(&w.ebpf, frontend)));
    pick_least_conn(&mut w.ebpf);
    let counted = in_netns(|| member.inside(|| storage_of_one(&w.ebpf, frontend)));
    assert_eq!(random.flags, 0, "a random pick counts nowhere: {random:?}");
    assert_eq!(
        counted.flags,
        sock_conn_flags::COUNTED,
        "a least-connection pick counts: {counted:?}"
    );
    let backends: Vec<_> = BE6.iter().map(|ip| addr6_be(ip.octets())).collect();
    for conn in [random, counted] {
        let target = conn.target;
        assert_eq!(
            (
                target.frontend_addr_be,
                u16::from_be(target.frontend_port_be)
            ),
            (addr6_be(FE6.octets()), TCP_PORT),
            "{conn:?}"
        );
        assert!(backends.contains(&target.backend_addr_be), "{conn:?}");
        assert_eq!(u16::from_be(target.backend_port_be), POD_TCP, "{conn:?}");
        assert_eq!(target.service_id, 1, "{conn:?}");
    }
    assert_eq!(
        least_conn_open(&w.ebpf),
        (0, 0),
        "closed sockets count no more"
    );
}

/// `least-conn` in the socket layer: a connected socket counts on its
/// backend until it is closed, so while one is open every new connection
/// goes to the other backend; closed, nothing stays counted.
#[test]
fn least_conn_counts_a_connected_socket_until_it_closes() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut w = world("sock6-lc");
    pick_least_conn(&mut w.ebpf);
    let frontend = SocketAddr::from((FE6, TCP_PORT));
    let member = w.cgroup.member();
    let ebpf = &w.ebpf;
    let (held_to, while_held, next, after) = in_netns(|| {
        member.inside(|| {
            let mut held = TcpStream::connect_timeout(&frontend, Duration::from_secs(2))
                .unwrap_or_else(|e| panic!("connect {frontend}: {e}"));
            held.set_read_timeout(Some(Duration::from_secs(2)))
                .expect("read timeout");
            let mut held_to = String::new();
            held.read_to_string(&mut held_to)
                .expect("the backend answers");
            let while_held = least_conn_open(ebpf);
            let next: Vec<String> = (0..ATTEMPTS)
                .map(|_| {
                    tcp_once(frontend)
                        .unwrap_or_else(|e| panic!("connect {frontend}: {e}"))
                        .0
                })
                .collect();
            drop(held);
            (held_to, while_held, next, least_conn_open(ebpf))
        })
    });
    assert_eq!(while_held, (1, 1), "the held socket counts once");
    assert!(
        next.iter().all(|who| *who != held_to),
        "new connections avoid {held_to}, which holds one: {next:?}"
    );
    assert_eq!(after, (0, 0), "closed sockets count no more");
}
