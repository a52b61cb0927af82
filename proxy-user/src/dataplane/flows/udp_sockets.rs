//! Closing connected UDP sockets whose backend left their service.
//!
//! The socket layer balances a connected UDP socket once, at `connect()`; no
//! hook runs on its later sends. When that backend leaves, the agent finds the
//! socket through sock_diag (by the socket cookie the socket layer recorded)
//! and destroys it (`SOCK_DESTROY`, as `ss -K` does; the kernel needs
//! `CONFIG_INET_DIAG_DESTROY`). The owner's next call fails with
//! `ECONNABORTED`, and a resolver that opens a new socket gets a live backend.
//!
//! sock_diag sees the sockets of the namespace it is asked from. The agent
//! asks its own (the node's) first; sockets it did not find there live in a
//! pod, and it asks each network namespace of the processes in the socket
//! layer's cgroup in turn ([`crate::dataplane::attach::pod_netns`]), from a thread that enters
//! them, until every one is found.
//!
//! Both families are listed: IPv4 sockets, and IPv6 ones (whose peer may
//! also be an IPv4 backend as a mapped address, `::ffff:10.0.0.1`).
use std::{
    collections::HashMap,
    fs, io,
    net::{IpAddr, SocketAddr},
    path::PathBuf,
};

use nix::sched::{setns, CloneFlags};

use netlink_packet_sock_diag::{
    constants::{AF_INET, AF_INET6, IPPROTO_UDP},
    inet::{ExtensionFlags, InetRequest, SocketId, StateFlags},
    SockDiagDestroy, SockDiagMessage,
};
use netlink_sys::{protocols::NETLINK_SOCK_DIAG, Socket, SocketAddr as NetlinkAddr};
use sock_diag_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST,
};

use tracing::{debug, warn};

use crate::model::BackendAddr;

