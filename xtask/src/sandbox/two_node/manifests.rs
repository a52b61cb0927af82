//! The manifests of the two-node sandbox's shared manifest directory: one
//! Node per node, and the Services (with their EndpointSlices) reached from
//! outside the nodes.
//!
//! Services (namespace [`NAMESPACE`]), each with ports `http` TCP 80→8080 and
//! `dns` UDP 53→5353, and a variant per [`Policy`] (`externalTrafficPolicy`):
//!
//! | [`ExternalService`] | name | type | reached from outside at |
//! |---|---|---|---|
//! | `NodePort` | `web` | NodePort | `<node IP>:30080` TCP, `:30053` UDP |
//! | `LoadBalancer` | `web-lb` | LoadBalancer, `status.loadBalancer.ingress: [{ip: 203.0.113.10}]`, nodePorts 30081/30054, `healthCheckNodePort: 32000` when `Local` | `203.0.113.10:80` TCP, `:53` UDP |
//! | `ExternalIp` | `web-ext` | ClusterIP with `externalIPs: [198.51.100.10]` | `198.51.100.10:80` TCP, `:53` UDP |
//!
//! Each Service's EndpointSlice (`<name>-1`) lists the pods a test picks,
//! with `nodeName` set to their node.
use super::{Node, Pod, EXTERNAL_IP, LB_IP};
use crate::sandbox::{POD_TCP_PORT, POD_UDP_PORT};

/// Namespace of the Services and EndpointSlices.
pub const NAMESPACE: &str = "ext";
/// Service port of `http` (TCP).
pub const SERVICE_TCP_PORT: u16 = 80;
/// Service port of `dns` (UDP).
pub const SERVICE_UDP_PORT: u16 = 53;
/// NodePort of `ext/web`'s `http` port.
pub const NODEPORT_TCP: u16 = 30080;
/// NodePort of `ext/web`'s `dns` port.
pub const NODEPORT_UDP: u16 = 30053;
/// `healthCheckNodePort` of `ext/web-lb` under `externalTrafficPolicy: Local`.
pub const HEALTH_CHECK_NODE_PORT: u16 = 32000;

/// `externalTrafficPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Cluster,
    Local,
}

impl Policy {
    /// The value as the manifest spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Cluster => "Cluster",
            Policy::Local => "Local",
        }
    }
}

/// TCP or UDP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    /// As `switchboard services -o json` prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            Proto::Tcp => "TCP",
            Proto::Udp => "UDP",
        }
    }
    /// The `sb-echo client` flag.
    pub fn client_flag(self) -> &'static str {
        match self {
            Proto::Tcp => "--tcp",
            Proto::Udp => "--udp",
        }
    }
    /// The pods' port for this protocol.
    pub fn pod_port(self) -> u16 {
        match self {
            Proto::Tcp => POD_TCP_PORT,
            Proto::Udp => POD_UDP_PORT,
        }
    }
}

/// An address a client outside the nodes sends to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryPoint {
    pub address: String,
    pub port: u16,
    pub proto: Proto,
}

impl EntryPoint {
    /// `address:port` (`[address]:port` for an IPv6 address).
    pub fn addr(&self) -> String {
        if self.address.contains(':') {
            format!("[{}]:{}", self.address, self.port)
        } else {
            format!("{}:{}", self.address, self.port)
        }
    }
}

impl std::fmt::Display for EntryPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr(), self.proto.as_str())
    }
}

/// The Services reached from outside the nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExternalService {
    /// `ext/web`, type NodePort.
    NodePort,
    /// `ext/web-lb`, type LoadBalancer with ingress IP [`LB_IP`].
    LoadBalancer,
    /// `ext/web-ext`, ClusterIP with external IP [`EXTERNAL_IP`].
    ExternalIp,
}

impl ExternalService {
    pub const ALL: [ExternalService; 3] = [
        ExternalService::NodePort,
        ExternalService::LoadBalancer,
        ExternalService::ExternalIp,
    ];

