//! `perpacket`, IPv6: the same ping-pong as the IPv4 rows (Services A ⇄ B,
//! each the other's only backend, both flows tracked), through the IPv6 pod
//! path (`sb_from_pod`/`sb_to_pod`, which tell the families apart by ethertype),
//! with a frame of the same TCP payload. Each size has that many IPv4 filler
//! Services (the IPv4 rows' state) and up to 10k IPv6 ones.
use std::net::Ipv6Addr;

use anyhow::{Context as _, Result};
use aya::maps::{HashMap as AyaHashMap, Map, MapData};
use proxy_common::{addr6_be, ct_dir, programs, proto, CtEntry6, CtKey6};
use proxy_user::model::{BackendAddr, DesiredState};
use serde_json::{json, Value};

use super::{measure_repeat, perpacket_state, PerPacket};
use crate::common::*;
use crate::progress;

const CLIENT6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x244, 0x100, 0, 0, 0, 2);
const VIP_A6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x10);
const VIP_B6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x11);
const POD6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x244, 1, 0, 0, 0, 2);
/// IPv6 filler Services at most (their backends share the id space with the
/// IPv4 ones).
pub(super) const MAX_FILLERS6: u32 = 10_000;

/// An Ethernet + IPv6 + TCP frame with a valid checksum and the IPv4 rows'
/// payload.
fn frame6_tcp(src: Ipv6Addr, sport: u16, dst: Ipv6Addr, dport: u16, flags: u8) -> Vec<u8> {
    let tcp_len = 20 + FRAME_PAYLOAD;
    let mut f = Vec::with_capacity(14 + 40 + tcp_len);
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x86, 0xdd]);
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(&(tcp_len as u16).to_be_bytes());
    f.extend_from_slice(&[proto::TCP, 64]);
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&dst.octets());
    let tcp_at = f.len();
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&1u32.to_be_bytes());
    f.extend_from_slice(&0u32.to_be_bytes());
    f.extend_from_slice(&[5 << 4, flags, 0xff, 0xff, 0, 0, 0, 0]);
    f.resize(tcp_at + tcp_len, 0);
    let sum = checksum6(&src, &dst, &f[tcp_at..]);
    f[tcp_at + 16..tcp_at + 18].copy_from_slice(&sum.to_be_bytes());
    f
}

