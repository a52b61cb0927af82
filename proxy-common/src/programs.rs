//! Program names (the symbols the loader looks up).
/// tc ingress on the host side of a pod's veth: packets leaving the pod.
pub const TC_FROM_POD: &str = "sb_from_pod";
/// tc egress on the host side of a pod's veth: packets going into the pod.
pub const TC_TO_POD: &str = "sb_to_pod";
/// cgroup `connect4`: TCP and connected UDP sockets get a backend at connect.
pub const SOCK_CONNECT4: &str = "sb_sock_connect4";
/// cgroup `sendmsg4`: every unconnected UDP datagram to a frontend.
pub const SOCK_SENDMSG4: &str = "sb_sock_sendmsg4";
/// cgroup `recvmsg4`: UDP replies show the frontend as their source.
pub const SOCK_RECVMSG4: &str = "sb_sock_recvmsg4";
/// cgroup `getpeername4`: a balanced socket's peer is the frontend.
pub const SOCK_GETPEERNAME4: &str = "sb_sock_getpeername4";
/// cgroup `connect6`: [`SOCK_CONNECT4`] for IPv6 sockets (an IPv4-mapped
/// destination is balanced through the IPv4 maps).
pub const SOCK_CONNECT6: &str = "sb_sock_connect6";
/// cgroup `sendmsg6`: [`SOCK_SENDMSG4`] for IPv6 sockets.
pub const SOCK_SENDMSG6: &str = "sb_sock_sendmsg6";
/// cgroup `recvmsg6`: [`SOCK_RECVMSG4`] for IPv6 sockets.
pub const SOCK_RECVMSG6: &str = "sb_sock_recvmsg6";
/// cgroup `getpeername6`: [`SOCK_GETPEERNAME4`] for IPv6 sockets.
pub const SOCK_GETPEERNAME6: &str = "sb_sock_getpeername6";
/// XDP, tail-called by `sb_xdp_uplink` for IPv6 packets.
pub const XDP_UPLINK6: &str = "sb_xdp_uplink6";
/// tc, tail-called by `sb_from_uplink` for IPv6 packets.
pub const TC_FROM_UPLINK6: &str = "sb_from_uplink6";
/// cgroup `sock_release`: a closing socket's entry in the socket map goes.
pub const SOCK_RELEASE: &str = "sb_sock_release";
/// XDP on each uplink: traffic from outside the node to NodePorts,
/// LoadBalancer IPs and external IPs, and the replies of flows it
/// source-NATed to a backend on another node.
pub const XDP_UPLINK: &str = "sb_xdp_uplink";
/// tc ingress on each uplink: the same as [`XDP_UPLINK`], for
/// `--xdp-mode off`.
pub const TC_FROM_UPLINK: &str = "sb_from_uplink";
/// tc egress on each uplink: a local backend's replies to a client outside
/// the node get the frontend as their source again (the same program as
/// [`TC_TO_POD`]: one reverse-NAT lookup).
pub const TC_TO_UPLINK: &str = TC_TO_POD;
/// The socket-layer `sock_addr` programs, in the order they are attached
/// (the reverse hooks before the forward ones, so a socket balanced by a
/// new program always finds its way back).
pub const SOCKET_LB: [&str; 8] = [
    SOCK_GETPEERNAME4,
    SOCK_RECVMSG4,
    SOCK_GETPEERNAME6,
    SOCK_RECVMSG6,
    SOCK_SENDMSG4,
    SOCK_CONNECT4,
    SOCK_SENDMSG6,
    SOCK_CONNECT6,
];
