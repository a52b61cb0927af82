//! The model's rules, case by case, and the incremental model against a full build.
use super::*;
use std::collections::BTreeSet;
use std::net::{Ipv4Addr, Ipv6Addr};

/// Services and EndpointSlices from a multi-document manifest.
fn objects(yaml: &str) -> (Vec<Service>, Vec<EndpointSlice>) {
    let mut services = Vec::new();
    let mut slices = Vec::new();
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(yaml).expect("test YAML parses");
    for value in docs {
        if value.is_null() {
            continue;
        }
        match value["kind"].as_str() {
            Some("Service") => services.push(serde_json::from_value(value).expect("a Service")),
            Some("EndpointSlice") => {
                slices.push(serde_json::from_value(value).expect("an EndpointSlice"))
            }
            other => panic!("unexpected kind {other:?} in test YAML"),
        }
    }
    (services, slices)
}

#[derive(Clone, Copy, Debug)]
enum NodeSel {
    /// No node knowledge (what `build` does).
    Unknown,
    /// node-a, addresses 192.168.1.10 and 203.0.113.10, zone zone-a.
    A,
    /// node-a without a zone label.
    ANoZone,
    /// node-a with an address of each family: 192.168.1.10 and fd00::1:10.
    DualStack,
}

fn node(sel: NodeSel) -> Option<NodeInfo> {
    let a = NodeInfo {
        name: "node-a".into(),
        addresses: vec![
            Ipv4Addr::new(192, 168, 1, 10).into(),
            Ipv4Addr::new(203, 0, 113, 10).into(),
        ],
        zone: Some("zone-a".into()),
        deleting: false,
    };
    match sel {
        NodeSel::Unknown => None,
        NodeSel::A => Some(a),
        NodeSel::ANoZone => Some(NodeInfo { zone: None, ..a }),
        NodeSel::DualStack => Some(NodeInfo {
            addresses: vec![
                Ipv4Addr::new(192, 168, 1, 10).into(),
                Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 1, 0x10).into(),
            ],
            ..a
        }),
    }
}

struct Case {
    name: &'static str,
    node: NodeSel,
    proxy_name: Option<&'static str>,
    yaml: &'static str,
    /// Every frontend, rendered with `Frontend`'s Display (which shows every field).
    frontends: &'static [&'static str],
    warnings: &'static [&'static str],
}

/// Feeds the objects to a [`Model`] one at a time (slices first, everything
/// in reverse order, an update after each), then removes them one at a
/// time: after the last addition the model must equal the full build, and
/// after the last removal it must be empty. Each update's delta must name
/// exactly the addresses whose frontend changed.
fn incremental_agrees(
    services: &[Service],
    slices: &[EndpointSlice],
    node: Option<&NodeInfo>,
    proxy_name: Option<&str>,
) -> Result<(), String> {
    let (want, want_warnings) = build_for_node(services, slices, node, proxy_name);
    let mut model = Model::new(node.cloned(), proxy_name.map(str::to_owned));
    let mut interner = Interner::default();
    let slices: Vec<SliceInfo> = slices
        .iter()
        .map(|s| SliceInfo::from_k8s(s, &mut interner))
        .collect();
    let services: Vec<ServiceInfo> = services.iter().map(ServiceInfo::from_k8s).collect();
    let step = |model: &mut Model, what: &str| -> Result<(), String> {
        let before = model.desired().clone();
        let delta = model.update();
        let changed: BTreeSet<FrontendAddr> = before
            .frontends
            .keys()
            .chain(model.desired().frontends.keys())
            .filter(|a| before.frontends.get(a) != model.desired().frontends.get(a))
            .copied()
            .collect();
        if delta.frontends != changed {
            return Err(format!(
                "after {what}: delta {:?}, changed {changed:?}",
                delta.frontends
            ));
        }
        Ok(())
    };
    for slice in slices.iter().rev() {
        model.set_slice(slice.key.clone(), Some(Arc::new(slice.clone())));
        step(&mut model, &format!("adding slice {}", slice.key))?;
    }
    for svc in services.iter().rev() {
        model.set_service(svc.key.clone(), Some(Arc::new(svc.clone())));
        step(&mut model, &format!("adding service {}", svc.key))?;
    }
    let got_warnings: Vec<ModelWarning> = model.warnings().cloned().collect();
    if *model.desired() != want || got_warnings != want_warnings {
        return Err(format!(
            "incremental model differs from the full build:\n  got {:#?}\n  {got_warnings:#?}",
            model
                .desired()
                .frontends
                .values()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
        ));
    }
    for svc in &services {
        model.set_service(svc.key.clone(), None);
        step(&mut model, &format!("removing service {}", svc.key))?;
    }
    for slice in &slices {
        model.set_slice(slice.key.clone(), None);
        step(&mut model, &format!("removing slice {}", slice.key))?;
    }
    if !model.desired().frontends.is_empty() || model.warnings().next().is_some() {
        return Err("objects all removed, but the model is not empty".into());
    }
    Ok(())
}

fn run(cases: &[Case]) {
    let mut failed = Vec::new();
    for c in cases {
        let (services, slices) = objects(c.yaml);
        let node = node(c.node);
        let (state, warnings) = build_for_node(&services, &slices, node.as_ref(), c.proxy_name);
        if let Err(problem) = incremental_agrees(&services, &slices, node.as_ref(), c.proxy_name) {
            failed.push(format!("case {}: {problem}", c.name));
        }
        for (k, f) in &state.frontends {
            assert_eq!(*k, f.addr, "{}: key and frontend address differ", c.name);
            let mut sorted = f.backends.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(
                sorted, f.backends,
                "{}: backends not sorted+deduplicated",
                c.name
            );
            if let Some(external) = &f.external_backends {
                let mut sorted = external.clone();
                sorted.sort();
                sorted.dedup();
                assert_eq!(
                    &sorted, external,
                    "{}: external backends not sorted+deduplicated",
                    c.name
                );
            }
            assert_eq!(
                f.external_backends.is_some(),
                f.local_only && f.kind.is_external(),
                "{}: external_backends is set exactly for Local external frontends",
                c.name
            );
        }
        let got: Vec<String> = state.frontends.values().map(ToString::to_string).collect();
        let got_w: Vec<String> = warnings.iter().map(ToString::to_string).collect();
        if got != c.frontends || got_w != c.warnings {
            failed.push(format!(
                    "case {}:\n  frontends want {:#?}\n            got  {:#?}\n  warnings want {:#?}\n           got  {:#?}",
                    c.name, c.frontends, got, c.warnings, got_w
                ));
        }
    }
    assert!(
        failed.is_empty(),
        "{} case(s) failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

/// The plainest case, asserted field by field against the struct (the
/// table tests compare the Display rendering, which shows every field).
#[test]
fn clusterip_exact_state() {
    let (services, slices) = objects(
        r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-abc, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [10.244.1.3]
- addresses: [10.244.1.2]
  conditions: {ready: true}
"#,
    );
    let (state, warnings) = build(&services, &slices);
    assert!(warnings.is_empty(), "{warnings:?}");
    let addr = FrontendAddr {
        ip: Ipv4Addr::new(10, 96, 0, 10).into(),
        port: 80,
        protocol: Protocol::Tcp,
    };
    let want = DesiredState {
        frontends: BTreeMap::from([(
            addr,
            Frontend {
                addr,
                service: ServicePortName {
                    namespace: "shop".into(),
                    name: "web".into(),
                    port: "http".into(),
                },
                backends: vec![
                    BackendAddr {
                        ip: Ipv4Addr::new(10, 244, 1, 2).into(),
                        port: 8080,
                    },
                    BackendAddr {
                        ip: Ipv4Addr::new(10, 244, 1, 3).into(),
                        port: 8080,
                    },
                ],
                external_backends: None,
                kind: FrontendKind::ClusterIp,
                affinity_timeout_s: None,
                local_only: false,
                health_check_node_port: None,
                terminating_fallback: false,
                external_terminating_fallback: false,
                topology: None,
                algorithm: None,
                source_ranges: None,
                weights: Box::default(),
            },
        )]),
    };
    assert_eq!(state, want);
}

#[test]
fn displays() {
    let f = FrontendAddr {
        ip: Ipv4Addr::new(10, 96, 0, 10).into(),
        port: 80,
        protocol: Protocol::Tcp,
    };
    assert_eq!(f.to_string(), "10.96.0.10:80/TCP");
    assert_eq!(Protocol::Udp.to_string(), "UDP");
    let b = BackendAddr {
        ip: Ipv4Addr::new(10, 244, 1, 2).into(),
        port: 8080,
    };
    assert_eq!(b.to_string(), "10.244.1.2:8080");
    let mut spn = ServicePortName {
        namespace: "ns".into(),
        name: "name".into(),
        port: "port".into(),
    };
    assert_eq!(spn.to_string(), "ns/name:port");
    spn.port = "".into();
    assert_eq!(spn.to_string(), "ns/name");
    let w = ModelWarning {
        object: "Service ns/name".into(),
        problem: "SCTP is not supported".into(),
    };
    assert_eq!(w.to_string(), "Service ns/name: SCTP is not supported");
}

#[test]
fn node_info_from_node() {
    let k8s_node: Node = serde_saphyr::from_str(
        r#"
apiVersion: v1
kind: Node
metadata: {name: node-a, labels: {topology.kubernetes.io/zone: zone-a}}
status:
  addresses:
  - {type: Hostname, address: node-a}
  - {type: ExternalIP, address: 203.0.113.10}
  - {type: InternalIP, address: 192.168.1.10}
  - {type: InternalIP, address: "fd00::10"}
  - {type: InternalIP, address: 192.168.1.10}
"#,
    )
    .expect("a Node");
    // Both families, InternalIPs first, each once.
    let mut want = node(NodeSel::A).expect("node A");
    want.addresses
        .insert(1, "fd00::10".parse().expect("an address"));
    assert_eq!(NodeInfo::from_node(&k8s_node), want);
    let bare: Node = serde_saphyr::from_str("apiVersion: v1\nkind: Node\nmetadata: {name: n}\n")
        .expect("a Node");
    assert_eq!(
        NodeInfo::from_node(&bare),
        NodeInfo {
            name: "n".into(),
            addresses: vec![],
            zone: None,
            deleting: false,
        }
    );
}

/// Issue 2: ClusterIP Services from manifests.
#[test]
fn cluster_ip_rules() {
    run(&[
            Case {
                name: "one ClusterIP port, ready and condition-less endpoints",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.1.2], conditions: {ready: true}}
- {addresses: [10.244.1.3]}
- {addresses: [10.244.1.4], conditions: {}}
- {addresses: [10.244.1.5], conditions: {ready: false}}
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web:http -> 10.244.1.2:8080, 10.244.1.3:8080, 10.244.1.4:8080"],
                warnings: &[],
            },
            Case {
                name: "unnamed port, protocol absent means TCP on both sides",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080, protocol: TCP}]
endpoints: [{addresses: [10.244.1.2]}]
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP shop/web -> 10.244.1.2:8080"],
                warnings: &[],
            },
            Case {
                name: "multi-port TCP and UDP, each resolved by name and protocol",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: dns, namespace: kube-system}
spec:
  clusterIP: 10.96.0.53
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
  - {name: metrics, port: 9153, protocol: TCP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: dns-1, namespace: kube-system, labels: {kubernetes.io/service-name: dns}}
addressType: IPv4
ports:
- {name: dns, port: 5353, protocol: UDP}
- {name: dns-tcp, port: 5354, protocol: TCP}
- {name: metrics, port: 9153, protocol: TCP}
endpoints: [{addresses: [10.244.1.2]}, {addresses: [10.244.2.2]}]
"#,
                frontends: &[
                    "10.96.0.53:53/TCP ClusterIP kube-system/dns:dns-tcp -> 10.244.1.2:5354, 10.244.2.2:5354",
                    "10.96.0.53:53/UDP ClusterIP kube-system/dns:dns -> 10.244.1.2:5353, 10.244.2.2:5353",
                    "10.96.0.53:9153/TCP ClusterIP kube-system/dns:metrics -> 10.244.1.2:9153, 10.244.2.2:9153",
                ],
                warnings: &[],
            },
            Case {
                name: "a slice port of the right name but the wrong protocol does not match",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: dns}
