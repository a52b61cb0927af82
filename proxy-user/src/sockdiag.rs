//! Closing connected UDP sockets whose backend left their service.
//!
//! The socket layer balances a connected UDP socket once, at `connect()`; no
//! hook runs on its later sends. When that backend leaves, the agent finds the
//! socket through sock_diag (by the socket cookie the socket layer recorded)
//! and destroys it (`SOCK_DESTROY`, as `ss -K` does; the kernel needs
//! `CONFIG_INET_DIAG_DESTROY`). The owner's next call fails with
//! `ECONNABORTED`, and a resolver that opens a new socket gets a live backend.
//!
//! sock_diag sees the sockets of the agent's own network namespace: the node's.
//! Pods' connected UDP sockets are not balanced at connect (see the eBPF
//! socket layer), so they never need this.
use std::{collections::HashMap, io};

use netlink_packet_sock_diag::{
    constants::{AF_INET, IPPROTO_UDP},
    inet::{ExtensionFlags, InetRequest, SocketId, StateFlags},
    SockDiagDestroy, SockDiagMessage,
};
use netlink_sys::{protocols::NETLINK_SOCK_DIAG, Socket, SocketAddr};
use sock_diag_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST,
};

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
}

/// Destroys the connected UDP sockets of this namespace whose cookie is a key
/// of `doomed` and whose peer is still the backend recorded for it.
pub fn close_udp_sockets(doomed: &HashMap<u64, BackendAddr>) -> Result<Closed, SockDiagError> {
    let mut closed = Closed::default();
    if doomed.is_empty() {
        return Ok(closed);
    }
    let socket = open()?;
    let victims: Vec<SocketId> = dump_connected_udp(&socket)?
        .into_iter()
        .filter(|id| {
            let cookie = u64::from_ne_bytes(id.cookie);
            doomed.get(&cookie).is_some_and(|backend| {
                id.destination_address == backend.ip
                    && id.destination_port == backend.port
            })
        })
        .collect();
    for id in victims {
        let cookie = u64::from_ne_bytes(id.cookie);
        match destroy(&socket, id) {
            Ok(()) => closed.closed += 1,
            Err(error) => closed.refused.push((cookie, error.kind())),
        }
    }
    Ok(closed)
}

fn open() -> Result<Socket, SockDiagError> {
    let socket = Socket::new(NETLINK_SOCK_DIAG).map_err(SockDiagError::Socket)?;
    socket
        .connect(&SocketAddr::new(0, 0))
        .map_err(SockDiagError::Socket)?;
    Ok(socket)
}

fn request(socket_id: SocketId) -> InetRequest {
    InetRequest {
        family: AF_INET,
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

/// The ids (4-tuple and cookie) of every connected IPv4 UDP socket.
fn dump_connected_udp(socket: &Socket) -> Result<Vec<SocketId>, SockDiagError> {
    send(
        socket,
        NLM_F_REQUEST | NLM_F_DUMP,
        SockDiagMessage::InetRequest(request(SocketId::new_v4())),
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
        SockDiagDestroy::new(SockDiagMessage::InetRequest(request(id))),
    )?;
    let (buf, _) = socket.recv_from_full()?;
    let message = NetlinkMessage::<SockDiagMessage>::deserialize(&buf)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    match message.payload {
        NetlinkPayload::Error(error) if error.code.is_some() => Err(error.to_io()),
        _ => Ok(()),
    }
}