/// The TCP checksum over the IPv6 pseudo-header and `segment`.
fn checksum6(src: &Ipv6Addr, dst: &Ipv6Addr, segment: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut add = |bytes: &[u8]| {
        for pair in bytes.chunks(2) {
            let hi = u32::from(pair[0]) << 8;
            sum += hi | pair.get(1).copied().map_or(0, u32::from);
        }
    };
    add(&src.octets());
    add(&dst.octets());
    add(&(segment.len() as u32).to_be_bytes());
    add(&[0, 0, 0, proto::TCP]);
    add(segment);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The IPv4 rows' state for `services`, plus the IPv6 ping-pong pair and
/// IPv6 fillers.
fn state6(services: u32) -> DesiredState {
    let mut desired = perpacket_state(services, 1);
    let backend = |ip: Ipv6Addr| {
        vec![BackendAddr {
            ip: ip.into(),
            port: 80,
        }]
    };
    let mut frontends = vec![
        frontend(VIP_A6, 80, "a6", backend(VIP_B6)),
        frontend(VIP_B6, 80, "b6", backend(VIP_A6)),
    ];
    for i in 0..services.min(MAX_FILLERS6).saturating_sub(2) {
        let vip = Ipv6Addr::new(0xfd00, 0x100, 0, 0, 0, 0, (i >> 16) as u16, i as u16);
        let pod = Ipv6Addr::new(0xfd00, 0x200, 0, 0, 0, 0, (i >> 16) as u16, i as u16);
        frontends.push(frontend(
            vip,
            80,
            &format!("fill6-{i}"),
            vec![BackendAddr {
                ip: pod.into(),
                port: 8080,
            }],
        ));
    }
    desired
        .frontends
        .extend(frontends.into_iter().map(|f| (f.addr, f)));
    desired
}

/// A second handle on the syncer's IPv6 conntrack map.
fn conntrack6(pp: &PerPacket) -> Result<AyaHashMap<MapData, CtKey6, CtEntry6>> {
    use aya::maps::IterableMap as _;
    use std::os::fd::AsFd as _;
    let fd = pp
        .syncer
        .store()
        .conntrack6
        .map()
        .fd()
        .as_fd()
        .try_clone_to_owned()
        .context("dup conntrack6 fd")?;
    Ok(Map::from_map_data(MapData::from_fd(fd)?)?.try_into()?)
}

/// Tracks both ping-pong flows, both directions, as the data path would.
fn seed(pp: &PerPacket) -> Result<()> {
    let mut ct = conntrack6(pp)?;
    let a = |ip: Ipv6Addr| addr6_be(ip.octets());
    for (vip, other) in [(VIP_A6, VIP_B6), (VIP_B6, VIP_A6)] {
        let (service_id, backend_id) = pp.ids(vip, other, 80)?;
        let entry = CtEntry6 {
            backend_id,
            service_id,
            nat_addr_be: a(other),
            nat_port_be: 80u16.to_be(),
            ..CtEntry6::default()
        };
        let reply_entry = CtEntry6 {
            nat_addr_be: a(vip),
            ..entry
        };
        let fwd = CtKey6 {
            saddr_be: a(CLIENT6),
            daddr_be: a(vip),
            sport_be: CLIENT_PORT.to_be(),
            dport_be: 80u16.to_be(),
            proto: proto::TCP,
            dir: ct_dir::FORWARD,
            _pad: [0; 2],
        };
        let reply = CtKey6 {
            saddr_be: a(other),
            daddr_be: a(CLIENT6),
            sport_be: 80u16.to_be(),
            dport_be: CLIENT_PORT.to_be(),
            proto: proto::TCP,
            dir: ct_dir::REPLY,
            _pad: [0; 2],
        };
        ct.insert(fwd, entry, 0)?;
        ct.insert(reply, reply_entry, 0)?;
    }
    Ok(())
}

/// The IPv6 rows: per size, the existing flow through `sb_from_pod`, a
/// non-service packet, and the reply through `sb_to_pod`, with their ratios
/// to the empty tc program.
pub(super) fn measure(
    pp: &mut PerPacket,
    sizes: &[u32],
    repeat: u32,
    rounds: usize,
    empty_tc_ns: f64,
) -> Result<Value> {
    let mut rows = Vec::new();
    for &services in sizes {
        let desired = state6(services);
        pp.apply(&desired)?;
        seed(pp)?;
        let existing = frame6_tcp(CLIENT6, CLIENT_PORT, VIP_A6, 80, 0x10);
        let reply = frame6_tcp(VIP_B6, 80, CLIENT6, CLIENT_PORT, 0x10);
        let first_reply = frame6_tcp(VIP_B6, 80, CLIENT6, CLIENT_PORT, 0x12);
        let non_service = frame6_tcp(CLIENT6, CLIENT_PORT, POD6, 8080, 0x10);
        let mut run = |program, frame: &[u8], verdict, counter| {
            measure_repeat(pp, program, frame, verdict, counter, repeat, rounds)
        };
        let hit = run(
            programs::TC_FROM_POD,
            &existing,
            TC_ACT_OK,
            Some("forwarded"),
        )?;
        let pass = run(programs::TC_FROM_POD, &non_service, TC_ACT_UNSPEC, None)?;
        let rev = run(programs::TC_TO_POD, &reply, TC_ACT_OK, Some("reversed"))?;
        let rev_first = run(
            programs::TC_TO_POD,
            &first_reply,
            TC_ACT_OK,
            Some("reversed"),
        )?;
        progress(&format!(
            "perpacket IPv6: {services} services: from_pod hit {hit:.1} ns ({:.2}× empty), non-service {pass:.1} ns, to_pod reply {rev:.1} ns ({:.2}× empty)",
            hit / empty_tc_ns,
            rev / empty_tc_ns
        ));
        rows.push(json!({
            "services_nominal": services,
            "ipv6_services": desired.frontends.keys().filter(|a| a.ip.is_ipv6()).count(),
            "from_pod_service_existing_ns": hit,
            "from_pod_non_service_ns": pass,
            "to_pod_reply_ns": rev,
            "to_pod_first_reply_ns": rev_first,
        }));
    }
    Ok(json!({
        "frame_bytes": frame6_tcp(CLIENT6, CLIENT_PORT, VIP_A6, 80, 0x10).len(),
        "rows": rows,
    }))
}