spec:
  clusterIP: 10.96.0.53
  ports: [{name: dns, port: 53, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: dns-1, labels: {kubernetes.io/service-name: dns}}
addressType: IPv4
ports: [{name: dns, port: 53, protocol: UDP}]
endpoints: [{addresses: [10.244.1.2]}]
"#,
                frontends: &["10.96.0.53:53/TCP ClusterIP default/dns:dns -> (none)"],
                warnings: &[],
            },
            Case {
                name: "clusterIPs (dual-stack) wins over clusterIP; a frontend per family",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.99
  clusterIPs: ["fd00::10", 10.96.0.10]
  ports: [{port: 80}]
"#,
                frontends: &[
                    "10.96.0.10:80/TCP ClusterIP default/web -> (none)",
                    "[fd00::10]:80/TCP ClusterIP default/web -> (none)",
                ],
                warnings: &[],
            },
            Case {
                name: "IPv6-only Service (no ipFamilies): an IPv6 frontend, no warning",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web6}
spec:
  clusterIP: "fd00::10"
  ports: [{port: 80}]
"#,
                frontends: &["[fd00::10]:80/TCP ClusterIP default/web6 -> (none)"],
                warnings: &[],
            },
            Case {
                name: "headless (clusterIP None) and ExternalName Services are skipped silently",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: db}
spec:
  clusterIP: None
  ports: [{port: 5432}]
---
apiVersion: v1
kind: Service
metadata: {name: db6}
spec:
  clusterIPs: [None]
  ports: [{port: 5432}]
---
apiVersion: v1
kind: Service
metadata: {name: ext}
spec:
  type: ExternalName
  externalName: example.com
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: db-1, labels: {kubernetes.io/service-name: db}}
addressType: IPv4
ports: [{port: 5432}]
endpoints: [{addresses: [10.244.1.2]}]
"#,
                frontends: &[],
                warnings: &[],
            },
            Case {
                name: "SCTP port is reported, the other ports still work",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: sig}
spec:
  clusterIP: 10.96.0.20
  ports:
  - {name: sctp, port: 3868, protocol: SCTP}
  - {name: tcp, port: 3868, protocol: TCP}
"#,
                frontends: &["10.96.0.20:3868/TCP ClusterIP default/sig:tcp -> (none)"],
                warnings: &["Service default/sig: port \"sctp\": SCTP is not supported"],
            },
            Case {
                name: "a port with no ready endpoints still gets a frontend with no backends",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.1.2], conditions: {ready: false}}]
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> (none)"],
                warnings: &[],
            },
            Case {
                name: "a Service without any EndpointSlice gets a frontend with no backends",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: lonely}
spec:
  clusterIP: 10.96.0.11
  ports: [{port: 80}]
"#,
                frontends: &["10.96.0.11:80/TCP ClusterIP default/lonely -> (none)"],
                warnings: &[],
            },
            Case {
                name: "all slices of the Service are joined; duplicates across slices count once",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.244.1.2]}, {addresses: [10.244.1.3]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-2, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.244.1.3]}, {addresses: [10.244.2.9]}]
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web:http -> 10.244.1.2:8080, 10.244.1.3:8080, 10.244.2.9:8080"],
                warnings: &[],
            },
            Case {
                name: "a duplicate that is ready in one slice and not in another counts as ready",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.1.2], conditions: {ready: false}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-2, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.1.2], conditions: {ready: true}}]
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080"],
                warnings: &[],
            },
            Case {
                name: "target port resolved per slice: the same port name maps to different numbers",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: http}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-old, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.244.1.2]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-new, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 9090}, {name: admin, port: 9091}]
endpoints: [{addresses: [10.244.1.3]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-other, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: admin, port: 9091}]
endpoints: [{addresses: [10.244.1.4]}]
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web:http -> 10.244.1.2:8080, 10.244.1.3:9090"],
                warnings: &[],
            },
            Case {
                name: "FQDN and IPv6 slices are ignored",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-fqdn, labels: {kubernetes.io/service-name: web}}
addressType: FQDN
ports: [{port: 8080}]
endpoints: [{addresses: [pod.example.com]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-v6, labels: {kubernetes.io/service-name: web}}
addressType: IPv6
ports: [{port: 8080}]
endpoints: [{addresses: ["fd00::2"]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-v4, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.1.2]}]
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080"],
                warnings: &[],
            },
            Case {
                name: "slices join only through the label and in the same namespace",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: a}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: b, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.1.2]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-2, namespace: a}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.1.3]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-3, namespace: a, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.1.4]}]
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP a/web -> 10.244.1.4:8080"],
                warnings: &[],
            },
            Case {
                name: "an endpoint address that is not IPv4 is reported and skipped, the rest works",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.1.2]}, {addresses: [10.244.1.300]}, {addresses: [10.244.1.3]}]
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.1.3:8080"],
                warnings: &["EndpointSlice default/web-1: endpoint address \"10.244.1.300\" is not an IPv4 address; skipped"],
            },
            Case {
                name: "an endpoint with several addresses uses the first, as kube-proxy does",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.1.2, 10.244.1.3]}]
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080"],
                warnings: &["EndpointSlice default/web-1: endpoint 10.244.1.2 lists 2 addresses; only the first is used (as kube-proxy does)"],
            },
            Case {
                name: "a matching slice port without a number is reported; the other slices still count",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http}]
endpoints: [{addresses: [10.244.1.2]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-2, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.244.1.3]}]
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web:http -> 10.244.1.3:8080"],
                warnings: &["EndpointSlice default/web-1: port \"http\"/TCP has no port number; its endpoints are not used for it"],
            },
            Case {
                name: "Services (and slices) labelled for another proxy or as headless are skipped",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: other, labels: {service.kubernetes.io/service-proxy-name: cilium}}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: hl, labels: {service.kubernetes.io/headless: ""}}
spec:
  clusterIP: 10.96.0.11
  ports: [{port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: mine}
spec:
  clusterIP: 10.96.0.12
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: mine-1
  labels: {kubernetes.io/service-name: mine, service.kubernetes.io/headless: ""}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.1.2]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: mine-2, labels: {kubernetes.io/service-name: mine}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.1.3]}]
"#,
                frontends: &["10.96.0.12:80/TCP ClusterIP default/mine -> 10.244.1.3:8080"],
                warnings: &[],
            },
            Case {
                name: "issue 11: a Service with an object-level error is reported by field and not programmed (first seen invalid: nothing to keep); the others are unaffected",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: bad}
spec:
  clusterIP: 10.96.0.300
  ports: [{port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: badport}
spec:
  clusterIP: 10.96.0.13
  ports: [{name: zero, port: 0}, {name: big, port: 70000}, {name: ok, port: 81}]
---
apiVersion: v1
kind: Service
metadata: {name: good}
spec:
  clusterIP: 10.96.0.12
  ports: [{port: 80}]
"#,
                frontends: &[
                    "10.96.0.12:80/TCP ClusterIP default/good -> (none)",
                ],
                warnings: &[
                    "Service default/bad: spec.clusterIP: \"10.96.0.300\" is not an IP address; not programmed (no earlier valid version)",
                    "Service default/badport: spec.ports[0].port: 0 is not a valid port; not programmed (no earlier valid version)",
                    "Service default/badport: spec.ports[1].port: 70000 is not a valid port; not programmed (no earlier valid version)",
                ],
            },
            Case {
                name: "a Service without a clusterIP is reported (no allocator in a manifest directory)",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: noip}
spec:
  ports: [{port: 80}]
"#,
                frontends: &[],
                warnings: &["Service default/noip: spec.clusterIP: missing (a manifest directory has no IP allocator: set spec.clusterIP); not programmed (no earlier valid version)"],
            },
            Case {
                name: "two Services claiming one frontend, neither with a creation time: the first by namespace/name keeps it",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: zeta}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}, {name: other, port: 81}]
---
apiVersion: v1
kind: Service
metadata: {name: alpha}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
"#,
                frontends: &[
                    "10.96.0.10:80/TCP ClusterIP default/alpha -> (none)",
                    "10.96.0.10:81/TCP ClusterIP default/zeta:other -> (none)",
                ],
                warnings: &["Service default/zeta: ClusterIP frontend 10.96.0.10:80/TCP is already used by the older Service default/alpha (ClusterIP); not programmed"],
            },
            Case {
                name: "issue 11: the older Service (creationTimestamp) keeps a contested address whatever the names; the newcomer is named",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: alpha, creationTimestamp: "2026-12-03T08:00:00Z"}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: zeta, creationTimestamp: "2026-01-01T00:00:00Z"}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: beta}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
"#,
                frontends: &[
                    "10.96.0.10:80/TCP ClusterIP default/zeta -> (none)",
                ],
                warnings: &[
                    "Service default/alpha: ClusterIP frontend 10.96.0.10:80/TCP is already used by the older Service default/zeta (ClusterIP); not programmed",
                    "Service default/beta: ClusterIP frontend 10.96.0.10:80/TCP is already used by the older Service default/zeta (ClusterIP); not programmed",
                ],
            },
        ]);
}

/// Issue 3: Service types other than ClusterIP.
#[test]
fn service_type_rules() {
    run(&[
            Case {
                name: "NodePort: ClusterIP plus the node port on each node address",
                node: NodeSel::A,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  ports: [{port: 80, nodePort: 30080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.1.2]}]
"#,
                frontends: &[
                    "10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080",
                    "192.168.1.10:30080/TCP NodePort default/web -> 10.244.1.2:8080",
                    "203.0.113.10:30080/TCP NodePort default/web -> 10.244.1.2:8080",
                ],
                warnings: &[],
            },
            Case {
                name: "NodePort Service port without a nodePort (hand-written manifest) is reported",
                node: NodeSel::A,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80}]
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web:http -> (none)"],
                warnings: &["Service default/web: port \"http\": type NodePort without a nodePort; only the other frontends are programmed (set spec.ports[].nodePort)"],
            },
            Case {
                name: "NodePort without node addresses is reported, the ClusterIP still works",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  ports: [{port: 80, nodePort: 30080}]
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> (none)"],
                warnings: &["Service default/web: nodePort 30080/TCP not programmed: this node's addresses are unknown"],
            },
            Case {
                name: "LoadBalancer: ingress IPs (hostname-only and ipMode Proxy skipped) and node ports; an IPv6 ingress IP of an IPv4-only Service is ignored and named",
                node: NodeSel::A,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: lb}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.10
  loadBalancerIP: 198.51.100.99
  ports: [{port: 443, nodePort: 30443}]