    /// `metadata.name`.
    pub fn name(self) -> &'static str {
        match self {
            ExternalService::NodePort => "web",
            ExternalService::LoadBalancer => "web-lb",
            ExternalService::ExternalIp => "web-ext",
        }
    }

    fn cluster_ip(self) -> &'static str {
        match self {
            ExternalService::NodePort => "10.96.0.20",
            ExternalService::LoadBalancer => "10.96.0.21",
            ExternalService::ExternalIp => "10.96.0.22",
        }
    }

    /// NodePorts (`http`, `dns`), if the Service has them.
    fn node_ports(self) -> Option<(u16, u16)> {
        match self {
            ExternalService::NodePort => Some((NODEPORT_TCP, NODEPORT_UDP)),
            ExternalService::LoadBalancer => Some((30081, 30054)),
            ExternalService::ExternalIp => None,
        }
    }

    /// File name of the Service manifest in the manifest directory.
    pub fn service_file(self) -> String {
        format!("svc-{}.yaml", self.name())
    }

    /// File name of its EndpointSlice manifest.
    pub fn slice_file(self) -> String {
        format!("eps-{}.yaml", self.name())
    }

    /// Where a client outside reaches the Service's ports through `via`
    /// (only NodePorts depend on the node).
    pub fn entry_points(self, via: Node) -> Vec<EntryPoint> {
        let (address, ports) = match self {
            ExternalService::NodePort => (via.ip(), (NODEPORT_TCP, NODEPORT_UDP)),
            ExternalService::LoadBalancer => (LB_IP, (SERVICE_TCP_PORT, SERVICE_UDP_PORT)),
            ExternalService::ExternalIp => (EXTERNAL_IP, (SERVICE_TCP_PORT, SERVICE_UDP_PORT)),
        };
        vec![
            EntryPoint {
                address: address.to_string(),
                port: ports.0,
                proto: Proto::Tcp,
            },
            EntryPoint {
                address: address.to_string(),
                port: ports.1,
                proto: Proto::Udp,
            },
        ]
    }

    /// The Service manifest under `policy`.
    pub fn yaml(self, policy: Policy) -> String {
        let kind = match self {
            ExternalService::NodePort => "NodePort",
            ExternalService::LoadBalancer => "LoadBalancer",
            ExternalService::ExternalIp => "ClusterIP",
        };
        let mut s = format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: {}\n  namespace: {NAMESPACE}\n\
             spec:\n  type: {kind}\n  clusterIP: {}\n  selector:\n    app: {}\n  externalTrafficPolicy: {}\n",
            self.name(),
            self.cluster_ip(),
            self.name(),
            policy.as_str()
        );
        if self == ExternalService::LoadBalancer && policy == Policy::Local {
            s.push_str(&format!(
                "  healthCheckNodePort: {HEALTH_CHECK_NODE_PORT}\n"
            ));
        }
        if self == ExternalService::ExternalIp {
            s.push_str(&format!("  externalIPs:\n  - {EXTERNAL_IP}\n"));
        }
        s.push_str("  ports:\n");
        let node_ports = self.node_ports();
        for (name, proto, port, target, node_port) in [
            (
                "http",
                "TCP",
                SERVICE_TCP_PORT,
                POD_TCP_PORT,
                node_ports.map(|p| p.0),
            ),
            (
                "dns",
                "UDP",
                SERVICE_UDP_PORT,
                POD_UDP_PORT,
                node_ports.map(|p| p.1),
            ),
        ] {
            s.push_str(&format!(
                "  - name: {name}\n    protocol: {proto}\n    port: {port}\n    targetPort: {target}\n"
            ));
            if let Some(np) = node_port {
                s.push_str(&format!("    nodePort: {np}\n"));
            }
        }
        if self == ExternalService::LoadBalancer {
            s.push_str(&format!(
                "status:\n  loadBalancer:\n    ingress:\n    - ip: {LB_IP}\n"
            ));
        }
        s
    }

    /// [`yaml`](Self::yaml) with `spec.loadBalancerSourceRanges: ranges`.
    pub fn yaml_with_source_ranges(self, policy: Policy, ranges: &[&str]) -> String {
        let list: String = ranges.iter().map(|r| format!("  - {r}\n")).collect();
        self.yaml(policy).replacen(
            "  ports:\n",
            &format!("  loadBalancerSourceRanges:\n{list}  ports:\n"),
            1,
        )
    }

    /// The Service's EndpointSlice with `pods` as ready endpoints.
    pub fn endpointslice_yaml(self, pods: &[Pod]) -> String {
        self.endpointslice_yaml_terminating(pods, &[])
    }

    /// The Service's EndpointSlice with `ready` as ready endpoints, then
    /// `terminating` as pods being deleted that still answer (`ready: false`,
    /// `serving: true`, `terminating: true`).
    pub fn endpointslice_yaml_terminating(self, ready: &[Pod], terminating: &[Pod]) -> String {
        let mut s = format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: IPv4\n\
             metadata:\n  name: {name}-1\n  namespace: {NAMESPACE}\n  labels:\n    kubernetes.io/service-name: {name}\n",
            name = self.name()
        );
        if ready.is_empty() && terminating.is_empty() {
            s.push_str("endpoints: []\n");
        } else {
            s.push_str("endpoints:\n");
        }
        let conditions =
            ready
                .iter()
                .map(|pod| (pod, "ready: true"))
                .chain(terminating.iter().map(|pod| {
                    (
                        pod,
                        "ready: false\n    serving: true\n    terminating: true",
                    )
                }));
        for (pod, conditions) in conditions {
            s.push_str(&format!(
                "- addresses:\n  - {}\n  conditions:\n    {conditions}\n  nodeName: {}\n  targetRef:\n    kind: Pod\n    name: {}\n    namespace: {NAMESPACE}\n",
                pod.ip(),
                pod.node.name(),
                pod.name().to_lowercase()
            ));
        }
        s.push_str(&format!(
            "ports:\n- name: http\n  port: {POD_TCP_PORT}\n  protocol: TCP\n- name: dns\n  port: {POD_UDP_PORT}\n  protocol: UDP\n"
        ));
        s
    }
}

