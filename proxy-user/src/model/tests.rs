//! What the model's cases (`model/cases/`, run by `model/cases.rs`) do not
//! cover: the model's types field by field and as displayed, the Node
//! reader, the weights parser, and the incremental model against a full
//! build over random changes.
use super::*;
use std::collections::BTreeSet;
use std::net::Ipv4Addr;

#[derive(Clone, Copy, Debug)]
enum NodeSel {
    /// node-a, addresses 192.168.1.10 and 203.0.113.10, zone zone-a.
    A,
    /// node-a without a zone label.
    ANoZone,
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
        NodeSel::A => Some(a),
        NodeSel::ANoZone => Some(NodeInfo { zone: None, ..a }),
    }
}

/// The plainest case, asserted field by field against the struct (the
/// case files compare the Display rendering, which shows every field).
#[test]
fn clusterip_exact_state() {
    let objects = super::cases::objects(
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
    )
    .expect("the objects parse");
    let (state, warnings) = build(&objects.services, &objects.slices);
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