status:
  loadBalancer:
    ingress:
    - {ip: 198.51.100.7}
    - {ip: 198.51.100.8, ipMode: VIP}
    - {ip: 198.51.100.9, ipMode: Proxy}
    - {ip: "2001:db8::7"}
    - {hostname: lb.example.com}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: lb-1, labels: {kubernetes.io/service-name: lb}}
addressType: IPv4
ports: [{port: 8443}]
endpoints: [{addresses: [10.244.1.2]}]
"#,
                frontends: &[
                    "10.96.0.10:443/TCP ClusterIP default/lb -> 10.244.1.2:8443",
                    "192.168.1.10:30443/TCP NodePort default/lb -> 10.244.1.2:8443",
                    "198.51.100.7:443/TCP LoadBalancer default/lb -> 10.244.1.2:8443",
                    "198.51.100.8:443/TCP LoadBalancer default/lb -> 10.244.1.2:8443",
                    "203.0.113.10:30443/TCP NodePort default/lb -> 10.244.1.2:8443",
                ],
                warnings: &[
                    "Service default/lb: status.loadBalancer.ingress ip 2001:db8::7 is IPv6 but the Service has no IPv6 cluster IP (ipFamilies); ignored, as kube-proxy does",
                ],
            },
            Case {
                name: "LoadBalancer without node ports (allocateLoadBalancerNodePorts: false) and not yet provisioned",
                node: NodeSel::A,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: lb}
spec:
  type: LoadBalancer
  allocateLoadBalancerNodePorts: false
  clusterIP: 10.96.0.10
  ports: [{port: 443}]
"#,
                frontends: &["10.96.0.10:443/TCP ClusterIP default/lb -> (none)"],
                warnings: &[],
            },
            Case {
                name: "loadBalancerSourceRanges restrict the LoadBalancer frontend only, host bits cleared, sorted",
                node: NodeSel::A,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: lb}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.10
  externalIPs: [198.51.100.9]
  loadBalancerSourceRanges: [" 10.1.2.3/8", 172.16.0.0/12, 10.0.0.0/8, 192.0.2.1/32]
  ports: [{port: 443, nodePort: 30443}]
status: {loadBalancer: {ingress: [{ip: 198.51.100.7}]}}
"#,
                frontends: &[
                    "10.96.0.10:443/TCP ClusterIP default/lb -> (none)",
                    "192.168.1.10:30443/TCP NodePort default/lb -> (none)",
                    "198.51.100.7:443/TCP LoadBalancer default/lb -> (none) [from 10.0.0.0/8 172.16.0.0/12 192.0.2.1/32]",
                    "198.51.100.9:443/TCP ExternalIP default/lb -> (none)",
                    "203.0.113.10:30443/TCP NodePort default/lb -> (none)",
                ],
                warnings: &[],
            },
            Case {
                name: "loadBalancerSourceRanges: a block holding a node address allows the node and the load-balancer IPs",
                node: NodeSel::A,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: lb}
spec:
  type: LoadBalancer
  allocateLoadBalancerNodePorts: false
  clusterIP: 10.96.0.10
  loadBalancerSourceRanges: [192.168.1.0/24]
  ports: [{port: 443}]
status: {loadBalancer: {ingress: [{ip: 198.51.100.7}, {ip: 198.51.100.8}]}}
"#,
                frontends: &[
                    "10.96.0.10:443/TCP ClusterIP default/lb -> (none)",
                    "198.51.100.7:443/TCP LoadBalancer default/lb -> (none) [from 192.168.1.0/24 198.51.100.7/32 198.51.100.8/32 (node allowed)]",
                    "198.51.100.8:443/TCP LoadBalancer default/lb -> (none) [from 192.168.1.0/24 198.51.100.7/32 198.51.100.8/32 (node allowed)]",
                ],
                warnings: &[],
            },
            Case {
                name: "loadBalancerSourceRanges: an invalid block is named and never opens the Service; /0 allows all",
                node: NodeSel::A,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: lb}
spec:
  type: LoadBalancer
  allocateLoadBalancerNodePorts: false
  clusterIP: 10.96.0.10
  loadBalancerSourceRanges: [10.0.0.0/33, banana]
  ports: [{port: 443}]
status: {loadBalancer: {ingress: [{ip: 198.51.100.7}]}}
---
apiVersion: v1
kind: Service
metadata: {name: open}
spec:
  type: LoadBalancer
  allocateLoadBalancerNodePorts: false
  clusterIP: 10.96.0.11
  loadBalancerSourceRanges: [0.0.0.0/0]
  ports: [{port: 443}]
status: {loadBalancer: {ingress: [{ip: 198.51.100.8}]}}
"#,
                frontends: &[
                    "10.96.0.10:443/TCP ClusterIP default/lb -> (none)",
                    "10.96.0.11:443/TCP ClusterIP default/open -> (none)",
                    "198.51.100.7:443/TCP LoadBalancer default/lb -> (none) [from no source]",
                    "198.51.100.8:443/TCP LoadBalancer default/open -> (none) [from 0.0.0.0/0 (node allowed)]",
                ],
                warnings: &[
                    "Service default/lb: loadBalancerSourceRanges holds no valid IPv4 block: the IPv4 load-balancer IPs answer no client (kube-proxy would leave them open to every source)",
                    "Service default/lb: loadBalancerSourceRanges: \"10.0.0.0/33\": the prefix length must be 0..=32 (IPv4) or 0..=128 (IPv6); left out (the other blocks still restrict the Service)",
                    "Service default/lb: loadBalancerSourceRanges: \"banana\" is not a CIDR (a.b.c.d/len or x:y::z/len); left out (the other blocks still restrict the Service)",
                ],
            },
            Case {
                name: "loadBalancerSourceRanges by family on a dual-stack Service; a family without blocks answers no one",
                node: NodeSel::DualStack,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: lb}
spec:
  type: LoadBalancer
  allocateLoadBalancerNodePorts: false
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIPs: [10.96.0.10, "fd00:96::10"]
  loadBalancerSourceRanges: [10.0.0.0/8, "2001:db8::/32"]
  ports: [{port: 443}]
status: {loadBalancer: {ingress: [{ip: 198.51.100.7}, {ip: "2001:db8:ff::7"}]}}
---
apiVersion: v1
kind: Service
metadata: {name: v4only}
spec:
  type: LoadBalancer
  allocateLoadBalancerNodePorts: false
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIPs: [10.96.0.11, "fd00:96::11"]
  loadBalancerSourceRanges: [10.0.0.0/8]
  ports: [{port: 443}]
status: {loadBalancer: {ingress: [{ip: 198.51.100.8}, {ip: "2001:db8:ff::8"}]}}
---
apiVersion: v1
kind: Service
metadata: {name: single}
spec:
  type: LoadBalancer
  allocateLoadBalancerNodePorts: false
  clusterIP: 10.96.0.12
  loadBalancerSourceRanges: [10.0.0.0/8, "2001:db8::/32"]
  ports: [{port: 443}]
status: {loadBalancer: {ingress: [{ip: 198.51.100.9}]}}
"#,
                frontends: &[
                    "10.96.0.10:443/TCP ClusterIP default/lb -> (none)",
                    "10.96.0.11:443/TCP ClusterIP default/v4only -> (none)",
                    "10.96.0.12:443/TCP ClusterIP default/single -> (none)",
                    "198.51.100.7:443/TCP LoadBalancer default/lb -> (none) [from 10.0.0.0/8]",
                    "198.51.100.8:443/TCP LoadBalancer default/v4only -> (none) [from 10.0.0.0/8]",
                    "198.51.100.9:443/TCP LoadBalancer default/single -> (none) [from 10.0.0.0/8]",
                    "[2001:db8:ff::7]:443/TCP LoadBalancer default/lb -> (none) [from 2001:db8::/32]",
                    "[2001:db8:ff::8]:443/TCP LoadBalancer default/v4only -> (none) [from no source]",
                    "[fd00:96::10]:443/TCP ClusterIP default/lb -> (none)",
                    "[fd00:96::11]:443/TCP ClusterIP default/v4only -> (none)",
                ],
                warnings: &[
                    "Service default/single: loadBalancerSourceRanges block 2001:db8::/32 is IPv6 but the Service has no IPv6 load-balancer IP; ignored, as kube-proxy does",
                    "Service default/v4only: loadBalancerSourceRanges holds no valid IPv6 block: the IPv6 load-balancer IPs answer no client (kube-proxy would leave them open to every source)",
                ],
            },
            Case {
                name: "ingress status on a non-LoadBalancer Service is ignored",
                node: NodeSel::A,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
status: {loadBalancer: {ingress: [{ip: 198.51.100.7}]}}
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> (none)"],
                warnings: &[],
            },
            Case {
                name: "externalIPs on any type, every port; an IPv6 one on an IPv4-only Service is ignored and named",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  externalIPs: [198.51.100.20, "2001:db8::20"]
  ports: [{name: http, port: 80}, {name: dns, port: 53, protocol: UDP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}, {name: dns, port: 5353, protocol: UDP}]
endpoints: [{addresses: [10.244.1.2]}]
"#,
                frontends: &[
                    "10.96.0.10:53/UDP ClusterIP default/web:dns -> 10.244.1.2:5353",
                    "10.96.0.10:80/TCP ClusterIP default/web:http -> 10.244.1.2:8080",
                    "198.51.100.20:53/UDP ExternalIP default/web:dns -> 10.244.1.2:5353",
                    "198.51.100.20:80/TCP ExternalIP default/web:http -> 10.244.1.2:8080",
                ],
                warnings: &[
                    "Service default/web: externalIP 2001:db8::20 is IPv6 but the Service has no IPv6 cluster IP (ipFamilies); ignored, as kube-proxy does",
                ],
            },
            Case {
                name: "issue 11: an externalIP that is not an address makes the version unusable (an object-level error), by field",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  externalIPs: [198.51.100.20, not-an-ip]
  ports: [{port: 80}]
"#,
                frontends: &[],
                warnings: &["Service default/web: spec.externalIPs[1]: \"not-an-ip\" is not an IP address; not programmed (no earlier valid version)"],
            },
            Case {
                name: "unknown Service type is reported and skipped",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: odd}
spec:
  type: Magic
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
"#,
                frontends: &[],
                warnings: &["Service default/odd: spec.type: \"Magic\" is not ClusterIP, NodePort, LoadBalancer or ExternalName; not programmed (no earlier valid version)"],
            },
        ]);
}

