//! The `healthCheckNodePort` servers, as kube-proxy runs them.
//!
//! A LoadBalancer Service with `externalTrafficPolicy: Local` gets a
//! `spec.healthCheckNodePort`. The cloud load balancer probes that port on
//! every node and sends traffic only to nodes that answer 200, that is, to
//! nodes with an endpoint of the Service; the other nodes would drop it.
//! kube-proxy (pkg/proxy/healthcheck, `hcHandler`) serves, on every address
//! of both families (`0.0.0.0` and `[::]`) at `<healthCheckNodePort>`, for any
//! path and method:
//!
//! ```text
//! {"service":{"namespace":"NS","name":"NAME"},"localEndpoints":N,"serviceProxyHealthy":true}
//! ```
//!
//! with `Content-Type: application/json` and `X-Content-Type-Options: nosniff`,
//! and status 200 when `N > 0`, 503 when `N == 0`. `N` is the number of this
//! node's ready endpoints of the Service: here, the distinct addresses among
//! the `external_backends` of all its frontends (all its ports), except where
//! those are the serving-and-terminating fallback. Traffic still drains to
//! terminating endpoints, but the load balancer is told to stop sending more.
//!
//! [`HealthServers::update`] follows the model: one listener per wanted port
//! and bind address ([`DEFAULT_BINDS`]: an IPv4 `0.0.0.0` socket and an
//! IPv6-only `[::]` socket beside it, so the IPv4 one keeps its own port
//! whatever `net.ipv6.bindv6only` says). A kernel without IPv6 (the socket
//! family is not supported) is served on IPv4 alone.
//! A port whose Service (or count) changes keeps its listener; only the
//! answer changes. Two Services on one port: the first in namespace/name order
//! keeps it. A port that cannot be bound is logged and tried again at the next
//! update; it never stops the agent.
//!
//! HTTP is hyper's (HTTP/1.1), one request per connection, with a bound on the
//! time to read the request head and on the whole connection.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd as _;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tracing::{debug, info, warn};

use crate::model::DesiredState;

/// Where the servers listen in production: every address of both families,
/// as kube-proxy does on a dual-stack node.
pub const DEFAULT_BINDS: [IpAddr; 2] = [
    IpAddr::V4(Ipv4Addr::UNSPECIFIED),
    IpAddr::V6(Ipv6Addr::UNSPECIFIED),
];
/// How long a client has to send its request head.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one connection may last, request and response together.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(15);
/// Pause after a failed `accept` (out of file descriptors, ...), so the loop
/// does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// A Service, by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceName {
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for ServiceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What one health check port answers for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceHealth {
    pub service: ServiceName,
    /// Distinct ready local endpoint addresses (over all the Service's
    /// ports), of the family that has more: a dual-stack pod has an address
    /// in each family's slices and counts once.
    pub local_endpoints: usize,
}

/// Two Services with the same `healthCheckNodePort`: `kept` (first in
/// namespace/name order) is served, `ignored` is not.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PortConflict {
    pub port: u16,
    pub kept: ServiceName,
    pub ignored: ServiceName,
}

/// The ports that should be served, and the Services that lost a port to
/// another one. Pure: the model's frontends in, no I/O.
pub fn wanted(desired: &DesiredState) -> (BTreeMap<u16, ServiceHealth>, Vec<PortConflict>) {
    // Per Service: its health check port and its ready local endpoint addresses.
    let mut services: BTreeMap<ServiceName, (Option<u16>, BTreeSet<IpAddr>)> = BTreeMap::new();
    for fe in desired.frontends.values() {
        let name = ServiceName {
            namespace: fe.service.namespace.to_string(),
            name: fe.service.name.to_string(),
        };
        let (port, local) = services.entry(name).or_default();
        if let Some(p) = fe.health_check_node_port.filter(|p| *p != 0) {
            port.get_or_insert(p);
        }
        if !fe.external_terminating_fallback {
            local.extend(fe.external_backends.iter().flatten().map(|b| b.ip));
        }
    }
    let mut by_port: BTreeMap<u16, ServiceHealth> = BTreeMap::new();
    let mut conflicts = Vec::new();
    for (service, (port, local)) in services {
        let Some(port) = port else { continue };
        match by_port.get(&port) {
            Some(first) => conflicts.push(PortConflict {
                port,
                kept: first.service.clone(),
                ignored: service,
            }),
            None => {
                by_port.insert(
                    port,
                    ServiceHealth {
                        service,
                        local_endpoints: local
                            .iter()
                            .filter(|ip| ip.is_ipv4())
                            .count()
                            .max(local.iter().filter(|ip| ip.is_ipv6()).count()),
                    },
                );
            }
        }
    }
    (by_port, conflicts)
}