/// `ext/web` (NodePort 30080/TCP, 30053/UDP) under `policy`.
pub fn nodeport_service_yaml(policy: Policy) -> String {
    ExternalService::NodePort.yaml(policy)
}

/// `ext/web-lb` (LoadBalancer, ingress 203.0.113.10; `healthCheckNodePort:
/// 32000` under `Local`).
pub fn loadbalancer_service_yaml(policy: Policy) -> String {
    ExternalService::LoadBalancer.yaml(policy)
}

/// `ext/web-ext` (ClusterIP with `externalIPs: [198.51.100.10]`).
pub fn external_ip_service_yaml(policy: Policy) -> String {
    ExternalService::ExternalIp.yaml(policy)
}

/// The Node object of `node`: its name, `InternalIP` (its LAN address) and
/// pod CIDR.
pub fn node_yaml(node: Node) -> String {
    format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  labels:\n    kubernetes.io/hostname: {name}\n\
         spec:\n  podCIDR: {cidr}\n  podCIDRs:\n  - {cidr}\n\
         status:\n  addresses:\n  - type: InternalIP\n    address: {ip}\n  - type: Hostname\n    address: {name}\n",
        name = node.name(),
        cidr = node.pod_cidr(),
        ip = node.ip()
    )
}

/// The Node object of a dual-stack `node`: as [`node_yaml`], plus its IPv6
/// LAN address as a second `InternalIP` and its IPv6 pod CIDR.
pub fn node_yaml_dual_stack(node: Node) -> String {
    format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  labels:\n    kubernetes.io/hostname: {name}\n\
         spec:\n  podCIDR: {cidr}\n  podCIDRs:\n  - {cidr}\n  - {cidr6}\n\
         status:\n  addresses:\n  - type: InternalIP\n    address: {ip}\n  - type: InternalIP\n    address: {ip6}\n\
         \x20 - type: Hostname\n    address: {name}\n",
        name = node.name(),
        cidr = node.pod_cidr(),
        cidr6 = node.pod_cidr6(),
        ip = node.ip(),
        ip6 = node.ip6()
    )
}