/// Issue 3: endpoint conditions.
#[test]
fn condition_rules() {
    run(&[
            Case {
                name: "no ready endpoint: fall back to serving+terminating ones",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- {addresses: [10.244.1.2], conditions: {ready: false, serving: true, terminating: true}}
- {addresses: [10.244.1.3], conditions: {ready: false, serving: false, terminating: true}}
- {addresses: [10.244.1.4], conditions: {ready: false, serving: true, terminating: false}}
- {addresses: [10.244.1.5], conditions: {ready: false, terminating: true}}
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.1.5:8080 [terminating fallback]"],
                warnings: &[],
            },
            Case {
                name: "one ready endpoint: terminating ones are not used",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- {addresses: [10.244.1.2], conditions: {ready: false, serving: true, terminating: true}}
- {addresses: [10.244.1.3], conditions: {ready: true, serving: true, terminating: false}}
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.3:8080"],
                warnings: &[],
            },
            Case {
                name: "publishNotReadyAddresses is not read (kube-proxy leaves it to the EndpointSlice controller): a not-ready endpoint stays out",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: peers}
spec:
  clusterIP: 10.96.0.10
  publishNotReadyAddresses: true
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: peers-1, labels: {kubernetes.io/service-name: peers}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- {addresses: [10.244.1.2], conditions: {ready: false}}
- {addresses: [10.244.1.3], conditions: {ready: true}}
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/peers -> 10.244.1.3:8080"],
                warnings: &[],
            },
        ]);
}

/// Issue 3: the service-proxy-name label with a name of our own.
#[test]
fn proxy_name_rules() {
    let yaml = r#"
apiVersion: v1
kind: Service
metadata: {name: ours, labels: {service.kubernetes.io/service-proxy-name: switchboard}}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: theirs, labels: {service.kubernetes.io/service-proxy-name: cilium}}
spec:
  clusterIP: 10.96.0.11
  ports: [{port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: plain}
spec:
  clusterIP: 10.96.0.12
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: ours-1
  labels: {kubernetes.io/service-name: ours, service.kubernetes.io/service-proxy-name: switchboard}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.1.2]}]
"#;
    run(&[
        Case {
            name: "with our name: labelled for us and unlabelled are ours",
            node: NodeSel::Unknown,
            proxy_name: Some("switchboard"),
            yaml,
            frontends: &[
                "10.96.0.10:80/TCP ClusterIP default/ours -> 10.244.1.2:8080",
                "10.96.0.12:80/TCP ClusterIP default/plain -> (none)",
            ],
            warnings: &[],
        },
        Case {
            name: "without a name (kube-proxy): any label means another proxy",
            node: NodeSel::Unknown,
            proxy_name: None,
            yaml,
            frontends: &["10.96.0.12:80/TCP ClusterIP default/plain -> (none)"],
            warnings: &[],
        },
    ]);
}

const POLICY_SLICE: &str = r#"
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- {addresses: [10.244.1.2], nodeName: node-a}
- {addresses: [10.244.2.2], nodeName: node-b}
- {addresses: [10.244.1.3], nodeName: node-a, conditions: {ready: false}}
"#;

fn with_slice(service: &str) -> &'static str {
    Box::leak(format!("{service}{POLICY_SLICE}").into_boxed_str())
}

/// Issue 3: traffic policies.
#[test]
fn traffic_policy_rules() {
    run(&[
            Case {
                name: "externalTrafficPolicy Local: outside traffic to external frontends gets local endpoints, node traffic (pods, host) all; ClusterIP all; health check port recorded",
                node: NodeSel::A,
                proxy_name: None,
                yaml: with_slice(
                    r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.10
  externalTrafficPolicy: Local
  healthCheckNodePort: 32000
  ports: [{port: 80, nodePort: 30080}]
status: {loadBalancer: {ingress: [{ip: 198.51.100.7}]}}
"#,
                ),
                frontends: &[
                    "10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.2.2:8080 [healthCheckNodePort 32000]",
                    "192.168.1.10:30080/TCP NodePort default/web -> 10.244.1.2:8080, 10.244.2.2:8080; from outside -> 10.244.1.2:8080 [local-only, healthCheckNodePort 32000]",
                    "198.51.100.7:80/TCP LoadBalancer default/web -> 10.244.1.2:8080, 10.244.2.2:8080; from outside -> 10.244.1.2:8080 [local-only, healthCheckNodePort 32000]",
                    "203.0.113.10:30080/TCP NodePort default/web -> 10.244.1.2:8080, 10.244.2.2:8080; from outside -> 10.244.1.2:8080 [local-only, healthCheckNodePort 32000]",
                ],
                warnings: &[],
            },
            Case {
                name: "internalTrafficPolicy Local: ClusterIP uses local endpoints, external frontends all",
                node: NodeSel::A,
                proxy_name: None,
                yaml: with_slice(
                    r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  internalTrafficPolicy: Local
  externalIPs: [198.51.100.20]
  ports: [{port: 80}]
"#,
                ),
                frontends: &[
                    "10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080 [local-only]",
                    "198.51.100.20:80/TCP ExternalIP default/web -> 10.244.1.2:8080, 10.244.2.2:8080",
                ],
                warnings: &[],
            },
            Case {
                name: "externalTrafficPolicy Local on a ClusterIP Service with externalIPs governs the external IPs",
                node: NodeSel::A,
                proxy_name: None,
                yaml: with_slice(
                    r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  externalTrafficPolicy: Local
  externalIPs: [198.51.100.20]
  ports: [{port: 80}]
"#,
                ),
                frontends: &[
                    "10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.2.2:8080",
                    "198.51.100.20:80/TCP ExternalIP default/web -> 10.244.1.2:8080, 10.244.2.2:8080; from outside -> 10.244.1.2:8080 [local-only]",
                ],
                warnings: &[],
            },
            Case {
                name: "both policies Local: ClusterIP local-only, external frontends still cluster-wide for node traffic (kube-proxy keeps cluster endpoints for the short-circuit)",
                node: NodeSel::A,
                proxy_name: None,
                yaml: with_slice(
                    r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  internalTrafficPolicy: Local
  externalTrafficPolicy: Local
  ports: [{port: 80, nodePort: 30080}]
"#,
                ),
                frontends: &[
                    "10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080 [local-only]",
                    "192.168.1.10:30080/TCP NodePort default/web -> 10.244.1.2:8080, 10.244.2.2:8080; from outside -> 10.244.1.2:8080 [local-only]",
                    "203.0.113.10:30080/TCP NodePort default/web -> 10.244.1.2:8080, 10.244.2.2:8080; from outside -> 10.244.1.2:8080 [local-only]",
                ],
                warnings: &[],
            },
            Case {
                name: "externalTrafficPolicy Local with no local endpoint: node traffic still reaches the cluster, outside traffic none",
                node: NodeSel::A,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  externalTrafficPolicy: Local
  externalIPs: [198.51.100.20]
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.2.2], nodeName: node-b}]
"#,
                frontends: &[
                    "10.96.0.10:80/TCP ClusterIP default/web -> 10.244.2.2:8080",
                    "198.51.100.20:80/TCP ExternalIP default/web -> 10.244.2.2:8080; from outside -> (none) [local-only]",
                ],
                warnings: &[],
            },
            Case {
                name: "externalTrafficPolicy Local on a plain ClusterIP Service has no effect",
                node: NodeSel::A,
                proxy_name: None,
                yaml: with_slice(
                    r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  externalTrafficPolicy: Local
  ports: [{port: 80}]
"#,
                ),
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.2.2:8080"],
                warnings: &[],
            },
            Case {
                name: "Local with no local endpoint: no backends (traffic dropped, as kube-proxy does)",
                node: NodeSel::A,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  internalTrafficPolicy: Local
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.2.2], nodeName: node-b}, {addresses: [10.244.2.3]}]
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> (none) [local-only]"],
                warnings: &[],
            },
            Case {
                name: "Local: no local ready endpoint, fall back to local serving+terminating ones",
                node: NodeSel::A,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  internalTrafficPolicy: Local
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- {addresses: [10.244.1.2], nodeName: node-a, conditions: {ready: false, serving: true, terminating: true}}
- {addresses: [10.244.2.2], nodeName: node-b, conditions: {ready: true}}
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080 [local-only, terminating fallback]"],
                warnings: &[],
            },
            Case {
                name: "externalTrafficPolicy Local: no local ready endpoint, outside traffic falls back to local serving+terminating ones",
                node: NodeSel::A,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.10
  externalTrafficPolicy: Local
  healthCheckNodePort: 32000
  ports: [{port: 80, nodePort: 30080}]
status: {loadBalancer: {ingress: [{ip: 198.51.100.7}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- {addresses: [10.244.1.2], nodeName: node-a, conditions: {ready: false, serving: true, terminating: true}}
- {addresses: [10.244.2.2], nodeName: node-b, conditions: {ready: true}}
"#,
                frontends: &[
                    "10.96.0.10:80/TCP ClusterIP default/web -> 10.244.2.2:8080 [healthCheckNodePort 32000]",
                    "192.168.1.10:30080/TCP NodePort default/web -> 10.244.2.2:8080; from outside -> 10.244.1.2:8080 [local-only, healthCheckNodePort 32000, terminating fallback from outside]",
                    "198.51.100.7:80/TCP LoadBalancer default/web -> 10.244.2.2:8080; from outside -> 10.244.1.2:8080 [local-only, healthCheckNodePort 32000, terminating fallback from outside]",
                    "203.0.113.10:30080/TCP NodePort default/web -> 10.244.2.2:8080; from outside -> 10.244.1.2:8080 [local-only, healthCheckNodePort 32000, terminating fallback from outside]",
                ],
                warnings: &[],
            },
            Case {
                name: "Local policies without node knowledge are reported and treated as Cluster",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: with_slice(
                    r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  internalTrafficPolicy: Local
  ports: [{port: 80}]
"#,
                ),
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.2.2:8080"],
                warnings: &["Service default/web: internalTrafficPolicy is Local but this node is unknown (no node name); treated as Cluster"],
            },
            Case {
                name: "externalTrafficPolicy Local without node knowledge is reported; outside traffic gets all endpoints",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: with_slice(
                    r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  externalTrafficPolicy: Local
  externalIPs: [198.51.100.20]
  ports: [{port: 80}]
"#,
                ),
                frontends: &[
                    "10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.2.2:8080",
                    "198.51.100.20:80/TCP ExternalIP default/web -> 10.244.1.2:8080, 10.244.2.2:8080",
                ],
                warnings: &["Service default/web: externalTrafficPolicy is Local but this node is unknown (no node name); treated as Cluster"],
            },
        ]);
}

