//! The Services every path of the end-to-end benchmark is given: one target
//! Service whose endpoints are the sandbox's three pods, plus filler Services
//! with ten endpoints each (addresses nobody answers on; no traffic goes
//! there). The same list is rendered as YAML for switchboard, as
//! iptables-restore input and as an `nft -f` file in kube-proxy's layouts
//! (see `kubeproxy.rs`).

use std::fmt::Write as _;
use std::net::Ipv4Addr;

use serde_json::json;

/// The target Service's ClusterIP (the demo's address).
pub const TARGET_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
pub const HTTP_PORT: u16 = 80;
pub const POD_HTTP_PORT: u16 = 8080;
pub const UDP_PORT: u16 = 53;
pub const POD_UDP_PORT: u16 = 5353;
pub const BULK_PORT: u16 = 5201;
pub const POD_BULK_PORT: u16 = 5201;
/// The light workload's server (`sb-http serve --light`), on the target
/// Service and the pinned ones only.
pub const LIGHT_PORT: u16 = 81;
pub const POD_LIGHT_PORT: u16 = 8081;
/// Endpoints per filler Service.
pub const FILLER_ENDPOINTS: u32 = 10;
/// The pods' network (kube-proxy's `--cluster-cidr`).
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    pub fn lower(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }
    pub fn upper(self) -> &'static str {
        match self {
            Proto::Tcp => "TCP",
            Proto::Udp => "UDP",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Port {
    pub name: String,
    pub port: u16,
    pub target: u16,
    pub proto: Proto,
}

#[derive(Clone, Debug)]
pub struct Svc {
    pub namespace: String,
    pub name: String,
    pub cluster_ip: Ipv4Addr,
    pub ports: Vec<Port>,
    pub endpoints: Vec<Ipv4Addr>,
}

/// The sandbox pods' addresses, the target Service's endpoints.
pub fn pod_ips() -> Vec<Ipv4Addr> {
    (1..=crate::sandbox::PODS)
        .map(|i| {
            crate::sandbox::pod_ip(i)
                .parse()
                .expect("valid pod address")
        })
        .collect()
}

fn nth_ip(base: Ipv4Addr, n: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(base) + n)
}

/// `count` Services in total: `count - 1` fillers and the target, which sits
/// in the middle of the list (kube-proxy's iptables mode matches Services one
/// rule after another, so a Service's position matters; the middle is the
/// average case).
pub fn services(count: u32, pods: &[Ipv4Addr]) -> Vec<Svc> {
    services_with(count, pods, 0)
}

/// The end-to-end benchmark's Services: [`services`] with, in place of
/// fillers, one Service per pod whose only endpoint is that pod
/// ([`pinned_ip`]), for the socket-layer row whose client `i` always reaches
/// pod `i` as the direct rows do; the target and the pinned Services also
/// have the light workload's port. `count` stays the total from 4 Services
/// up.
pub fn e2e_services(count: u32, pods: &[Ipv4Addr]) -> Vec<Svc> {
    let light = Port {
        name: "light".into(),
        port: LIGHT_PORT,
        target: POD_LIGHT_PORT,
        proto: Proto::Tcp,
    };
    let mut all = services_with(count, pods, pods.len() as u32);
    for target in all.iter_mut().filter(|s| s.cluster_ip == TARGET_IP) {
        target.ports.push(light.clone());
    }
    all.extend(pods.iter().enumerate().map(|(i, &pod)| {
        Svc {
            namespace: "bench".into(),
            name: format!("pinned-{}", i + 1),
            cluster_ip: pinned_ip(i + 1),
            ports: target_ports()
                .into_iter()
                .chain(std::iter::once(light.clone()))
                .collect(),
            endpoints: vec![pod],
        }
    }));
    all
}

/// The ClusterIP of the Service whose one endpoint is pod `i` (1-based).
pub fn pinned_ip(i: usize) -> Ipv4Addr {
    nth_ip(TARGET_IP, i as u32)
}

/// The target Service's ports (HTTP, UDP, the bulk stream).
fn target_ports() -> Vec<Port> {
    vec![
        Port {
            name: "http".into(),
            port: HTTP_PORT,
            target: POD_HTTP_PORT,
            proto: Proto::Tcp,
        },
        Port {
            name: "udp".into(),
            port: UDP_PORT,
            target: POD_UDP_PORT,
            proto: Proto::Udp,
        },
        Port {
            name: "bulk".into(),
            port: BULK_PORT,
            target: POD_BULK_PORT,
            proto: Proto::Tcp,
        },
    ]
}

