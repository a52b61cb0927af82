//! The socket layer: per-socket translations, per-namespace affinity and the config the hooks read.

use crate::Addr6Be;

/// Direction marker in [`SockKey::dir`].
pub mod sock_dir {
    /// Keyed by the frontend a socket sent to; the value names its backend.
    pub const FORWARD: u8 = 0;
    /// Keyed by the backend a socket talks to; the value names the frontend.
    pub const REVERSE: u8 = 1;
}

/// Key of the socket-layer LRU map: one socket (its cookie) and one address
/// it sends to or hears from.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct SockKey {
    /// `bpf_get_socket_cookie()`: unique per socket for the boot.
    pub cookie: u64,
    pub addr_be: u32,
    pub port_be: u16,
    pub proto: u8,
    /// [`sock_dir`].
    pub dir: u8,
}

/// Value of the socket-layer LRU map: where the socket's datagrams to the key's
/// frontend go (`FORWARD`), or which frontend the key's backend stands for
/// (`REVERSE`). `A`: `u32` for IPv4 ([`SockEntry`]), [`Addr6Be`] for IPv6
/// ([`SockEntry6`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockEntryOf<A> {
    pub addr_be: A,
    pub port_be: u16,
    pub _pad: [u8; 2],
    /// `FORWARD`: the backend id, checked against the backend map on every
    /// datagram so a departed backend is never used again.
    pub backend_id: u32,
    pub service_id: u32,
}

/// [`SockEntryOf`] of the IPv4 socket map.
pub type SockEntry = SockEntryOf<u32>;
/// [`SockEntryOf`] of the IPv6 socket map.
pub type SockEntry6 = SockEntryOf<Addr6Be>;

/// Bits of [`SockConnOf::flags`].
pub mod sock_conn_flags {
    /// The socket counts on its backend in least-connection's open flows
    /// (`SB_LC_SOCK_V1`): `sock_release` takes it off. A socket without it
    /// closes with no lookup.
    pub const COUNTED: u32 = 1;
}

/// What the socket layer connected a TCP socket to: the backend it got and
/// the frontend the application asked for. `A`: `u32` for IPv4,
/// [`Addr6Be`] for IPv6.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockTargetOf<A> {
    /// The backend the socket is connected to.
    pub backend_addr_be: A,
    /// The frontend the application asked for.
    pub frontend_addr_be: A,
    pub backend_port_be: u16,
    pub frontend_port_be: u16,
    pub service_id: u32,
}

/// The socket-local storage of a TCP socket the socket layer connected to a
/// backend instead of a frontend (`SB_SOCK_CONN_V2`, `SB_SOCK_CONN6_V2`:
/// `BPF_MAP_TYPE_SK_STORAGE`, freed by the kernel with the socket):
/// `getpeername()` shows the frontend again, and `sock_release` knows
/// from it alone whether the socket leaves least-connection's count.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockConnOf<A> {
    pub target: SockTargetOf<A>,
    /// [`sock_conn_flags`].
    pub flags: u32,
}

/// [`SockConnOf`] of an IPv4 socket.
pub type SockConn = SockConnOf<u32>;
/// [`SockConnOf`] of an IPv6 socket.
pub type SockConn6 = SockConnOf<Addr6Be>;

/// Key of the socket-layer session-affinity map: the socket layer sees no
/// client address at connect time, so a client is its network namespace (a
/// pod, or the host).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct SockAffinityKey {
    /// `bpf_get_netns_cookie()` of the socket's namespace.
    pub netns_cookie: u64,
    pub service_id: u32,
    pub _pad: [u8; 4],
}

/// [`SockKey`] of an IPv6 socket.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct SockKey6 {
    pub cookie: u64,
    pub addr_be: Addr6Be,
    pub port_be: u16,
    pub proto: u8,
    pub dir: u8,
    pub _pad: [u8; 4],
}

/// The single entry (key 0) of the config array, written by the agent before
/// it attaches anything.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct Config {
    /// Network-namespace cookie of the node (the agent's namespace).
    /// Connected UDP sockets there are balanced at connect time; elsewhere
    /// (pods) too when the agent can close them there (`names::POD_UDP_AT_CONNECT`),
    /// else the tc layer balances them per datagram. Restricted frontends are
    /// judged by it too (the node's sockets here, a pod's by tc).
    pub host_netns_cookie: u64,
}