/// Issue 3: topology hints.
#[test]
fn topology_rules() {
    run(&[
            Case {
                name: "zone hints on every endpoint, one for our zone: only those",
                node: NodeSel::A,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- {addresses: [10.244.1.2], zone: zone-a, hints: {forZones: [{name: zone-a}]}}
- {addresses: [10.244.2.2], zone: zone-b, hints: {forZones: [{name: zone-b}]}}
- {addresses: [10.244.3.2], zone: zone-c, hints: {forZones: [{name: zone-c}, {name: zone-a}]}}
- {addresses: [10.244.4.2], conditions: {ready: false}}
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.3.2:8080 [topology same-zone]"],
                warnings: &[],
            },
            Case {
                name: "one ready endpoint without hints: hints are not used",
                node: NodeSel::A,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- {addresses: [10.244.1.2], hints: {forZones: [{name: zone-a}]}}
- {addresses: [10.244.2.2]}
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.2.2:8080"],
                warnings: &[],
            },
            Case {
                name: "no hint for our zone: hints are not used",
                node: NodeSel::A,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- {addresses: [10.244.1.2], hints: {forZones: [{name: zone-b}]}}
- {addresses: [10.244.2.2], hints: {forZones: [{name: zone-c}]}}
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.2.2:8080"],
                warnings: &[],
            },
            Case {
                name: "node without a zone label: zone hints are not used",
                node: NodeSel::ANoZone,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- {addresses: [10.244.1.2], hints: {forZones: [{name: zone-a}]}}
- {addresses: [10.244.2.2], hints: {forZones: [{name: zone-b}]}}
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.2.2:8080"],
                warnings: &[],
            },
            Case {
                name: "unknown node: hints are not used",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- {addresses: [10.244.1.2], hints: {forZones: [{name: zone-a}]}}
- {addresses: [10.244.2.2], hints: {forZones: [{name: zone-b}]}}
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.2.2:8080"],
                warnings: &[],
            },
            Case {
                name: "node hints on every endpoint, one for this node: same-node wins over zone hints",
                node: NodeSel::A,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  trafficDistribution: PreferSameNode
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- {addresses: [10.244.1.2], nodeName: node-a, hints: {forNodes: [{name: node-a}], forZones: [{name: zone-a}]}}
- {addresses: [10.244.1.9], nodeName: node-x, hints: {forNodes: [{name: node-x}], forZones: [{name: zone-a}]}}
- {addresses: [10.244.2.2], nodeName: node-b, hints: {forNodes: [{name: node-b}], forZones: [{name: zone-b}]}}
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080 [topology same-node]"],
                warnings: &[],
            },
            Case {
                name: "hints do not apply to Local policy frontends",
                node: NodeSel::A,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  internalTrafficPolicy: Local
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- {addresses: [10.244.1.2], nodeName: node-a, hints: {forZones: [{name: zone-b}]}}
- {addresses: [10.244.1.3], nodeName: node-a, hints: {forZones: [{name: zone-a}]}}
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.1.3:8080 [local-only]"],
                warnings: &[],
            },
        ]);
}

/// Issue 3: session affinity.
#[test]
fn session_affinity_rules() {
    run(&[
            Case {
                name: "ClientIP with the default timeout, on every frontend of the Service",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  externalIPs: [198.51.100.20]
  sessionAffinity: ClientIP
  ports: [{port: 80}]
"#,
                frontends: &[
                    "10.96.0.10:80/TCP ClusterIP default/web -> (none) [affinity 10800s]",
                    "198.51.100.20:80/TCP ExternalIP default/web -> (none) [affinity 10800s]",
                ],
                warnings: &[],
            },
            Case {
                name: "ClientIP with an explicit timeout",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}
  ports: [{port: 80}]
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> (none) [affinity 60s]"],
                warnings: &[],
            },
            Case {
                name: "an out-of-range timeout is reported and replaced by the default; None means no affinity",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 0}}
  ports: [{port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: web2}
spec:
  clusterIP: 10.96.0.11
  sessionAffinity: None
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}
  ports: [{port: 80}]
"#,
                frontends: &[
                    "10.96.0.10:80/TCP ClusterIP default/web -> (none) [affinity 10800s]",
                    "10.96.0.11:80/TCP ClusterIP default/web2 -> (none)",
                ],
                warnings: &["Service default/web: sessionAffinityConfig.clientIP.timeoutSeconds 0 is out of range 1..=86400; using 10800"],
            },
        ]);
}

/// Random sequences of Service, EndpointSlice and Node changes (valid and
/// invalid, and invalid edits of the valid objects in place), drawn from
/// small pools so that addresses collide, slices move between Services and
/// Services come and go. After every step the incremental model must equal a
/// model built from scratch over the last usable version of each object (a
/// reference that applies the last-good rule plainly), with the rejected
/// versions' warnings added, and its delta must name exactly the addresses
/// that changed.
mod properties {
    use super::*;
    use proptest::prelude::*;

    const SERVICES: usize = 5;
    const SLICES: usize = 6;

    #[derive(Clone, Debug)]
    // A test value, moved a few hundred times per case: boxing would only
    // add noise to every constructor.
    #[allow(clippy::large_enum_variant)]
    enum Change {
        Service(usize, Option<ServiceInfo>),
        Slice(usize, Option<SliceInfo>),
        Node(Option<NodeInfo>),
        /// An invalid edit of the Service's usable version (if any): its
        /// first port becomes 70000 (`true`) or its cluster IP is deleted.
        BreakService(usize, bool),
        /// An invalid edit of the slice's usable version (if any): its
        /// addressType is deleted (`true`) or its first port becomes 0.
        BreakSlice(usize, bool),
    }

    /// The reference: the last usable version of each object, and the
    /// warnings of the objects whose newest version is not usable.
    #[derive(Default)]
    struct Reference {
        services: BTreeMap<ObjectKey, ServiceInfo>,
        slices: BTreeMap<ObjectKey, SliceInfo>,
        rejected: BTreeMap<(&'static str, ObjectKey), Vec<ModelWarning>>,
        node: Option<NodeInfo>,
    }

    fn service_key(i: usize) -> ObjectKey {
        ObjectKey::new(
            if i % 3 == 2 { "other" } else { "default" },
            format!("s{i}"),
        )
    }

    fn ip_field() -> impl Strategy<Value = String> {
        prop_oneof![
            10 => Just("10.96.0.0".to_string()),
            3 => Just("10.96.0.1".to_string()),
            1 => Just("None".to_string()),
            1 => Just(String::new()),
            1 => Just("fd00::1".to_string()),
            1 => Just("not-an-ip".to_string()),
        ]
    }

    fn port() -> impl Strategy<Value = ServicePortInfo> {
        (
            prop_oneof![Just(String::new()), Just("http".to_string()), Just("dns".to_string())],
            prop_oneof![8 => Just(None), 1 => Just(Some("UDP".to_string())), 1 => Just(Some("ICMP".to_string()))],
            prop_oneof![10 => Just(80), 1 => Just(53), 1 => Just(0), 1 => Just(70_000)],
            prop::option::of(prop_oneof![Just(30080), Just(30053), Just(0)]),
        )
            .prop_map(|(name, protocol, port, node_port)| ServicePortInfo {
                name: name.into(),
                protocol: protocol.map(Into::into),
                port,
                node_port,
            })
    }

    fn policy() -> impl Strategy<Value = Option<String>> {
        prop_oneof![
            Just(None),
            Just(Some("Local".to_string())),
            Just(Some("Cluster".to_string()))
        ]
    }

    fn service(i: usize) -> impl Strategy<Value = ServiceInfo> {
        let spec = (
            prop_oneof![
                4 => Just(None),
                2 => Just(Some("NodePort".to_string())),
                2 => Just(Some("LoadBalancer".to_string())),
                1 => Just(Some("ExternalName".to_string())),
                1 => Just(Some("Bogus".to_string())),
            ],
            prop::collection::vec(ip_field(), 1..3),
            prop::collection::vec((0u8..2).prop_map(|i| format!("192.0.2.{i}")), 0..2),
            prop::collection::vec(port(), 1..3),
            (policy(), policy()),
            prop::option::of(prop_oneof![Just(10), Just(0)]),
        )
            .prop_map(
                |(type_, cluster_ips, external_ips, ports, (etp, itp), affinity)| ServiceSpecInfo {
                    type_: type_.map(Into::into),
                    cluster_ips: cluster_ips.into(),
                    rare: RareSpec {
                        external_ips: external_ips.into(),
                        lb_ingress: vec![LbIngress {
                            ip: Some("198.51.100.1".into()),
                            ip_mode: None,
                        }]
                        .into(),
                        affinity_timeout_s: affinity,
                        ..RareSpec::default()
                    }
                    .boxed(),
                    session_affinity: affinity.map(|_| "ClientIP".into()),
                    external_traffic_policy: etp.map(Into::into),
                    internal_traffic_policy: itp.map(Into::into),
                    ports: ports.into(),
                    ..ServiceSpecInfo::default()
                },
            );
        (
            prop::option::weighted(0.9, spec),
            prop_oneof![6 => Just(None), 1 => Just(Some("other-proxy".to_string()))],
            prop::option::of(0i64..3),
        )
            .prop_map(move |(spec, proxy_name, created_unix_ms)| ServiceInfo {
                key: service_key(i),
                labels: ProxyLabels {
                    proxy_name: proxy_name.map(Into::into),
                    headless: false,
                },
                created_unix_ms,
                spec,
                ..ServiceInfo::default()
            })
    }

    fn endpoint() -> impl Strategy<Value = EndpointInfo> {
        (
            prop_oneof![
                6 => (1u8..4).prop_map(|i| Some(RawAddress::V4(Ipv4Addr::new(10, 244, 0, i)))),
                1 => Just(Some(RawAddress::Other("bad".into()))),
                1 => Just(None),
            ],
            prop::option::of(any::<bool>()),
            prop::option::of(any::<bool>()),
            prop::option::of(any::<bool>()),
            prop_oneof![
                Just(None),
                Just(Some(Arc::<str>::from("node-a"))),
                Just(Some(Arc::<str>::from("node-b")))
            ],
        )
            .prop_map(
                |(address, ready, serving, terminating, node_name)| EndpointInfo {
                    address_count: u32::from(address.is_some()),
                    address,
                    ready,
                    serving,
                    terminating,
                    node_name,
                    hints: None,
                },
            )
    }

    fn slice(j: usize) -> impl Strategy<Value = SliceInfo> {
        (
            prop::option::of(0..SERVICES),
            prop_oneof![6 => Just("IPv4".to_string()), 1 => Just("IPv6".to_string()), 1 => Just(String::new())],
            prop::collection::vec(endpoint(), 0..4),
            prop::collection::vec(
                (
                    prop_oneof![Just(None), Just(Some("http".to_string())), Just(Some("dns".to_string()))],
                    prop_oneof![Just(None), Just(Some("UDP".to_string()))],
                    prop_oneof![Just(Some(8080)), Just(Some(5353)), Just(None), Just(Some(0))],
                )
                    .prop_map(|(name, protocol, port)| SlicePortInfo {
                        name: name.map(Into::into),
                        protocol: protocol.map(Into::into),
                        port,
                    }),
                0..3,
            ),
        )
            .prop_map(move |(service, address_type, endpoints, ports)| {
                // Slices live in their Service's namespace; a slice of no
                // Service sits in `default`.
                let namespace = service.map_or("default".to_string(), |i| service_key(i).namespace.to_string());
                SliceInfo {
                    key: ObjectKey::new(namespace, format!("e{j}")),
                    service_name: service.map(|i| format!("s{i}").into()),
                    address_type: address_type.into(),
                    endpoints: endpoints.into(),
                    ports: ports.into(),
                    ..SliceInfo::default()
                }
            })
    }