/// [`services`] with `reserved` fewer fillers (at least the target stays).
fn services_with(count: u32, pods: &[Ipv4Addr], reserved: u32) -> Vec<Svc> {
    let fillers = count.saturating_sub(1 + reserved);
    let mut all: Vec<Svc> = (0..fillers)
        .map(|i| Svc {
            namespace: "bench".into(),
            name: format!("fill-{i}"),
            cluster_ip: nth_ip(Ipv4Addr::new(10, 100, 0, 0), i),
            ports: vec![Port {
                name: "http".into(),
                port: HTTP_PORT,
                target: POD_HTTP_PORT,
                proto: Proto::Tcp,
            }],
            endpoints: (0..FILLER_ENDPOINTS)
                .map(|j| nth_ip(Ipv4Addr::new(10, 128, 0, 0), i * FILLER_ENDPOINTS + j))
                .collect(),
        })
        .collect();
    let target = Svc {
        namespace: "bench".into(),
        name: "target".into(),
        cluster_ip: TARGET_IP,
        ports: target_ports(),
        endpoints: pods.to_vec(),
    };
    let middle = all.len() / 2;
    all.insert(middle, target);
    all
}

/// Number of frontends (service ports) in `services`.
pub fn frontends(services: &[Svc]) -> usize {
    services.iter().map(|s| s.ports.len()).sum()
}

/// How the manifests are written: the two shapes a directory of YAML comes
/// in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// Block mappings and sequences throughout, as `kubectl get -o yaml`
    /// prints objects.
    Block,
    /// As people write manifests by hand: block structure at the top, flow
    /// mappings and sequences inside (`metadata: {name: a, namespace: b}`,
    /// `ports: [{port: 80}]`), the slices' addresses quoted.
    Flow,
}

impl Style {
    /// `block` or `flow`, as the benchmark's results name it.
    pub fn name(self) -> &'static str {
        match self {
            Style::Block => "block",
            Style::Flow => "flow",
        }
    }
}

/// One Service and its EndpointSlice as YAML documents in `style`.
pub fn yaml(svc: &Svc, style: Style, out: &mut String) {
    match style {
        Style::Block => yaml_block(svc, out),
        Style::Flow => yaml_flow(svc, out),
    }
}

/// [`yaml`] in the shape `kubectl get -o yaml` prints.
fn yaml_block(svc: &Svc, out: &mut String) {
    let _ = write!(
        out,
        "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  type: ClusterIP\n  clusterIP: {ip}\n  clusterIPs:\n  - {ip}\n  selector:\n    app: {name}\n  ports:\n",
        name = svc.name,
        ns = svc.namespace,
        ip = svc.cluster_ip
    );
    for p in &svc.ports {
        let _ = write!(
            out,
            "  - name: {}\n    port: {}\n    protocol: {}\n    targetPort: {}\n",
            p.name,
            p.port,
            p.proto.upper(),
            p.target
        );
    }
    let _ = write!(
        out,
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: IPv4\nmetadata:\n  name: {name}-abcde\n  namespace: {ns}\n  labels:\n    kubernetes.io/service-name: {name}\nendpoints:\n",
        name = svc.name,
        ns = svc.namespace
    );
    for ep in &svc.endpoints {
        let _ = write!(
            out,
            "- addresses:\n  - {ep}\n  conditions:\n    ready: true\n    serving: true\n    terminating: false\n"
        );
    }
    out.push_str("ports:\n");
    for p in &svc.ports {
        let _ = write!(
            out,
            "- name: {}\n  port: {}\n  protocol: {}\n",
            p.name,
            p.target,
            p.proto.upper()
        );
    }
}

/// [`yaml`] as people write it by hand (see [`Style::Flow`]).
fn yaml_flow(svc: &Svc, out: &mut String) {
    let _ = write!(
        out,
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  type: ClusterIP\n  clusterIP: {ip}\n  clusterIPs: [{ip}]\n  selector: {{app: {name}}}\n  ports:\n",
        name = svc.name,
        ns = svc.namespace,
        ip = svc.cluster_ip
    );
    for p in &svc.ports {
        let _ = writeln!(
            out,
            "  - {{name: {}, port: {}, protocol: {}, targetPort: {}}}",
            p.name,
            p.port,
            p.proto.upper(),
            p.target
        );
    }
    let _ = write!(
        out,
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: IPv4\nmetadata:\n  name: {name}-abcde\n  namespace: {ns}\n  labels: {{kubernetes.io/service-name: {name}}}\nendpoints:\n",
        name = svc.name,
        ns = svc.namespace
    );
    for ep in &svc.endpoints {
        let _ = writeln!(
            out,
            "- addresses: [\"{ep}\"]\n  conditions: {{ready: true, serving: true, terminating: false}}"
        );
    }
    let ports: Vec<String> = svc
        .ports
        .iter()
        .map(|p| {
            format!(
                "{{name: {}, port: {}, protocol: {}}}",
                p.name,
                p.target,
                p.proto.upper()
            )
        })
        .collect();
    let _ = writeln!(out, "ports: [{}]", ports.join(", "));
}