/// The dual-stack NodePort Service `ext/web6` (`RequireDualStack`, cluster
/// IPs 10.96.0.30 and fd00:96::30; `http` TCP 80→8080 NodePort 30090, `dns`
/// UDP 53→5353 NodePort 30063) under `policy`.
pub fn dual_stack_nodeport_yaml(policy: Policy) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: web6\n  namespace: {NAMESPACE}\n\
         spec:\n  type: NodePort\n  clusterIP: 10.96.0.30\n  clusterIPs:\n  - 10.96.0.30\n  - fd00:96::30\n\
         \x20 ipFamilies:\n  - IPv4\n  - IPv6\n  ipFamilyPolicy: RequireDualStack\n\
         \x20 selector:\n    app: web6\n  externalTrafficPolicy: {}\n  ports:\n\
         \x20 - name: http\n    protocol: TCP\n    port: {SERVICE_TCP_PORT}\n    targetPort: {POD_TCP_PORT}\n    nodePort: {DUAL_NODEPORT_TCP}\n\
         \x20 - name: dns\n    protocol: UDP\n    port: {SERVICE_UDP_PORT}\n    targetPort: {POD_UDP_PORT}\n    nodePort: {DUAL_NODEPORT_UDP}\n",
        policy.as_str()
    )
}

/// NodePort of `ext/web6`'s `http` port.
pub const DUAL_NODEPORT_TCP: u16 = 30090;
/// NodePort of `ext/web6`'s `dns` port.
pub const DUAL_NODEPORT_UDP: u16 = 30063;

/// One EndpointSlice of `ext/web6` in `family` (`IPv4` or `IPv6`) with
/// `pods` (at their address of that family) as ready endpoints.
pub fn dual_stack_slice_yaml(family: &str, pods: &[Pod]) -> String {
    let mut s = format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: {family}\n\
         metadata:\n  name: web6-{}\n  namespace: {NAMESPACE}\n  labels:\n    kubernetes.io/service-name: web6\n",
        family.to_lowercase()
    );
    s.push_str(if pods.is_empty() {
        "endpoints: []\n"
    } else {
        "endpoints:\n"
    });
    for pod in pods {
        let addr = if family == "IPv6" {
            pod.ip6()
        } else {
            pod.ip()
        };
        s.push_str(&format!(
            "- addresses:\n  - {addr}\n  conditions:\n    ready: true\n  nodeName: {}\n  targetRef:\n    kind: Pod\n    name: {}\n    namespace: {NAMESPACE}\n",
            pod.node.name(),
            pod.name().to_lowercase()
        ));
    }
    s.push_str(&format!(
        "ports:\n- name: http\n  port: {POD_TCP_PORT}\n  protocol: TCP\n- name: dns\n  port: {POD_UDP_PORT}\n  protocol: UDP\n"
    ));
    s
}