    fn change() -> impl Strategy<Value = Change> {
        prop_oneof![
            4 => (0..SERVICES).prop_flat_map(|i| prop::option::weighted(0.8, service(i)).prop_map(move |s| Change::Service(i, s))),
            4 => (0..SLICES).prop_flat_map(|j| prop::option::weighted(0.8, slice(j)).prop_map(move |s| Change::Slice(j, s))),
            1 => prop::option::of(prop_oneof![Just(NodeSel::A), Just(NodeSel::ANoZone)]).prop_map(|n| Change::Node(n.and_then(node))),
            2 => (0..SERVICES, any::<bool>()).prop_map(|(i, how)| Change::BreakService(i, how)),
            2 => (0..SLICES, any::<bool>()).prop_map(|(j, how)| Change::BreakSlice(j, how)),
        ]
    }

    /// Applies a change to the model and to the reference.
    fn apply(change: &Change, model: &mut Model, r: &mut Reference) {
        match change {
            Change::Service(i, info) => {
                let key = service_key(*i);
                model.set_service(key.clone(), info.clone().map(Arc::new));
                r.rejected.remove(&("Service", key.clone()));
                let Some(info) = info else {
                    r.services.remove(&key);
                    return;
                };
                let problems = if info.labels.selected(None) {
                    validate::service_problems(info)
                } else {
                    Vec::new()
                };
                if problems.is_empty() {
                    r.services.insert(key, info.clone());
                } else {
                    let held = r.services.contains_key(&key);
                    let warnings =
                        validate::rejection_warnings(&format!("Service {key}"), &problems, held);
                    r.rejected.insert(("Service", key), warnings);
                }
            }
            Change::Slice(j, info) => {
                // A slice's key may move namespace with its Service: delete
                // it under every namespace it could have had first.
                for ns in ["default", "other"] {
                    let key = ObjectKey::new(ns, format!("e{j}"));
                    if info.as_ref().is_some_and(|s| s.key == key) {
                        continue;
                    }
                    let had = r.slices.remove(&key).is_some();
                    let rejected = r.rejected.remove(&("EndpointSlice", key.clone())).is_some();
                    if had || rejected {
                        model.set_slice(key, None);
                    }
                }
                let Some(info) = info else { return };
                let key = info.key.clone();
                model.set_slice(key.clone(), Some(Arc::new(info.clone())));
                r.rejected.remove(&("EndpointSlice", key.clone()));
                let problems = if info.labels.selected(None) {
                    validate::slice_problems(info)
                } else {
                    Vec::new()
                };
                if problems.is_empty() {
                    r.slices.insert(key, info.clone());
                } else {
                    let held = r.slices.contains_key(&key);
                    let warnings = validate::rejection_warnings(
                        &format!("EndpointSlice {key}"),
                        &problems,
                        held,
                    );
                    r.rejected.insert(("EndpointSlice", key), warnings);
                }
            }
            Change::Node(new) => {
                model.set_node(new.clone());
                r.node.clone_from(new);
            }
            Change::BreakService(i, how) => {
                let Some(mut svc) = r.services.get(&service_key(*i)).cloned() else {
                    return;
                };
                if let Some(spec) = &mut svc.spec {
                    match (how, spec.ports.first_mut()) {
                        (true, Some(p)) => p.port = 70_000,
                        _ => spec.cluster_ips = Box::new([String::new()]),
                    }
                }
                apply(&Change::Service(*i, Some(svc)), model, r);
            }
            Change::BreakSlice(j, how) => {
                let name = format!("e{j}");
                let Some(mut slice) = r.slices.values().find(|s| *s.key.name == *name).cloned()
                else {
                    return;
                };
                match (how, slice.ports.first_mut()) {
                    (false, Some(p)) => p.port = Some(0),
                    _ => slice.address_type = "".into(),
                }
                apply(&Change::Slice(*j, Some(slice)), model, r);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::test_cases(256)))]
        #[test]
        fn incremental_updates_equal_a_full_rebuild(
            changes in prop::collection::vec(change(), 1..40),
            batch in 1usize..4,
        ) {
            let mut model = Model::new(None, None);
            let mut r = Reference::default();
            use crate::sync::store::MapStore as _;
            let mut syncer = crate::sync::Syncer::adopt(
                crate::sync::memstore::MemStore::default(),
                crate::sync::store::Capacities::default(),
            );
            for (n, chunk) in changes.chunks(batch).enumerate() {
                for change in chunk {
                    apply(change, &mut model, &mut r);
                }
                let before = model.desired().clone();
                let delta = model.update();

                let mut fresh = Model::new(r.node.clone(), None);
                for s in r.services.values() {
                    fresh.set_service(s.key.clone(), Some(Arc::new(s.clone())));
                }
                for s in r.slices.values() {
                    fresh.set_slice(s.key.clone(), Some(Arc::new(s.clone())));
                }
                fresh.update();
                prop_assert_eq!(model.desired(), fresh.desired(), "desired state after step {}", n);
                let got: Vec<_> = model.warnings().cloned().collect();
                let want: Vec<_> = fresh
                    .warnings()
                    .cloned()
                    .chain(r.rejected.values().flatten().cloned())
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect();
                prop_assert_eq!(got, want, "warnings after step {}", n);
                let held: Vec<(ObjectKind, ObjectKey)> = model
                    .rejections()
                    .filter(|(_, _, rej)| rej.held)
                    .map(|(kind, key, _)| (kind, key.clone()))
                    .collect();
                for (kind, key) in &held {
                    let kept = match kind {
                        ObjectKind::Service => r.services.contains_key(key),
                        ObjectKind::EndpointSlice => r.slices.contains_key(key),
                    };
                    prop_assert!(kept, "{:?} {} is held without a usable version", kind, key);
                }

                let changed: BTreeSet<FrontendAddr> = before
                    .frontends
                    .keys()
                    .chain(model.desired().frontends.keys())
                    .filter(|a| before.frontends.get(a) != model.desired().frontends.get(a))
                    .copied()
                    .collect();
                prop_assert_eq!(&delta.frontends, &changed, "delta after step {}", n);

                // The sync engine, given only the delta, leaves the maps
                // holding exactly the model's desired state.
                syncer.apply_changed(model.desired(), &delta.frontends);
                let unprogrammed = syncer
                    .unprogrammed()
                    .map(|u| (u.frontend, u.reason.clone()))
                    .collect();
                let verified = crate::observe::verify::compare(
                    model.desired(),
                    syncer.defaults(),
                    &syncer.store().dump(),
                    &unprogrammed,
                );
                prop_assert!(verified.matches(), "maps after step {}: {:?}", n, verified.problems);
            }
        }
    }
}

#[test]
fn without_creation_times_the_next_claimant_by_name_takes_over_a_released_address() {
    let svc = |name: &str| {
        Arc::new(ServiceInfo {
            key: ObjectKey::new("default", name),
            spec: Some(ServiceSpecInfo {
                cluster_ips: Box::new(["10.96.0.1".into()]),
                ports: Box::new([ServicePortInfo {
                    port: 80,
                    ..ServicePortInfo::default()
                }]),
                ..ServiceSpecInfo::default()
            }),
            ..ServiceInfo::default()
        })
    };
    let mut model = Model::new(None, None);
    for name in ["c", "a", "b"] {
        model.set_service(ObjectKey::new("default", name), Some(svc(name)));
        model.update();
    }
    let owner = |model: &Model| {
        let fe = model
            .desired()
            .frontends
            .values()
            .next()
            .expect("one frontend");
        fe.service.name.to_string()
    };
    assert_eq!(owner(&model), "a");
    let warned: Vec<String> = model.warnings().map(|w| w.object.clone()).collect();
    assert_eq!(warned, ["Service default/b", "Service default/c"]);
    model.set_service(ObjectKey::new("default", "a"), None);
    let delta = model.update();
    assert_eq!(owner(&model), "b");
    assert_eq!(delta.frontends.len(), 1);
    assert_eq!(delta.warnings_removed.len(), 2, "{delta:?}");
    assert_eq!(delta.warnings_added.len(), 1, "{delta:?}");
}

/// One step of an object's history: the YAML of the objects that change
/// (a `Service`/`EndpointSlice` document, or `delete Service ns/name`), and
/// the whole state expected after it.
struct Step {
    apply: &'static str,
    frontends: &'static [&'static str],
    warnings: &'static [&'static str],
}

/// Feeds the steps to one [`Model`] in order, checking the state after each.
fn history(name: &str, steps: &[Step]) {
    let mut model = Model::new(None, None);
    let mut interner = Interner::default();
    for (n, step) in steps.iter().enumerate() {
        if let Some(rest) = step.apply.trim().strip_prefix("delete ") {
            let (kind, key) = rest.split_once(' ').expect("delete KIND ns/name");
            let (ns, obj) = key.split_once('/').expect("ns/name");
            match kind {
                "Service" => model.set_service(ObjectKey::new(ns, obj), None),
                "EndpointSlice" => model.set_slice(ObjectKey::new(ns, obj), None),
                other => panic!("unknown kind {other}"),
            }
        } else {
            let (services, slices) = objects(step.apply);
            for s in &services {
                let info = ServiceInfo::from_k8s(s);
                model.set_service(info.key.clone(), Some(Arc::new(info)));
            }
            for s in &slices {
                let info = SliceInfo::from_k8s(s, &mut interner);
                model.set_slice(info.key.clone(), Some(Arc::new(info)));
            }
        }
        model.update();
        let got: Vec<String> = model
            .desired()
            .frontends
            .values()
            .map(ToString::to_string)
            .collect();
        let got_w: Vec<String> = model.warnings().map(ToString::to_string).collect();
        assert_eq!(got, step.frontends, "{name}: frontends after step {n}");
        assert_eq!(got_w, step.warnings, "{name}: warnings after step {n}");
    }
}

const WEB: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
"#;

const WEB_SLICE: &str = r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.1.2]}, {addresses: [10.244.1.3]}]
"#;