/// The running health check servers, one per port; owned by the agent.
pub struct HealthServers {
    binds: Vec<IpAddr>,
    servers: BTreeMap<u16, Server>,
    /// Conflicts and bind failures already logged, so each is logged once.
    conflicts: Vec<PortConflict>,
    bind_errors: BTreeMap<u16, String>,
}

/// One listening port (a listener per bind address). Dropping it stops the
/// listeners and their connections.
struct Server {
    health: watch::Sender<ServiceHealth>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl HealthServers {
    /// No servers yet; each port listens on every address of `binds`
    /// ([`DEFAULT_BINDS`] in production; an IPv6 address gets an IPv6-only
    /// socket, so `0.0.0.0` and `[::]` go side by side).
    pub fn new(binds: &[IpAddr]) -> HealthServers {
        HealthServers {
            binds: binds.to_vec(),
            servers: BTreeMap::new(),
            conflicts: Vec::new(),
            bind_errors: BTreeMap::new(),
        }
    }

    /// The ports listening now.
    pub fn ports(&self) -> impl Iterator<Item = u16> + '_ {
        self.servers.keys().copied()
    }

    /// Makes exactly the ports `desired` asks for listen: starts new ones,
    /// stops those no longer wanted, and updates the answer of the others in
    /// place. Ports that failed to bind before are tried again. Must be called
    /// inside a tokio runtime (the servers are tasks on it).
    pub fn update(&mut self, desired: &DesiredState) {
        let (wanted, conflicts) = wanted(desired);
        self.log_conflicts(conflicts);
        self.servers.retain(|port, server| {
            let keep = wanted.contains_key(port);
            if !keep {
                info!(port, service = %server.health.borrow().service, "healthCheckNodePort server stopped");
            }
            keep
        });
        self.bind_errors.retain(|port, _| wanted.contains_key(port));
        for (port, health) in wanted {
            match self.servers.get(&port) {
                Some(server) => set_health(&server.health, health),
                None => self.start(port, health),
            }
        }
    }

    fn log_conflicts(&mut self, conflicts: Vec<PortConflict>) {
        for c in conflicts.iter().filter(|c| !self.conflicts.contains(c)) {
            warn!(
                port = c.port,
                kept = %c.kept,
                ignored = %c.ignored,
                "healthCheckNodePort {} is claimed by {} and {}; {} keeps it",
                c.port,
                c.kept,
                c.ignored,
                c.kept
            );
        }
        self.conflicts = conflicts;
    }

    fn start(&mut self, port: u16, health: ServiceHealth) {
        let listeners = match listen_all(&self.binds, port) {
            Ok(listeners) => listeners,
            Err((addr, error)) => {
                let msg = error.to_string();
                if self.bind_errors.get(&port) != Some(&msg) {
                    warn!(
                        port,
                        service = %health.service,
                        %error,
                        "cannot serve healthCheckNodePort on {addr}; trying again at the next update"
                    );
                    self.bind_errors.insert(port, msg);
                }
                return;
            }
        };
        if self.bind_errors.remove(&port).is_some() {
            info!(port, service = %health.service, "healthCheckNodePort bound after earlier failures");
        }
        info!(
            port,
            service = %health.service,
            local_endpoints = health.local_endpoints,
            "serving healthCheckNodePort"
        );
        let (tx, rx) = watch::channel(health);
        let tasks = listeners
            .into_iter()
            .map(|listener| tokio::spawn(serve(listener, rx.clone())))
            .collect();
        self.servers.insert(port, Server { health: tx, tasks });
    }
}