/// File name of `node`'s Node manifest.
pub fn node_file(node: Node) -> String {
    format!("node-{}.yaml", node.letter())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> serde_json::Value {
        serde_saphyr::from_str(yaml).unwrap_or_else(|e| panic!("{e}: {yaml}"))
    }

    #[test]
    fn services_are_valid_yaml_with_the_expected_fields() {
        let lb = parse(&loadbalancer_service_yaml(Policy::Local));
        assert_eq!(lb["spec"]["healthCheckNodePort"].as_u64(), Some(32000));
        assert_eq!(lb["spec"]["externalTrafficPolicy"].as_str(), Some("Local"));
        assert_eq!(
            lb["status"]["loadBalancer"]["ingress"][0]["ip"].as_str(),
            Some(LB_IP)
        );
        let lb = parse(&loadbalancer_service_yaml(Policy::Cluster));
        assert!(lb["spec"]["healthCheckNodePort"].is_null());
        let np = parse(&nodeport_service_yaml(Policy::Cluster));
        assert_eq!(np["spec"]["ports"][0]["nodePort"].as_u64(), Some(30080));
        assert_eq!(np["spec"]["ports"][1]["nodePort"].as_u64(), Some(30053));
        assert_eq!(np["spec"]["ports"][1]["protocol"].as_str(), Some("UDP"));
        let ext = parse(&external_ip_service_yaml(Policy::Local));
        assert_eq!(ext["spec"]["externalIPs"][0].as_str(), Some(EXTERNAL_IP));
        assert!(ext["spec"]["ports"][0]["nodePort"].is_null());
    }

    #[test]
    fn slices_carry_node_names() {
        let pods = [Pod::new(Node::A, 1), Pod::new(Node::B, 2)];
        let eps = parse(&ExternalService::NodePort.endpointslice_yaml(&pods));
        assert_eq!(
            eps["endpoints"][0]["addresses"][0].as_str(),
            Some("10.244.1.2")
        );
        assert_eq!(eps["endpoints"][0]["nodeName"].as_str(), Some("node-a"));
        assert_eq!(
            eps["endpoints"][1]["addresses"][0].as_str(),
            Some("10.244.2.3")
        );
        assert_eq!(eps["endpoints"][1]["nodeName"].as_str(), Some("node-b"));
        let empty = parse(&ExternalService::NodePort.endpointslice_yaml(&[]));
        assert_eq!(empty["endpoints"].as_array().map(Vec::len), Some(0));
    }

    #[test]
    fn dual_stack_manifests_parse_with_both_families() {
        let node = parse(&node_yaml_dual_stack(Node::A));
        assert_eq!(
            node["status"]["addresses"][1]["address"].as_str(),
            Some("fd00:50::1")
        );
        assert_eq!(
            node["status"]["addresses"][2]["type"].as_str(),
            Some("Hostname")
        );
        assert_eq!(
            node["spec"]["podCIDRs"][1].as_str(),
            Some("fd00:10:244:1::/64")
        );
        let svc = parse(&dual_stack_nodeport_yaml(Policy::Local));
        assert_eq!(svc["spec"]["clusterIPs"][1].as_str(), Some("fd00:96::30"));
        assert_eq!(
            svc["spec"]["ipFamilyPolicy"].as_str(),
            Some("RequireDualStack")
        );
        assert_eq!(svc["spec"]["externalTrafficPolicy"].as_str(), Some("Local"));
        assert_eq!(svc["spec"]["ports"][1]["nodePort"].as_u64(), Some(30063));
        let eps = parse(&dual_stack_slice_yaml("IPv6", &[Pod::new(Node::B, 2)]));
        assert_eq!(eps["addressType"].as_str(), Some("IPv6"));
        assert_eq!(
            eps["endpoints"][0]["addresses"][0].as_str(),
            Some("fd00:10:244:2::3")
        );
        assert_eq!(eps["endpoints"][0]["nodeName"].as_str(), Some("node-b"));
        let entry = EntryPoint {
            address: "fd00:50::1".into(),
            port: 30090,
            proto: Proto::Tcp,
        };
        assert_eq!(entry.addr(), "[fd00:50::1]:30090");
    }

    #[test]
    fn nodes_have_their_internal_ip() {
        let node = parse(&node_yaml(Node::B));
        assert_eq!(node["metadata"]["name"].as_str(), Some("node-b"));
        assert_eq!(
            node["status"]["addresses"][0]["type"].as_str(),
            Some("InternalIP")
        );
        assert_eq!(
            node["status"]["addresses"][0]["address"].as_str(),
            Some("192.168.50.2")
        );
    }
}