/// Issue 11, defect 1: an edit that cannot be used keeps the last good
/// version (and says so, by field); fixing it applies the fix; deleting the
/// object forgets the last good version; an object invalid from the start is
/// not programmed.
#[test]
fn an_unusable_service_edit_keeps_the_last_good_version() {
    let good: &[&str] =
        &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.1.3:8080"];
    let steps = [
        Step { apply: WEB, frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> (none)"], warnings: &[] },
        Step { apply: WEB_SLICE, frontends: good, warnings: &[] },
        Step {
            apply: "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {clusterIP: 10.96.0.10, ports: [{port: 70000}]}\n",
            frontends: good,
            warnings: &["Service default/web: spec.ports[0].port: 70000 is not a valid port; keeping the last good version"],
        },
        Step {
            // clusterIP deleted: still the last good version, the new problem reported.
            apply: "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {ports: [{port: 80}]}\n",
            frontends: good,
            warnings: &["Service default/web: spec.clusterIP: missing (a manifest directory has no IP allocator: set spec.clusterIP); keeping the last good version"],
        },
        Step {
            // A valid edit is applied (and clears the problem).
            apply: "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {clusterIP: 10.96.0.10, ports: [{port: 81}]}\n",
            frontends: &["10.96.0.10:81/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.1.3:8080"],
            warnings: &[],
        },
        Step {
            apply: "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {clusterIP: 10.96.0.10, ports: [{port: 81, protocol: ICMP}]}\n",
            frontends: &["10.96.0.10:81/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.1.3:8080"],
            warnings: &["Service default/web: spec.ports[0].protocol: \"ICMP\" is not TCP, UDP or SCTP; keeping the last good version"],
        },
        Step { apply: "delete Service default/web", frontends: &[], warnings: &[] },
        Step {
            // Deleted, then back invalid: nothing to keep.
            apply: "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {clusterIP: 10.96.0.10, ports: [{port: 70000}]}\n",
            frontends: &[],
            warnings: &["Service default/web: spec.ports[0].port: 70000 is not a valid port; not programmed (no earlier valid version)"],
        },
        Step { apply: "delete Service default/web", frontends: &[], warnings: &[] },
    ];
    history("service", &steps);
}

/// Issue 11, defect 1: legitimate changes are applied, not held: ExternalName,
/// headless, another proxy's label.
#[test]
fn legitimate_changes_are_applied_not_held() {
    let good: &[&str] =
        &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.1.3:8080"];
    for (what, edit) in [
        ("ExternalName", "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {type: ExternalName, externalName: example.com}\n"),
        ("headless", "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {clusterIP: None, ports: [{port: 80}]}\n"),
        ("other proxy", "apiVersion: v1\nkind: Service\nmetadata: {name: web, labels: {service.kubernetes.io/service-proxy-name: other}}\nspec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}\n"),
    ] {
        history(what, &[
            Step { apply: WEB, frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> (none)"], warnings: &[] },
            Step { apply: WEB_SLICE, frontends: good, warnings: &[] },
            Step { apply: edit, frontends: &[], warnings: &[] },
        ]);
    }
}

/// Issue 11, defect 1: a slice edit that cannot be used keeps the slice's
/// last good endpoints; an empty slice and a bad address among good ones are
/// not object-level errors (the first empties the Service, the second skips
/// one endpoint); deleting the slice drops its last good version.
#[test]
fn an_unusable_slice_edit_keeps_the_last_good_version() {
    let good: &[&str] =
        &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.1.3:8080"];
    let steps = [
        Step { apply: WEB, frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> (none)"], warnings: &[] },
        Step { apply: WEB_SLICE, frontends: good, warnings: &[] },
        Step {
            apply: "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-1, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{port: 0}]\nendpoints: [{addresses: [10.244.1.9]}]\n",
            frontends: good,
            warnings: &["EndpointSlice default/web-1: ports[0].port: 0 is not a valid port; keeping the last good version"],
        },
        Step {
            apply: "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-1, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{port: 8080}]\nendpoints: [{addresses: [10.244.1.2]}, {addresses: [bad]}]\n",
            frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080"],
            warnings: &["EndpointSlice default/web-1: endpoint address \"bad\" is not an IPv4 address; skipped"],
        },
        Step {
            apply: "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-1, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{port: 8080}]\nendpoints: []\n",
            frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> (none)"],
            warnings: &[],
        },
        Step { apply: WEB_SLICE, frontends: good, warnings: &[] },
        Step {
            apply: "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-1, labels: {kubernetes.io/service-name: web}}\naddressType: ''\nendpoints: []\n",
            frontends: good,
            warnings: &["EndpointSlice default/web-1: addressType: missing; keeping the last good version"],
        },
        Step {
            apply: "delete EndpointSlice default/web-1",
            frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> (none)"],
            warnings: &[],
        },
    ];
    history("slice", &steps);
}

/// Issue 11, defect 2: a newer Service never takes a live address, whatever
/// its name; when the owner goes, the next oldest takes over.
#[test]
fn a_newer_service_does_not_steal_a_live_address() {
    let steps = [
        Step {
            apply: "apiVersion: v1\nkind: Service\nmetadata: {name: zeta, creationTimestamp: '2026-12-03T08:00:00Z'}\nspec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}\n",
            frontends: &["10.96.0.10:80/TCP ClusterIP default/zeta -> (none)"],
            warnings: &[],
        },
        Step {
            apply: "apiVersion: v1\nkind: Service\nmetadata: {name: alpha, creationTimestamp: '2026-12-03T08:05:00Z'}\nspec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}\n",
            frontends: &["10.96.0.10:80/TCP ClusterIP default/zeta -> (none)"],
            warnings: &["Service default/alpha: ClusterIP frontend 10.96.0.10:80/TCP is already used by the older Service default/zeta (ClusterIP); not programmed"],
        },
        Step {
            apply: "delete Service default/zeta",
            frontends: &["10.96.0.10:80/TCP ClusterIP default/alpha -> (none)"],
            warnings: &[],
        },
    ];
    history("newcomer", &steps);
}

/// Issue 11: a Service port with more endpoints than
/// `--max-endpoints-per-service` keeps the first ones in address order (the
/// same on every node) and the rest are reported by address.
#[test]
fn endpoints_beyond_the_limit_are_dropped_last_first_and_reported() {
    let mut model = Model::new(None, None);
    model.set_max_endpoints_per_port(2);
    let (services, slices) = objects(&format!(
        "{WEB}---\n{}",
        WEB_SLICE.replace("endpoints: [{addresses: [10.244.1.2]}, {addresses: [10.244.1.3]}]",
            "endpoints: [{addresses: [10.244.1.4]}, {addresses: [10.244.1.2]}, {addresses: [10.244.1.5]}, {addresses: [10.244.1.3]}]")
    ));
    let mut interner = Interner::default();
    for s in &services {
        let info = ServiceInfo::from_k8s(s);
        model.set_service(info.key.clone(), Some(Arc::new(info)));
    }
    for s in &slices {
        let info = SliceInfo::from_k8s(s, &mut interner);
        model.set_slice(info.key.clone(), Some(Arc::new(info)));
    }
    model.update();
    let got: Vec<String> = model
        .desired()
        .frontends
        .values()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        got,
        ["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.1.3:8080"]
    );
    let warnings: Vec<String> = model.warnings().map(ToString::to_string).collect();
    assert_eq!(warnings, ["Service default/web: port 80: 4 endpoints, more than the 2 one service port may have (--max-endpoints-per-service); the 2 last in address order (10.244.1.4:8080 to 10.244.1.5:8080) are not programmed"]);
    // Raising the limit programs them all and the warning goes.
    model.set_max_endpoints_per_port(4);
    let delta = model.update();
    assert_eq!(delta.frontends.len(), 1);
    assert_eq!(
        model
            .desired()
            .frontends
            .values()
            .next()
            .map(|f| f.backends.len()),
        Some(4)
    );
    assert_eq!(model.warnings().count(), 0);
}

/// `switchboard doctor` rebuilds the model with the agent's
/// `--max-endpoints-per-service` (from its status file), so a Service over the
/// limit is not reported as a difference between the source and the maps.
#[test]
fn a_one_shot_build_applies_the_agents_endpoint_limit() {
    let (services, slices) = objects(&format!(
        "{WEB}---\n{}",
        WEB_SLICE.replace("endpoints: [{addresses: [10.244.1.2]}, {addresses: [10.244.1.3]}]",
            "endpoints: [{addresses: [10.244.1.4]}, {addresses: [10.244.1.2]}, {addresses: [10.244.1.3]}]")
    ));
    let backends = |max| {
        let (desired, _) = build_limited(&services, &slices, None, None, max);
        desired
            .frontends
            .values()
            .map(|f| f.backends.len())
            .collect::<Vec<_>>()
    };
    assert_eq!(backends(Some(2)), [2]);
    assert_eq!(backends(None), [3]);
}

/// Issue 12: dual-stack Services. One frontend per address of either family;
/// a frontend gets only the endpoints of its own family's slices (as
/// kube-proxy, whose proxier per family reads only its address type).
const DUAL_SLICES: &str = r#"
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-v4, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.1.2], nodeName: node-a}
- {addresses: [10.244.2.2], nodeName: node-b}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-v6, labels: {kubernetes.io/service-name: web}}
addressType: IPv6
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: ["fd00:10:244:1::2"], nodeName: node-a}
- {addresses: ["fd00:10:244:2::2"], nodeName: node-b}
"#;

fn with_dual_slices(service: &str) -> &'static str {
    Box::leak(format!("{service}{DUAL_SLICES}").into_boxed_str())
}