#[derive(Debug, thiserror::Error)]
pub enum SockDiagError {
    #[error("opening a sock_diag netlink socket")]
    Socket(#[source] io::Error),
    #[error("listing UDP sockets through sock_diag")]
    Dump(#[source] io::Error),
    #[error("decoding a sock_diag message: {0}")]
    Decode(String),
}

/// What one [`close_udp_sockets`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Closed {
    /// Sockets destroyed.
    pub closed: usize,
    /// Sockets found but not destroyed (the kernel refused), with its answer.
    pub refused: Vec<(u64, io::ErrorKind)>,
    /// Sockets found in no namespace searched (closed meanwhile, or a pod's
    /// the agent cannot see: outside the host's PID namespace).
    pub unfound: usize,
}

/// Destroys the connected UDP sockets whose cookie is a key of `doomed` and
/// whose peer is still the backend recorded for it: those of this namespace,
/// then those of the namespaces `elsewhere` lists (asked only if some were
/// not found here). A namespace that cannot be searched is logged and
/// skipped.
pub fn close_udp_sockets(
    doomed: &HashMap<u64, BackendAddr>,
    elsewhere: impl FnOnce() -> Vec<PathBuf>,
) -> Result<Closed, SockDiagError> {
    let mut peers: HashMap<u64, SocketAddr> = doomed
        .iter()
        .map(|(cookie, backend)| (*cookie, SocketAddr::new(backend.ip, backend.port)))
        .collect();
    let (mut closed, found) = close_here(&peers)?;
    for cookie in found {
        peers.remove(&cookie);
    }
    if !peers.is_empty() {
        closed.add(close_in_namespaces(peers, elsewhere()));
    }
    Ok(closed)
}

impl Closed {
    fn add(&mut self, other: Closed) {
        self.closed += other.closed;
        self.refused.extend(other.refused);
        self.unfound += other.unfound;
    }
}

/// Searches each namespace of `namespaces` (handles such as
/// `/proc/<pid>/ns/net`) in turn for the sockets of `doomed`, until all are
/// found, from a thread of its own: entering a namespace changes only the
/// calling thread's.
fn close_in_namespaces(mut doomed: HashMap<u64, SocketAddr>, namespaces: Vec<PathBuf>) -> Closed {
    let count = doomed.len();
    let search = move || {
        let mut closed = Closed::default();
        for handle in namespaces {
            if doomed.is_empty() {
                break;
            }
            let entered = fs::File::open(&handle)
                .and_then(|ns| setns(ns, CloneFlags::CLONE_NEWNET).map_err(io::Error::from));
            if let Err(error) = entered {
                // Most often a process that exited since it was listed.
                debug!(namespace = %handle.display(), %error, "namespace not entered");
                continue;
            }
            match close_here(&doomed) {
                Ok((here, found)) => {
                    closed.add(here);
                    for cookie in found {
                        doomed.remove(&cookie);
                    }
                }
                Err(error) => warn!(
                    namespace = %handle.display(),
                    error = %anyhow::Error::from(error),
                    "could not list the UDP sockets of a namespace"
                ),
            }
        }
        closed.unfound = doomed.len();
        closed
    };
    let unsearched = Closed {
        unfound: count,
        ..Closed::default()
    };
    match std::thread::Builder::new()
        .name("sb-sockdiag".into())
        .spawn(search)
    {
        Ok(thread) => thread.join().unwrap_or_else(|_| {
            warn!("the search of the pods' namespaces for UDP sockets panicked");
            unsearched
        }),
        Err(error) => {
            warn!(%error, "no thread to search the pods' namespaces for UDP sockets");
            unsearched
        }
    }
}

/// Whether the socket `id` still talks to `peer` (an IPv4 peer of an IPv6
/// socket is seen as its mapped address).
pub fn talks_to(id: &SocketId, peer: SocketAddr) -> bool {
    id.destination_address.to_canonical() == peer.ip().to_canonical()
        && id.destination_port == peer.port()
}

/// [`close_udp_sockets`] by socket address: destroys the connected UDP
/// sockets (IPv4 and IPv6) of this namespace whose cookie is a key of
/// `doomed` and whose peer is still the address recorded for it.
pub fn close_udp_peers(doomed: &HashMap<u64, SocketAddr>) -> Result<Closed, SockDiagError> {
    close_here(doomed).map(|(closed, _)| closed)
}

/// [`close_udp_peers`], and the cookies of `doomed` it found here (closed
/// or refused).
fn close_here(doomed: &HashMap<u64, SocketAddr>) -> Result<(Closed, Vec<u64>), SockDiagError> {
    let mut closed = Closed::default();
    if doomed.is_empty() {
        return Ok((closed, Vec::new()));
    }
    let socket = open()?;
    let mut found = dump_connected_udp(&socket, AF_INET)?;
    // A node without IPv6 answers the IPv6 listing with an error: its IPv4
    // sockets are still closed.
    match dump_connected_udp(&socket, AF_INET6) {
        Ok(v6) => found.extend(v6),
        Err(error) => warn!(
            error = %anyhow::Error::from(error),
            "could not list IPv6 UDP sockets; only IPv4 ones are closed"
        ),
    }
    let victims: Vec<SocketId> = found
        .into_iter()
        .filter(|id| {
            let cookie = u64::from_ne_bytes(id.cookie);
            doomed.get(&cookie).is_some_and(|peer| talks_to(id, *peer))
        })
        .collect();
    let mut matched = Vec::with_capacity(victims.len());
    for id in victims {
        let cookie = u64::from_ne_bytes(id.cookie);
        matched.push(cookie);
        match destroy(&socket, id) {
            Ok(()) => closed.closed += 1,
            Err(error) => closed.refused.push((cookie, error.kind())),
        }
    }
    Ok((closed, matched))
}

fn open() -> Result<Socket, SockDiagError> {
    let socket = Socket::new(NETLINK_SOCK_DIAG).map_err(SockDiagError::Socket)?;
    socket
        .connect(&NetlinkAddr::new(0, 0))
        .map_err(SockDiagError::Socket)?;
    Ok(socket)
}

/// The family a socket id's addresses belong to.
fn family_of(id: &SocketId) -> u8 {
    match id.source_address {
        IpAddr::V4(_) => AF_INET,
        IpAddr::V6(_) => AF_INET6,
    }
}

fn request(family: u8, socket_id: SocketId) -> InetRequest {
    InetRequest {
        family,
        protocol: IPPROTO_UDP,
        extensions: ExtensionFlags::empty(),
        // A connected UDP socket is in TCP_ESTABLISHED.
        states: StateFlags::ESTABLISHED,
        socket_id,
    }
}

fn send<I: sock_diag_core::NetlinkSerializable>(
    socket: &Socket,
    flags: u16,
    payload: I,
) -> io::Result<()> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    let mut message = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(payload));
    message.finalize();
    let mut buf = vec![0u8; message.buffer_len()];
    message.serialize(&mut buf);
    socket.send(&buf, 0).map(|_| ())
}