/// Listens on `port` at every address of `binds`, IPv6 ones IPv6-only. All or
/// nothing: the first failure (with its address) drops the others, so the
/// port is tried again whole. An IPv6 address on a kernel without IPv6 is
/// skipped, not a failure (unless nothing else is left).
fn listen_all(binds: &[IpAddr], port: u16) -> Result<Vec<TcpListener>, (SocketAddr, io::Error)> {
    let mut listeners = Vec::with_capacity(binds.len());
    let mut skipped = None;
    for ip in binds {
        let addr = SocketAddr::new(*ip, port);
        match listen_only(addr) {
            Ok(listener) => listeners.push(listener),
            Err(error) if addr.is_ipv6() && error.raw_os_error() == Some(libc::EAFNOSUPPORT) => {
                debug!(%addr, "no IPv6 in this kernel; healthCheckNodePort served on IPv4 only");
                skipped = Some((addr, error));
            }
            Err(error) => return Err((addr, error)),
        }
    }
    match skipped {
        Some(failure) if listeners.is_empty() => Err(failure),
        _ => Ok(listeners),
    }
}

fn set_health(tx: &watch::Sender<ServiceHealth>, health: ServiceHealth) {
    tx.send_if_modified(|current| {
        if *current == health {
            return false;
        }
        debug!(
            service = %health.service,
            local_endpoints = health.local_endpoints,
            "healthCheckNodePort answer changed"
        );
        *current = health;
        true
    });
}

/// Binds and listens (synchronously, so the error is known at once). Fails
/// with an I/O error, or when there is no tokio runtime to serve from.
pub(crate) fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    listen_socket(addr, false)
}

/// [`listen`], with an IPv6 socket set IPv6-only (`IPV6_V6ONLY`), so that it
/// can share its port with a `0.0.0.0` socket.
fn listen_only(addr: SocketAddr) -> io::Result<TcpListener> {
    listen_socket(addr, true)
}

fn listen_socket(addr: SocketAddr, v6_only: bool) -> io::Result<TcpListener> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(io::Error::other("no tokio runtime to serve from"));
    }
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    if v6_only && addr.is_ipv6() {
        set_v6_only(&socket)?;
    }
    socket.bind(addr)?;
    socket.listen(1024)
}

/// `IPV6_V6ONLY` on: the socket takes IPv6 connections only.
fn set_v6_only(socket: &TcpSocket) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: the fd is the socket's, open while `socket` lives; the option
    // value is a c_int on the stack with its exact size passed.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IPV6,
            libc::IPV6_V6ONLY,
            std::ptr::from_ref(&on).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The accept loop of one port.
async fn serve(listener: TcpListener, health: watch::Receiver<ServiceHealth>) {
    let handler = move |_request| {
        let answer = response(&health.borrow());
        async move { answer }
    };
    serve_http(listener, "healthCheckNodePort", handler).await;
}

/// Serves HTTP/1.1 on `listener` until the task is dropped: one request per
/// connection, answered by `handler`. Connections are served on tasks it
/// owns, so they end with it. `what` names the server in debug logs. Shared
/// by the healthCheckNodePort servers, `/healthz` and `/metrics`.
pub(crate) async fn serve_http<H, F>(listener: TcpListener, what: &'static str, handler: H)
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let mut connections = JoinSet::new();
    loop {
        let accepted = listener.accept().await;
        while connections.try_join_next().is_some() {}
        match accepted {
            Ok((stream, _peer)) => {
                connections.spawn(serve_connection(stream, what, handler.clone()));
            }
            Err(error) => {
                debug!(%error, server = what, "accept failed");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
            }
        }
    }
}

/// Answers one request on `stream` and closes it.
async fn serve_connection<H, F>(stream: TcpStream, what: &'static str, handler: H)
where
    H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let service = hyper::service::service_fn(move |request| {
        let answer = handler(request);
        async move { Ok::<_, Infallible>(answer.await) }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .keep_alive(false);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    match tokio::time::timeout(CONNECTION_TIMEOUT, connection).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => debug!(%error, server = what, "connection failed"),
        Err(_) => debug!(server = what, "connection timed out"),
    }
}

/// A response with `body` and `content_type`, and kube-proxy's
/// `X-Content-Type-Options: nosniff`.
pub(crate) fn http_response(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    response
}

/// kube-proxy's body, field for field.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Payload<'a> {
    service: PayloadService<'a>,
    local_endpoints: usize,
    service_proxy_healthy: bool,
}

#[derive(serde::Serialize)]
struct PayloadService<'a> {
    namespace: &'a str,
    name: &'a str,
}