#[test]
fn dual_stack_rules() {
    run(&[
        Case {
            name: "PreferDualStack: a frontend per family, each with its own family's endpoints",
            node: NodeSel::Unknown,
            proxy_name: None,
            yaml: with_dual_slices(
                r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  ipFamilyPolicy: PreferDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10, "fd00:96::10"]
  ports: [{name: http, port: 80}]
"#,
            ),
            frontends: &[
                "10.96.0.10:80/TCP ClusterIP default/web:http -> 10.244.1.2:8080, 10.244.2.2:8080",
                "[fd00:96::10]:80/TCP ClusterIP default/web:http -> [fd00:10:244:1::2]:8080, [fd00:10:244:2::2]:8080",
            ],
            warnings: &[],
        },
        Case {
            name: "RequireDualStack, IPv6 primary, NodePort with Local policy: per family, this node's addresses and local endpoints",
            node: NodeSel::DualStack,
            proxy_name: None,
            yaml: with_dual_slices(
                r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: NodePort
  externalTrafficPolicy: Local
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv6, IPv4]
  clusterIPs: ["fd00:96::10", 10.96.0.10]
  ports: [{name: http, port: 80, nodePort: 30080}]
"#,
            ),
            frontends: &[
                "10.96.0.10:80/TCP ClusterIP default/web:http -> 10.244.1.2:8080, 10.244.2.2:8080",
                "192.168.1.10:30080/TCP NodePort default/web:http -> 10.244.1.2:8080, 10.244.2.2:8080; from outside -> 10.244.1.2:8080 [local-only]",
                "[fd00::1:10]:30080/TCP NodePort default/web:http -> [fd00:10:244:1::2]:8080, [fd00:10:244:2::2]:8080; from outside -> [fd00:10:244:1::2]:8080 [local-only]",
                "[fd00:96::10]:80/TCP ClusterIP default/web:http -> [fd00:10:244:1::2]:8080, [fd00:10:244:2::2]:8080",
            ],
            warnings: &[],
        },
        Case {
            name: "SingleStack IPv6: only the IPv6 frontend, only IPv6 endpoints (an IPv4 slice is not used)",
            node: NodeSel::Unknown,
            proxy_name: None,
            yaml: with_dual_slices(
                r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  ipFamilyPolicy: SingleStack
  ipFamilies: [IPv6]
  clusterIP: "fd00:96::10"
  clusterIPs: ["fd00:96::10"]
  ports: [{name: http, port: 80}]
"#,
            ),
            frontends: &[
                "[fd00:96::10]:80/TCP ClusterIP default/web:http -> [fd00:10:244:1::2]:8080, [fd00:10:244:2::2]:8080",
            ],
            warnings: &[],
        },
        Case {
            name: "an IPv4-only Service is not served over IPv6: an IPv6 external IP is ignored and named, its NodePort is on the node's IPv4 address only",
            node: NodeSel::DualStack,
            proxy_name: None,
            yaml: with_dual_slices(
                r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  externalIPs: ["2001:db8::20"]
  ports: [{name: http, port: 80, nodePort: 30080}]
"#,
            ),
            frontends: &[
                "10.96.0.10:80/TCP ClusterIP default/web:http -> 10.244.1.2:8080, 10.244.2.2:8080",
                "192.168.1.10:30080/TCP NodePort default/web:http -> 10.244.1.2:8080, 10.244.2.2:8080",
            ],
            warnings: &[
                "Service default/web: externalIP 2001:db8::20 is IPv6 but the Service has no IPv6 cluster IP (ipFamilies); ignored, as kube-proxy does",
            ],
        },
        Case {
            name: "an address of the other family in a slice is skipped and named; FQDN slices are not ours",
            node: NodeSel::Unknown,
            proxy_name: None,
            yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: "fd00:96::10"
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-v6, labels: {kubernetes.io/service-name: web}}
addressType: IPv6
ports: [{port: 8080}]
endpoints: [{addresses: ["fd00:10:244:1::2"]}, {addresses: [10.244.1.9]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-fqdn, labels: {kubernetes.io/service-name: web}}
addressType: FQDN
ports: [{port: 8080}]
endpoints: [{addresses: [pod.example.com]}]
"#,
            frontends: &["[fd00:96::10]:80/TCP ClusterIP default/web -> [fd00:10:244:1::2]:8080"],
            warnings: &["EndpointSlice default/web-v6: endpoint address \"10.244.1.9\" is not an IPv6 address; skipped"],
        },
        Case {
            name: "RequireDualStack with one cluster IP (no allocator here): that family only, said",
            node: NodeSel::Unknown,
            proxy_name: None,
            yaml: with_dual_slices(
                r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  ipFamilyPolicy: RequireDualStack
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80}]
"#,
            ),
            frontends: &["10.96.0.10:80/TCP ClusterIP default/web:http -> 10.244.1.2:8080, 10.244.2.2:8080"],
            warnings: &["Service default/web: ipFamilyPolicy RequireDualStack but only the IPv4 cluster IP 10.96.0.10 is set; only it is programmed"],
        },
    ]);
}

/// Cluster IPs and IP families the API server would refuse: the version
/// cannot be used, and the problem is named by field.
#[test]
fn bad_family_mixes_are_refused_by_field() {
    let svc = |spec: &str| {
        format!("apiVersion: v1\nkind: Service\nmetadata: {{name: web}}\nspec: {{{spec}, ports: [{{port: 80}}]}}\n")
    };
    for (spec, problem) in [
        (
            "clusterIPs: [10.96.0.10, 10.96.0.11]",
            "spec.clusterIPs: two IPv4 addresses; a dual-stack Service has one of each family",
        ),
        (
            "ipFamilies: [IPv4], clusterIPs: [10.96.0.10, \"fd00:96::10\"]",
            "spec.clusterIPs[1]: fd00:96::10 is IPv6, a family spec.ipFamilies does not list",
        ),
        (
            "ipFamilies: [IPv4, IPv6], clusterIPs: [\"fd00:96::10\", 10.96.0.10]",
            "spec.clusterIPs[0]: fd00:96::10 is IPv6 but spec.ipFamilies[0] is IPv4",
        ),
        (
            "clusterIPs: [10.96.0.10, \"fd00:96::10\", 10.96.0.12]",
            "spec.clusterIPs: 3 addresses, at most two (one of each family) are allowed",
        ),
        (
            "ipFamilyPolicy: SingleStack, ipFamilies: [IPv4, IPv6], clusterIPs: [10.96.0.10, \"fd00:96::10\"]",
            "spec.ipFamilyPolicy: SingleStack, but more than one cluster IP or IP family is given (use PreferDualStack or RequireDualStack)",
        ),
        (
            "ipFamilies: [IPv4, IPv4], clusterIP: 10.96.0.10",
            "spec.ipFamilies[1]: IPv4 is listed twice",
        ),
        (
            "ipFamilies: [IPv5], clusterIP: 10.96.0.10",
            "spec.ipFamilies[0]: \"IPv5\" is not IPv4 or IPv6",
        ),
        (
            "ipFamilyPolicy: DualStack, clusterIP: 10.96.0.10",
            "spec.ipFamilyPolicy: \"DualStack\" is not SingleStack, PreferDualStack or RequireDualStack",
        ),
    ] {
        let yaml = svc(spec);
        let (services, slices) = objects(&yaml);
        let (state, warnings) = build(&services, &slices);
        assert!(state.frontends.is_empty(), "{spec}: {state:?}");
        let got: Vec<String> = warnings.iter().map(ToString::to_string).collect();
        assert!(
            got.contains(&format!("Service default/web: {problem}; not programmed (no earlier valid version)")),
            "{spec}: {got:#?}"
        );
    }
}

/// A bad family mix on an edit keeps the last good dual-stack version.
#[test]
fn a_bad_family_edit_keeps_the_last_good_dual_stack_version() {
    let good: &[&str] = &[
        "10.96.0.10:80/TCP ClusterIP default/web:http -> 10.244.1.2:8080, 10.244.2.2:8080",
        "[fd00:96::10]:80/TCP ClusterIP default/web:http -> [fd00:10:244:1::2]:8080, [fd00:10:244:2::2]:8080",
    ];
    let steps = [
        Step {
            apply: with_dual_slices(
                "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {ipFamilyPolicy: PreferDualStack, ipFamilies: [IPv4, IPv6], clusterIPs: [10.96.0.10, \"fd00:96::10\"], ports: [{name: http, port: 80}]}\n",
            ),
            frontends: good,
            warnings: &[],
        },
        Step {
            apply: "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {ipFamilyPolicy: PreferDualStack, ipFamilies: [IPv4, IPv6], clusterIPs: [10.96.0.10, 10.96.0.11], ports: [{name: http, port: 80}]}\n",
            frontends: good,
            warnings: &[
                "Service default/web: spec.clusterIPs: two IPv4 addresses; a dual-stack Service has one of each family; keeping the last good version",
                "Service default/web: spec.clusterIPs[1]: 10.96.0.11 is IPv4 but spec.ipFamilies[1] is IPv6; keeping the last good version",
            ],
        },
        Step {
            // Back to single-stack IPv4: the IPv6 frontend goes.
            apply: "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {ipFamilies: [IPv4], clusterIPs: [10.96.0.10], ports: [{name: http, port: 80}]}\n",
            frontends: &good[..1],
            warnings: &[],
        },
    ];
    history("dual-stack", &steps);
}

#[test]
fn ipv6_addresses_display_bracketed() {
    let f = FrontendAddr {
        ip: "fd00::1".parse().unwrap(),
        port: 80,
        protocol: Protocol::Tcp,
    };
    assert_eq!(f.to_string(), "[fd00::1]:80/TCP");
    assert_eq!(f.family(), IpFamily::V6);
    let b = BackendAddr {
        ip: "fd00:10:244::2".parse().unwrap(),
        port: 8080,
    };
    assert_eq!(b.to_string(), "[fd00:10:244::2]:8080");
}

/// The Service `web` (10.96.0.10:80) followed by `slices`.
fn weighted_web(slices: &str) -> &'static str {
    let service = "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  clusterIP: 10.96.0.10\n  ports: [{port: 80}]\n---\n";
    Box::leak(format!("{service}{slices}").into_boxed_str())
}

/// Issue 23: endpoint weights from the EndpointSlice's annotation.
#[test]
fn endpoint_weight_rules() {
    run(&[
        Case {
            name: "weights by address; unlisted endpoints weigh 1; 0 keeps the endpoint (drained)",
            node: NodeSel::Unknown,
            proxy_name: None,
            yaml: weighted_web(r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  labels: {kubernetes.io/service-name: web}
  annotations: {switchboard.io/weights: " 10.244.1.2=3, 10.244.1.4 = 0 "}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- addresses: [10.244.1.2]
- addresses: [10.244.1.3]
- addresses: [10.244.1.4]
"#),
            frontends: &[
                "10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.1.3:8080, 10.244.1.4:8080 [weights 10.244.1.2:8080=3 10.244.1.4:8080=0]",
            ],
            warnings: &[],
        },
        Case {
            name: "a weights annotation that does not parse is reported by slice and ignored; other slices keep theirs",
            node: NodeSel::Unknown,
            proxy_name: None,
            yaml: weighted_web(r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  labels: {kubernetes.io/service-name: web}
  annotations: {switchboard.io/weights: "10.244.1.2=3,10.244.1.3=heavy"}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- addresses: [10.244.1.2]
- addresses: [10.244.1.3]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-2
  labels: {kubernetes.io/service-name: web}
  annotations: {switchboard.io/weights: "10.244.2.2=2,10.244.9.9=5"}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- addresses: [10.244.2.2]
"#),
            frontends: &[
                "10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.1.3:8080, 10.244.2.2:8080 [weights 10.244.2.2:8080=2]",
            ],
            warnings: &[
                "EndpointSlice default/web-1: annotation switchboard.io/weights: weight \"heavy\" of 10.244.1.3 is not a whole number in 0..=65535; ignored (every endpoint of this slice weighs 1)",
                "EndpointSlice default/web-2: annotation switchboard.io/weights: 10.244.9.9 not an endpoint of this slice; ignored",
            ],
        },
    ]);
}

#[test]
fn weights_annotations_parse_strictly() {
    use super::endpoints::parse_weights;
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let w = parse_weights("10.0.0.1=3, fd00::1=0,,").unwrap();
    assert_eq!(w.len(), 2);
    assert_eq!(w[&ip("10.0.0.1")], 3);
    assert_eq!(w[&ip("fd00::1")], 0);
    assert!(parse_weights("").unwrap().is_empty());
    for (bad, problem) in [
        ("10.0.0.1", "\"10.0.0.1\" is not address=weight"),
        ("pod-a=3", "\"pod-a\" is not an IP address"),
        (
            "10.0.0.1=65536",
            "weight \"65536\" of 10.0.0.1 is not a whole number in 0..=65535",
        ),
        (
            "10.0.0.1=-1",
            "weight \"-1\" of 10.0.0.1 is not a whole number in 0..=65535",
        ),
        ("10.0.0.1=1,10.0.0.1=2", "10.0.0.1 is listed twice"),
    ] {
        assert_eq!(parse_weights(bad), Err(problem.to_string()), "{bad}");
    }
}
