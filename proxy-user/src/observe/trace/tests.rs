use super::*;
use proxy_common::{proto, stat};

fn raw(kind: u8) -> TraceEvent {
    TraceEvent {
        kind,
        layer: layer::TC,
        family: 4,
        proto: proto::TCP,
        client_addr_be: [u32::from(Ipv4Addr::new(10, 1, 0, 2)).to_be(), 0, 0, 0],
        client_port_be: 40000u16.to_be(),
        frontend_addr_be: [u32::from(Ipv4Addr::new(10, 96, 0, 10)).to_be(), 0, 0, 0],
        frontend_port_be: 80u16.to_be(),
        backend_addr_be: [u32::from(Ipv4Addr::new(10, 1, 0, 7)).to_be(), 0, 0, 0],
        backend_port_be: 8080u16.to_be(),
        service_id: 3,
        ..TraceEvent::default()
    }
}

fn event(kind: u8) -> Event {
    Event::decode(&raw(kind), 0.0, Some("default/web:http".into()))
}

fn filter(spec: FilterSpec) -> Filter {
    Filter::try_from(&spec).expect("a valid filter")
}

#[test]
fn a_new_flow_decodes_with_its_addresses_service_and_algorithm() {
    let e = event(kind::NEW_FLOW);
    assert_eq!(e.kind, "new-flow");
    assert_eq!(e.layer, "tc");
    assert_eq!(e.protocol, "tcp");
    assert_eq!(e.client, Some("10.1.0.2:40000".parse().unwrap()));
    assert_eq!(e.frontend, Some("10.96.0.10:80".parse().unwrap()));
    assert_eq!(e.backend, Some("10.1.0.7:8080".parse().unwrap()));
    assert_eq!(e.algorithm.as_deref(), Some("random"));
    assert_eq!(e.reason, None);
}

#[test]
fn a_drop_names_its_reason_and_verdict_and_an_ipv6_address_decodes() {
    let mut r = raw(kind::DROP);
    r.reason = stat::CT_FULL as u8;
    r.family = 6;
    r.client_addr_be = proxy_common::addr6_be("fd00::2".parse::<Ipv6Addr>().unwrap().octets());
    let e = Event::decode(&r, 0.0, None);
    assert_eq!(e.reason.as_deref(), Some("ct_full"));
    assert_eq!(e.verdict.as_deref(), Some("dropped"));
    assert_eq!(e.client, Some("[fd00::2]:40000".parse().unwrap()));
    r.reason = reason::SOURCE_DENIED;
    assert_eq!(
        Event::decode(&r, 0.0, None).reason.as_deref(),
        Some("source_denied")
    );
}

#[test]
fn filters_select_exactly_what_they_name() {
    let e = event(kind::NEW_FLOW);
    let yes = |spec: FilterSpec| assert!(filter(spec.clone()).matches(&e), "{spec:?}");
    let no = |spec: FilterSpec| assert!(!filter(spec.clone()).matches(&e), "{spec:?}");
    yes(FilterSpec::default());
    yes(FilterSpec {
        types: vec!["new-flow".into()],
        ..Default::default()
    });
    no(FilterSpec {
        types: vec!["drop".into()],
        ..Default::default()
    });
    yes(FilterSpec {
        service: Some("default/web".into()),
        ..Default::default()
    });
    yes(FilterSpec {
        service: Some("default/web:http".into()),
        ..Default::default()
    });
    // A prefix of the name is not the Service.
    no(FilterSpec {
        service: Some("default/we".into()),
        ..Default::default()
    });
    yes(FilterSpec {
        frontend: Some("10.96.0.10".into()),
        ..Default::default()
    });
    no(FilterSpec {
        frontend: Some("10.96.0.10:81".into()),
        ..Default::default()
    });
    yes(FilterSpec {
        client: Some("10.1.0.0/24".into()),
        ..Default::default()
    });
    no(FilterSpec {
        client: Some("10.1.1.0/24".into()),
        ..Default::default()
    });
    yes(FilterSpec {
        backend: Some("10.1.0.7:8080".into()),
        ..Default::default()
    });
    no(FilterSpec {
        backend: Some("10.1.0.8".into()),
        ..Default::default()
    });
    yes(FilterSpec {
        protocol: Some("tcp".into()),
        ..Default::default()
    });
    no(FilterSpec {
        protocol: Some("udp".into()),
        ..Default::default()
    });
}

#[test]
fn an_event_without_the_field_a_filter_names_does_not_pass() {
    let mut r = raw(kind::DROP);
    r.client_addr_be = [0; 4];
    r.client_port_be = 0;
    let e = Event::decode(&r, 0.0, None);
    assert_eq!(e.client, None);
    let f = filter(FilterSpec {
        client: Some("0.0.0.0/0".into()),
        ..Default::default()
    });
    assert!(!f.matches(&e));
    let f = filter(FilterSpec {
        service: Some("default/web".into()),
        ..Default::default()
    });
    assert!(!f.matches(&e));
}

#[test]
fn a_bad_filter_is_refused_with_a_reason() {
    for spec in [
        FilterSpec {
            types: vec!["drops".into()],
            ..Default::default()
        },
        FilterSpec {
            client: Some("10.0.0.0/33".into()),
            ..Default::default()
        },
        FilterSpec {
            frontend: Some("web".into()),
            ..Default::default()
        },
        FilterSpec {
            protocol: Some("sctp".into()),
            ..Default::default()
        },
    ] {
        assert!(Filter::try_from(&spec).is_err(), "{spec:?}");
    }
}

#[test]
fn records_round_trip_as_one_json_object_a_line() {
    for record in [
        Record::Event(Box::new(event(kind::NEW_FLOW))),
        Record::Lost {
            kernel: 3,
            reader: 1,
        },
    ] {
        let line = serde_json::to_string(&record).unwrap();
        assert!(!line.contains('\n'));
        let mut back: Record = serde_json::from_str(&line).unwrap();
        if let (Record::Event(b), Record::Event(a)) = (&mut back, &record) {
            b.protocol_number = a.protocol_number;
        }
        assert_eq!(back, record);
    }
}

#[test]
fn the_text_line_shows_the_flow() {
    let line = event(kind::NEW_FLOW).render();
    assert!(
        line.contains(
            "10.1.0.2:40000 -> 10.96.0.10:80 (default/web:http) => 10.1.0.7:8080 [random]"
        ),
        "{line}"
    );
}