/// The ids (4-tuple and cookie) of every connected UDP socket of `family`
/// (`AF_INET` or `AF_INET6`).
fn dump_connected_udp(socket: &Socket, family: u8) -> Result<Vec<SocketId>, SockDiagError> {
    let any = match family {
        AF_INET6 => SocketId::new_v6(),
        _ => SocketId::new_v4(),
    };
    send(
        socket,
        NLM_F_REQUEST | NLM_F_DUMP,
        SockDiagMessage::InetRequest(request(family, any)),
    )
    .map_err(SockDiagError::Dump)?;
    let mut found = Vec::new();
    loop {
        let (buf, _) = socket.recv_from_full().map_err(SockDiagError::Dump)?;
        let mut offset = 0;
        while offset < buf.len() {
            let message = NetlinkMessage::<SockDiagMessage>::deserialize(&buf[offset..])
                .map_err(|e| SockDiagError::Decode(e.to_string()))?;
            let length = message.header.length as usize;
            match message.payload {
                NetlinkPayload::Done(_) => return Ok(found),
                NetlinkPayload::Error(error) => return Err(SockDiagError::Dump(error.to_io())),
                NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(response)) => {
                    found.push(response.header.socket_id.clone());
                }
                _ => {}
            }
            if length == 0 {
                break;
            }
            offset += (length + 3) & !3;
        }
    }
}

/// Destroys one socket and waits for the kernel's answer.
fn destroy(socket: &Socket, id: SocketId) -> io::Result<()> {
    send(
        socket,
        NLM_F_REQUEST | NLM_F_ACK,
        SockDiagDestroy::new(SockDiagMessage::InetRequest(request(family_of(&id), id))),
    )?;
    let (buf, _) = socket.recv_from_full()?;
    let message = NetlinkMessage::<SockDiagMessage>::deserialize(&buf)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    match message.payload {
        NetlinkPayload::Error(error) if error.code.is_some() => Err(error.to_io()),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(source: &str, destination: &str) -> SocketId {
        let source: SocketAddr = source.parse().expect("source");
        let destination: SocketAddr = destination.parse().expect("destination");
        let mut id = match source {
            SocketAddr::V4(_) => SocketId::new_v4(),
            SocketAddr::V6(_) => SocketId::new_v6(),
        };
        id.source_address = source.ip();
        id.source_port = source.port();
        id.destination_address = destination.ip();
        id.destination_port = destination.port();
        id
    }

    #[test]
    fn a_socket_is_matched_by_its_peer_in_either_family() {
        let v4 = id("10.0.0.2:40000", "10.244.1.5:53");
        assert!(talks_to(&v4, "10.244.1.5:53".parse().expect("addr")));
        assert!(!talks_to(&v4, "10.244.1.5:54".parse().expect("addr")));
        assert!(!talks_to(&v4, "10.244.1.6:53".parse().expect("addr")));
        let v6 = id("[fd00::2]:40000", "[fd00:244::5]:53");
        assert!(talks_to(&v6, "[fd00:244::5]:53".parse().expect("addr")));
        assert!(!talks_to(&v6, "[fd00:244::6]:53".parse().expect("addr")));
        assert!(!talks_to(&v6, "10.244.1.5:53".parse().expect("addr")));
        // An IPv6 socket that connected to an IPv4 backend.
        let mapped = id("[::ffff:10.0.0.2]:40000", "[::ffff:10.244.1.5]:53");
        assert!(talks_to(&mapped, "10.244.1.5:53".parse().expect("addr")));
        assert_eq!(
            (family_of(&v4), family_of(&v6), family_of(&mapped)),
            (AF_INET, AF_INET6, AF_INET6)
        );
    }
}