/// The answer for `health`: 200 with local endpoints, 503 without.
fn response(health: &ServiceHealth) -> Response<Full<Bytes>> {
    let payload = Payload {
        service: PayloadService {
            namespace: &health.service.namespace,
            name: &health.service.name,
        },
        local_endpoints: health.local_endpoints,
        service_proxy_healthy: true,
    };
    // Cannot fail: strings, a number and a bool.
    let body = serde_json::to_vec(&payload).unwrap_or_default();
    let status = if health.local_endpoints > 0 {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    http_response(status, "application/json", body)
}

/// A raw HTTP/1.1 GET for the servers' tests.
#[cfg(test)]
pub(crate) mod test_http {
    use std::time::Duration;

    use tokio::{
        io::{AsyncReadExt as _, AsyncWriteExt as _},
        net::TcpStream,
    };

    pub(crate) struct Answer {
        pub status: u16,
        /// The status line and headers, lowercased.
        pub head: String,
        pub body: String,
    }

    /// Sends `GET path` on `stream` and reads the answer until the server
    /// closes.
    pub(crate) async fn get_on(mut stream: TcpStream, path: &str) -> Answer {
        stream
            .write_all(format!("GET {path} HTTP/1.1\r\nHost: node\r\n\r\n").as_bytes())
            .await
            .expect("write");
        let mut raw = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut raw))
            .await
            .expect("answer in time")
            .expect("read");
        let text = String::from_utf8(raw).expect("utf-8");
        let (head, body) = text.split_once("\r\n\r\n").expect("head and body");
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .expect("status");
        Answer {
            status,
            head: head.to_ascii_lowercase(),
            body: body.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        BackendAddr, Frontend, FrontendAddr, FrontendKind, Protocol, ServicePortName,
    };

    const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    /// A port nothing listens on right now.
    fn free_port() -> u16 {
        let l = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
        l.local_addr().expect("local addr").port()
    }

    /// A LoadBalancer frontend of `ns/name:port_name` at `lb_ip:svc_port`.
    fn lb(
        ns: &str,
        name: &str,
        lb_ip: [u8; 4],
        svc_port: u16,
        health_port: Option<u16>,
        local: &[([u8; 4], u16)],
    ) -> Frontend {
        let mut fe = Frontend::cluster_ip(
            FrontendAddr {
                ip: Ipv4Addr::from(lb_ip).into(),
                port: svc_port,
                protocol: Protocol::Tcp,
            },
            ServicePortName {
                namespace: ns.into(),
                name: name.into(),
                port: svc_port.to_string().into(),
            },
            Vec::new(),
        );
        fe.kind = FrontendKind::LoadBalancer;
        fe.local_only = health_port.is_some();
        fe.health_check_node_port = health_port;
        fe.external_backends = health_port.map(|_| {
            local
                .iter()
                .map(|(ip, port)| BackendAddr {
                    ip: Ipv4Addr::from(*ip).into(),
                    port: *port,
                })
                .collect()
        });
        fe
    }

    fn state(frontends: Vec<Frontend>) -> DesiredState {
        DesiredState {
            frontends: frontends.into_iter().map(|f| (f.addr, f)).collect(),
        }
    }

    /// `web` in `shop` on two ports, with two local endpoints (each on both ports).
    fn web(health_port: u16) -> Vec<Frontend> {
        let local = [([10, 244, 1, 2], 8080), ([10, 244, 1, 3], 8080)];
        let local_tls = [([10, 244, 1, 2], 8443), ([10, 244, 1, 3], 8443)];
        vec![
            lb(
                "shop",
                "web",
                [203, 0, 113, 1],
                80,
                Some(health_port),
                &local,
            ),
            lb(
                "shop",
                "web",
                [203, 0, 113, 1],
                443,
                Some(health_port),
                &local_tls,
            ),
        ]
    }

    use super::test_http::{get_on, Answer};

    async fn get(port: u16) -> Answer {
        get_on(
            TcpStream::connect((LOCALHOST, port))
                .await
                .expect("connect"),
            "/any/path",
        )
        .await
    }

    fn body(ns: &str, name: &str, n: usize) -> String {
        format!(
            r#"{{"service":{{"namespace":"{ns}","name":"{name}"}},"localEndpoints":{n},"serviceProxyHealthy":true}}"#
        )
    }

    /// Waits until connecting to `port` is refused.
    async fn refused(port: u16) {
        for _ in 0..100 {
            match TcpStream::connect((LOCALHOST, port)).await {
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => return,
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        panic!("port {port} still accepts connections");
    }

    #[test]
    fn wanted_counts_distinct_local_addresses_over_ports() {
        let mut frontends = web(30_000);
        // A Cluster-policy LoadBalancer and a ClusterIP: no health port.
        frontends.push(lb("shop", "api", [203, 0, 113, 2], 80, None, &[]));
        let (wanted, conflicts) = wanted(&state(frontends));
        assert!(conflicts.is_empty());
        let ports: Vec<_> = wanted
            .iter()
            .map(|(p, h)| (*p, h.service.to_string(), h.local_endpoints))
            .collect();
        assert_eq!(ports, [(30_000, "shop/web".to_string(), 2)]);
    }

    #[test]
    fn a_dual_stack_pod_counts_once() {
        let mut frontends = web(30_000);
        // The same two pods' IPv6 addresses, on the IPv6 load-balancer IP.
        let mut v6 = frontends[0].clone();
        v6.addr.ip = "2001:db8::2".parse().unwrap();
        v6.external_backends = Some(vec![
            BackendAddr {
                ip: "fd00:244::2".parse().unwrap(),
                port: 8080,
            },
            BackendAddr {
                ip: "fd00:244::3".parse().unwrap(),
                port: 8080,
            },
        ]);
        frontends.push(v6);
        let (wanted, _) = wanted(&state(frontends));
        assert_eq!(wanted[&30_000].local_endpoints, 2);
    }

    /// `shop/web` (LoadBalancer, `externalTrafficPolicy: Local`, health check
    /// on `health_port`) through the model on `node-a`, with one endpoint per
    /// `(address, node, ready)`; an endpoint that is not ready is serving
    /// and terminating.
    fn through_model(health_port: u16, endpoints: &[(&str, &str, bool)]) -> DesiredState {
        let service = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "shop", "name": "web"},
            "spec": {
                "type": "LoadBalancer",
                "clusterIP": "10.96.0.10",
                "externalTrafficPolicy": "Local",
                "healthCheckNodePort": health_port,
                "ports": [{"port": 80, "nodePort": 30080}],
            },
        }))
        .expect("a Service");
        let endpoints: Vec<_> = endpoints
            .iter()
            .map(|(ip, node, ready)| {
                serde_json::json!({
                    "addresses": [ip],
                    "nodeName": node,
                    "conditions": {"ready": ready, "serving": true, "terminating": !ready},
                })
            })
            .collect();
        let slice = serde_json::from_value(serde_json::json!({
            "metadata": {
                "namespace": "shop",
                "name": "web-1",
                "labels": {"kubernetes.io/service-name": "web"},
            },
            "addressType": "IPv4",
            "ports": [{"port": 8080}],
            "endpoints": endpoints,
        }))
        .expect("an EndpointSlice");
        let node = crate::model::NodeInfo {
            name: "node-a".into(),
            addresses: vec![Ipv4Addr::new(192, 168, 1, 10).into()],
            zone: None,
            deleting: false,
        };
        let (desired, warnings) =
            crate::model::build_for_node(&[service], &[slice], Some(&node), None);
        assert!(warnings.is_empty(), "{warnings:?}");
        desired
    }

    #[test]
    fn wanted_counts_only_ready_local_endpoints() {
        let count = |endpoints: &[(&str, &str, bool)]| {
            wanted(&through_model(30_000, endpoints)).0[&30_000].local_endpoints
        };
        let remote = ("10.244.2.2", "node-b", true);
        let ready = [
            ("10.244.1.2", "node-a", true),
            ("10.244.1.3", "node-a", true),
            remote,
        ];
        assert_eq!(count(&ready), 2, "ready");
        let terminating = [("10.244.1.2", "node-a", false), remote];
        assert_eq!(count(&terminating), 0, "only terminating");
        let mix = [
            ("10.244.1.2", "node-a", true),
            ("10.244.1.3", "node-a", false),
            remote,
        ];
        assert_eq!(count(&mix), 1, "a mix");
    }

    #[test]
    fn terminating_local_endpoints_still_take_outside_traffic() {
        let desired = through_model(30_000, &[("10.244.1.2", "node-a", false)]);
        let nodeport = desired
            .frontends
            .values()
            .find(|fe| fe.kind == FrontendKind::NodePort)
            .expect("a NodePort frontend");
        let local: Vec<String> = nodeport
            .external_backends
            .iter()
            .flatten()
            .map(ToString::to_string)
            .collect();
        assert_eq!(local, ["10.244.1.2:8080"], "{nodeport}");
        assert_eq!(wanted(&desired).0[&30_000].local_endpoints, 0);
    }

    #[tokio::test]
    async fn only_terminating_local_endpoints_answer_503() {
        let port = free_port();
        let ready = [("10.244.1.2", "node-a", true)];
        let terminating = [("10.244.1.2", "node-a", false)];
        let mut servers = HealthServers::new(&[LOCALHOST]);
        servers.update(&through_model(port, &ready));
        let answer = get(port).await;
        assert_eq!((answer.status, answer.body), (200, body("shop", "web", 1)));
        servers.update(&through_model(port, &terminating));
        let answer = get(port).await;
        assert_eq!((answer.status, answer.body), (503, body("shop", "web", 0)));
        servers.update(&through_model(port, &[]));
        let answer = get(port).await;
        assert_eq!((answer.status, answer.body), (503, body("shop", "web", 0)));
    }

    #[tokio::test]
    async fn two_local_endpoints_answer_200() {
        let port = free_port();
        let mut servers = HealthServers::new(&[LOCALHOST]);
        servers.update(&state(web(port)));
        assert_eq!(servers.ports().collect::<Vec<_>>(), [port]);
        let answer = get(port).await;
        assert_eq!(answer.status, 200, "{}", answer.head);
        assert!(
            answer.head.contains("content-type: application/json"),
            "{}",
            answer.head
        );
        assert!(
            answer.head.contains("x-content-type-options: nosniff"),
            "{}",
            answer.head
        );
        assert_eq!(answer.body, body("shop", "web", 2));
    }

    #[tokio::test]
    async fn no_local_endpoints_answer_503_on_the_same_listener() {
        let port = free_port();
        let mut servers = HealthServers::new(&[LOCALHOST]);
        servers.update(&state(web(port)));
        assert_eq!(get(port).await.status, 200);

        // A connection accepted before the change is answered after it: the
        // listener (and its connections) was not restarted.
        let early = TcpStream::connect((LOCALHOST, port))
            .await
            .expect("connect");
        tokio::time::sleep(Duration::from_millis(50)).await;
        servers.update(&state(vec![lb(
            "shop",
            "web",
            [203, 0, 113, 1],
            80,
            Some(port),
            &[],
        )]));
        let answer = get_on(early, "/any/path").await;
        assert_eq!(answer.status, 503, "{}", answer.head);
        assert_eq!(answer.body, body("shop", "web", 0));
        assert_eq!(get(port).await.status, 503);
    }

    #[tokio::test]
    async fn removed_service_closes_its_port() {
        let port = free_port();
        let mut servers = HealthServers::new(&[LOCALHOST]);
        servers.update(&state(web(port)));
        assert_eq!(get(port).await.status, 200);
        servers.update(&DesiredState::default());
        assert_eq!(servers.ports().count(), 0);
        refused(port).await;
    }

    #[tokio::test]
    async fn two_services_on_one_port_first_keeps_it() {
        let port = free_port();
        let mut frontends = web(port);
        frontends.push(lb("a-first", "db", [203, 0, 113, 9], 5432, Some(port), &[]));
        let desired = state(frontends);
        let (_, conflicts) = wanted(&desired);
        assert_eq!(
            conflicts,
            [PortConflict {
                port,
                kept: ServiceName {
                    namespace: "a-first".into(),
                    name: "db".into()
                },
                ignored: ServiceName {
                    namespace: "shop".into(),
                    name: "web".into()
                },
            }]
        );
        let mut servers = HealthServers::new(&[LOCALHOST]);
        servers.update(&desired);
        let answer = get(port).await;
        assert_eq!(
            (answer.status, answer.body),
            (503, body("a-first", "db", 0))
        );

        // The first one goes: the port stays open and answers for the other.
        servers.update(&state(web(port)));
        let answer = get(port).await;
        assert_eq!((answer.status, answer.body), (200, body("shop", "web", 2)));
    }

    const LOCALHOST6: IpAddr = IpAddr::V6(Ipv6Addr::LOCALHOST);

    /// A port free on both loopback addresses right now.
    fn free_port_both() -> u16 {
        for _ in 0..50 {
            let port = free_port();
            if std::net::TcpListener::bind((Ipv6Addr::LOCALHOST, port)).is_ok() {
                return port;
            }
        }
        panic!("no port free on both 127.0.0.1 and ::1");
    }

    async fn get_at(ip: IpAddr, port: u16) -> Answer {
        get_on(
            TcpStream::connect((ip, port)).await.expect("connect"),
            "/any/path",
        )
        .await
    }

    #[tokio::test]
    async fn the_port_answers_on_both_families() {
        let port = free_port_both();
        let mut servers = HealthServers::new(&[LOCALHOST, LOCALHOST6]);
        servers.update(&state(web(port)));
        assert_eq!(servers.ports().collect::<Vec<_>>(), [port]);
        for ip in [LOCALHOST, LOCALHOST6] {
            let answer = get_at(ip, port).await;
            assert_eq!(answer.status, 200, "{ip}: {}", answer.head);
            assert_eq!(answer.body, body("shop", "web", 2), "{ip}");
        }
        // Both listeners follow the model's changes...
        servers.update(&state(vec![lb(
            "shop",
            "web",
            [203, 0, 113, 1],
            80,
            Some(port),
            &[],
        )]));
        for ip in [LOCALHOST, LOCALHOST6] {
            assert_eq!(get_at(ip, port).await.status, 503, "{ip}");
        }
        // ...and both close with the Service.
        servers.update(&DesiredState::default());
        for _ in 0..100 {
            match TcpStream::connect((LOCALHOST6, port)).await {
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => break,
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        assert!(
            TcpStream::connect((LOCALHOST6, port)).await.is_err(),
            "[::1]:{port} still open"
        );
        refused(port).await;
    }

    #[tokio::test]
    async fn an_ipv6_socket_is_ipv6_only_beside_the_ipv4_one() {
        let listener = listen_only(SocketAddr::new(LOCALHOST6, 0)).expect("listen");
        let mut on: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: the fd is the listener's, open here; `on` and `len` are
        // live stack values of the sizes passed.
        let rc = unsafe {
            libc::getsockopt(
                listener.as_raw_fd(),
                libc::IPPROTO_IPV6,
                libc::IPV6_V6ONLY,
                std::ptr::from_mut(&mut on).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());
        assert_eq!(
            on, 1,
            "IPV6_V6ONLY must be set, or [::] would take 0.0.0.0's port"
        );
        // /healthz and /metrics keep the kernel's default (dual-stack [::]).
        let plain = listen(SocketAddr::new(LOCALHOST6, 0)).expect("listen");
        assert!(plain.local_addr().expect("addr").is_ipv6());
    }

    #[tokio::test]
    async fn a_port_taken_on_ipv6_only_is_retried_whole() {
        let port = free_port_both();
        let blocker = std::net::TcpListener::bind((Ipv6Addr::LOCALHOST, port)).expect("bind");
        let mut servers = HealthServers::new(&[LOCALHOST, LOCALHOST6]);
        servers.update(&state(web(port)));
        assert_eq!(servers.ports().count(), 0, "[::1]:{port} is taken");
        refused(port).await;
        drop(blocker);
        servers.update(&state(web(port)));
        assert_eq!(servers.ports().collect::<Vec<_>>(), [port]);
        assert_eq!(get_at(LOCALHOST6, port).await.status, 200);
        assert_eq!(get_at(LOCALHOST, port).await.status, 200);
    }

    #[test]
    fn the_production_binds_cover_both_families() {
        assert!(DEFAULT_BINDS.contains(&IpAddr::V4(Ipv4Addr::UNSPECIFIED)));
        assert!(DEFAULT_BINDS.contains(&IpAddr::V6(Ipv6Addr::UNSPECIFIED)));
    }

    #[tokio::test]
    async fn a_port_in_use_is_retried_at_the_next_update() {
        let blocker = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
        let port = blocker.local_addr().expect("addr").port();
        let mut servers = HealthServers::new(&[LOCALHOST]);
        servers.update(&state(web(port)));
        assert_eq!(servers.ports().count(), 0, "the port is taken");
        drop(blocker);
        servers.update(&state(web(port)));
        assert_eq!(servers.ports().collect::<Vec<_>>(), [port]);
        assert_eq!(get(port).await.status, 200);
    }

    #[test]
    fn without_a_runtime_nothing_listens_and_nothing_panics() {
        let mut servers = HealthServers::new(&[LOCALHOST]);
        servers.update(&state(web(free_port())));
        assert_eq!(servers.ports().count(), 0);
    }
}
