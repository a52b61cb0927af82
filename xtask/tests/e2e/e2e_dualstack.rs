//! The agent's side (root only, netns sandbox): a dual-stack
//! Service from the manifest directory is programmed in both families' maps,
//! each frontend with its own family's endpoints, and the CLI shows and
//! explains the IPv6 frontend with bracketed addresses. (IPv6 packets
//! through the data path are the kernel fixtures' and the tc/socket tests'.)

use std::time::Duration;

use xtask::sandbox::{find, pod_ip};
use xtask::testenv::{demo_sandbox_with, switchboard, write_manifest};

const DUAL: &str = r#"apiVersion: v1
kind: Service
metadata: {name: dual, namespace: demo}
spec:
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIP: 10.96.0.30
  clusterIPs: [10.96.0.30, "fd00:96::30"]
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: dual-v4, namespace: demo, labels: {kubernetes.io/service-name: dual}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [POD1]}, {addresses: [POD2]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: dual-v6, namespace: demo, labels: {kubernetes.io/service-name: dual}}
addressType: IPv6
ports: [{name: http, port: 8080}]
endpoints: [{addresses: ["fd00:244::1"]}, {addresses: ["fd00:244::2"]}, {addresses: ["fd00:244::3"]}]
"#;

#[test]
fn a_dual_stack_service_is_programmed_per_family_and_shown_bracketed() {
    let mut sb = demo_sandbox_with(&[]);
    let sw = switchboard();
    let yaml = DUAL.replace("POD1", &pod_ip(1)).replace("POD2", &pod_ip(2));
    write_manifest(&sb, "dual.yaml", &yaml);
    let frontends = sb
        .wait_services(
            &sw,
            Duration::from_secs(10),
            "demo/dual:http in both families",
            |f| f.iter().filter(|fe| fe.service == "demo/dual:http").count() == 2,
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
    let dual: Vec<_> = frontends
        .iter()
        .filter(|fe| fe.service == "demo/dual:http")
        .collect();
    let by_addr = |a: &str| {
        dual.iter()
            .find(|fe| fe.address == a)
            .unwrap_or_else(|| panic!("no frontend at {a}: {dual:#?}"))
    };
    let v4 = by_addr("10.96.0.30");
    let mut v4_backends: Vec<&str> = v4.backends.iter().map(|b| b.address.as_str()).collect();
    v4_backends.sort();
    assert_eq!(v4_backends, [pod_ip(1), pod_ip(2)], "IPv4 endpoints only");
    let v6 = by_addr("fd00:96::30");
    let mut v6_backends: Vec<&str> = v6.backends.iter().map(|b| b.address.as_str()).collect();
    v6_backends.sort();
    assert_eq!(
        v6_backends,
        ["fd00:244::1", "fd00:244::2", "fd00:244::3"],
        "IPv6 endpoints only"
    );
    assert_ne!(v4.id, v6.id, "a service id per frontend, from one space");
    // The other Services are untouched.
    assert!(find(&frontends, "demo/echo:http").is_some());

    let table = sb.services_raw(&sw, false).expect("services");
    for needle in [
        "[fd00:96::30]:80/TCP",
        "[fd00:244::1]:8080",
        "10.96.0.30:80/TCP",
    ] {
        assert!(table.contains(needle), "table lacks {needle}:\n{table}");
    }

    // The IPv6 maps hold them (pinned, for bpftool).
    for map in ["SB_FE6_V1", "SB_BE6_V1", "SB_RNAT6_V1"] {
        assert!(sb.pin_dir.join(map).exists(), "{map} is not pinned");
    }

    // explain takes the IPv6 frontend.
    let bin = sw.to_string_lossy().into_owned();
    let pin = sb.pin_dir.to_string_lossy().into_owned();
    let out = sb
        .exec_status(
            &sb.node_ns(),
            &[&bin, "explain", "[fd00:96::30]:80/TCP", "--pin-root", &pin],
        )
        .expect("run explain");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("Service:   demo/dual:http (ClusterIP"),
        "{text}"
    );
    assert!(
        text.contains("[fd00:244::1]:8080, [fd00:244::2]:8080, [fd00:244::3]:8080"),
        "{text}"
    );

    // The IPv6 slice goes: its frontend has no backends, the IPv4 one keeps its own.
    let v4_only: String = yaml.split("---").take(2).collect::<Vec<_>>().join("---");
    write_manifest(&sb, "dual.yaml", &v4_only);
    sb.wait_services(
        &sw,
        Duration::from_secs(10),
        "the IPv6 frontend without backends",
        |f| {
            f.iter()
                .any(|fe| fe.address == "fd00:96::30" && fe.backends.is_empty())
                && f.iter()
                    .any(|fe| fe.address == "10.96.0.30" && fe.backends.len() == 2)
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
}