/// One Service as the API server holds it (the same object [`yaml`] writes),
/// for the fake API server.
pub fn service_json(svc: &Svc) -> serde_json::Value {
    let ports: Vec<serde_json::Value> = svc
        .ports
        .iter()
        .map(|p| json!({"name": p.name, "port": p.port, "protocol": p.proto.upper(), "targetPort": p.target}))
        .collect();
    let ip = svc.cluster_ip.to_string();
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": svc.name, "namespace": svc.namespace},
        "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
                 "selector": {"app": svc.name}, "ports": ports}
    })
}

/// The Service's EndpointSlice (the same object [`yaml`] writes).
pub fn slice_json(svc: &Svc) -> serde_json::Value {
    let endpoints: Vec<serde_json::Value> = svc
        .endpoints
        .iter()
        .map(|ep| {
            json!({"addresses": [ep.to_string()],
                   "conditions": {"ready": true, "serving": true, "terminating": false}})
        })
        .collect();
    let ports: Vec<serde_json::Value> = svc
        .ports
        .iter()
        .map(|p| json!({"name": p.name, "port": p.target, "protocol": p.proto.upper()}))
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": format!("{}-abcde", svc.name), "namespace": svc.namespace,
                     "labels": {"kubernetes.io/service-name": svc.name}},
        "endpoints": endpoints,
        "ports": ports
    })
}

/// The Services as manifest files of at most `per_file` Services each, in
/// `style`: `(file name, contents)`.
pub fn manifest_files(services: &[Svc], per_file: usize, style: Style) -> Vec<(String, String)> {
    services
        .chunks(per_file.max(1))
        .enumerate()
        .map(|(i, chunk)| {
            let mut text = String::with_capacity(chunk.len() * 1200);
            for svc in chunk {
                yaml(svc, style, &mut text);
            }
            (format!("services-{i:04}.yaml"), text)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_is_in_the_middle_and_counts_add_up() {
        let pods = [Ipv4Addr::new(10, 244, 1, 2)];
        let s = services(1001, &pods);
        assert_eq!(s.len(), 1001);
        assert_eq!(s[500].name, "target");
        assert_eq!(frontends(&s), 1000 + 3);
        assert_eq!(services(1, &pods).len(), 1);
    }

    /// The end-to-end Services keep the total, and only the target and
    /// the pinned Services carry the light workload's port.
    #[test]
    fn e2e_services_add_the_light_port_to_the_target_and_the_pinned() {
        let pods = [
            Ipv4Addr::new(10, 244, 1, 2),
            Ipv4Addr::new(10, 244, 2, 2),
            Ipv4Addr::new(10, 244, 3, 2),
        ];
        let s = e2e_services(1000, &pods);
        assert_eq!(s.len(), 1000);
        let light: Vec<&str> = s
            .iter()
            .filter(|svc| svc.ports.iter().any(|p| p.port == LIGHT_PORT))
            .map(|svc| svc.name.as_str())
            .collect();
        assert_eq!(light, ["target", "pinned-1", "pinned-2", "pinned-3"]);
        assert_eq!(frontends(&s), 996 + 4 * 4);
    }

    /// Both styles write the objects the fake API server holds (the
    /// target, with three ports and several endpoints, and a filler).
    #[test]
    fn json_objects_match_the_yaml_of_either_style() {
        let pods = [Ipv4Addr::new(10, 244, 1, 2), Ipv4Addr::new(10, 244, 1, 3)];
        let all = services(3, &pods);
        for style in [Style::Block, Style::Flow] {
            for svc in &all {
                let mut text = String::new();
                yaml(svc, style, &mut text);
                let docs: Vec<serde_json::Value> = text
                    .split("---\n")
                    .filter(|d| !d.trim().is_empty())
                    .map(|d| serde_saphyr::from_str(d).unwrap())
                    .collect();
                assert_eq!(docs, vec![service_json(svc), slice_json(svc)], "{style:?}");
            }
        }
    }

    #[test]
    fn yaml_has_both_kinds() {
        let pods = [Ipv4Addr::new(10, 244, 1, 2)];
        let files = manifest_files(&services(3, &pods), 2, Style::Block);
        assert_eq!(files.len(), 2);
        assert!(files[0].1.contains("kind: Service\n"));
        assert!(files[0].1.contains("kind: EndpointSlice\n"));
        assert!(files[0].1.contains("kubernetes.io/service-name: fill-0"));
    }
}
