//! Netns end-to-end tests of the agent's `/healthz`, `/livez` and `/metrics`
//! on kube-proxy's ports (root only).
//!
//! Each test starts the demo sandbox (node, client and three pod namespaces;
//! the agent on the node with the demo manifests) and talks HTTP from inside
//! the node's namespace, where the defaults listen: `0.0.0.0:10256` for
//! health and `127.0.0.1:10249` for metrics.
//!
//! The binaries come from SWITCHBOARD_BIN and SB_ECHO_BIN (`cargo xtask test`).

use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::chrono::{DateTime, SecondsFormat, Utc};
use xtask::sandbox::{http_get, HttpResponse, Sandbox, CLUSTER_IP};
use xtask::testenv::{demo_sandbox_with, endpointslice_yaml, sb_echo, switchboard, write_manifest};

/// The node name the agent is given, and the Node manifest's.
const NODE: &str = "observe-node";
const HEALTHZ: &str = "127.0.0.1:10256";
const METRICS: &str = "127.0.0.1:10249";
const HTTP_FRONTEND: &str = r#"service="demo/echo:http",frontend="10.96.0.10:80/TCP""#;
const LATENCY_COUNT: &str = "switchboard_network_programming_duration_seconds_count";
const LATENCY_SUM: &str = "switchboard_network_programming_duration_seconds_sum";

fn get(sb: &Sandbox, addr: &str, path: &str) -> anyhow::Result<HttpResponse> {
    let addr: SocketAddr = addr.parse().expect("address");
    http_get(&sb.node_ns(), addr, path, Duration::from_secs(5))
}

/// Polls `GET addr path` in the node's namespace until `pred` holds (10 s);
/// panics with the last answer and the agent log otherwise.
fn wait_get(
    sb: &Sandbox,
    addr: &str,
    path: &str,
    what: &str,
    pred: impl Fn(&HttpResponse) -> bool,
) -> HttpResponse {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let last = match get(sb, addr, path) {
            Ok(r) if pred(&r) => return r,
            Ok(r) => format!("{r:?}"),
            Err(e) => format!("{e:#}"),
        };
        if Instant::now() > deadline {
            panic!(
                "timed out waiting for {what} on http://{addr}{path}; last answer: {last}\n--- agent log ---\n{}",
                sb.agent_log()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn scrape(sb: &Sandbox) -> String {
    wait_get(sb, METRICS, "/metrics", "a 200 from /metrics", |r| {
        r.status == 200
    })
    .body
}

/// The value of the sample `series` (name and labels, as printed) in `text`.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

fn must(text: &str, series: &str) -> f64 {
    sample(text, series).unwrap_or_else(|| panic!("no sample {series} in:\n{text}"))
}

fn rfc3339(t: SystemTime) -> String {
    DateTime::<Utc>::from(t).to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// The demo EndpointSlice with `pods` as endpoints, stamped with `trigger`
/// as the EndpointSlice controller does.
fn stamped_slice(pods: &[usize], trigger: SystemTime) -> String {
    endpointslice_yaml(pods).replacen(
        "metadata:\n",
        &format!(
            "metadata:\n  annotations:\n    endpoints.kubernetes.io/last-change-trigger-time: \"{}\"\n",
            rfc3339(trigger)
        ),
        1,
    )
}

/// This node's Node object; with a deletionTimestamp when `deleting`.
fn node_yaml(deleting: bool) -> String {
    let mut yaml = format!("apiVersion: v1\nkind: Node\nmetadata:\n  name: {NODE}\n");
    if deleting {
        yaml.push_str("  deletionTimestamp: \"2026-01-01T00:00:00Z\"\n");
    }
    yaml
}

/// Waits until the maps hold `demo/echo:http` with `n` backends.
fn wait_http_backends(sb: &mut Sandbox, n: usize) {
    if let Err(e) = sb.wait_services(
        &switchboard(),
        Duration::from_secs(10),
        &format!("demo/echo:http with {n} backends"),
        |f| xtask::sandbox::find(f, "demo/echo:http").is_some_and(|fe| fe.backends.len() == n),
    ) {
        panic!("{e:#}");
    }
}

/// Waits until one TCP connection through the ClusterIP succeeds: the maps
/// are filled before the programs attach, so `demo_sandbox_with` can return
/// a moment before the data path takes traffic.
fn wait_reachable(sb: &Sandbox) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let addr = format!("{CLUSTER_IP}:80");
    loop {
        let run = sb
            .client(&sb_echo(), &["--tcp", &addr, "--timeout-ms", "300"])
            .expect("client");
        if run.all_ok() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{addr} unreachable: {}\n--- agent log ---\n{}",
            run.raw,
            sb.agent_log()
        );
    }
}

/// Traffic through the ClusterIP moves the per-Service counters, the data
/// path's counters and the conntrack fill; a change moves the sync count and
/// the last sync time. The maps' capacities are there.
#[test]
fn metrics_follow_traffic_and_syncs() {
    let mut sb = demo_sandbox_with(&[]);
    wait_reachable(&sb);
    let before = scrape(&sb);
    let syncs = must(&before, "switchboard_sync_duration_seconds_count");
    assert!(syncs >= 1.0, "the first sync is counted:\n{before}");
    let last_sync = must(&before, "switchboard_sync_last_timestamp_seconds");
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    assert!(
        (now - last_sync).abs() < 60.0,
        "last sync {last_sync} vs now {now}"
    );
    assert!(must(&before, r#"switchboard_map_capacity{map="SB_CT_V5"}"#) > 0.0);
    // The IPv6 table is shown next to it, and the collector reports both.
    // The demo has no IPv6 Service: the IPv6 table is at its idle size
    // (issue 22), grown when a first IPv6 Service appears.
    assert_eq!(
        must(&before, r#"switchboard_map_capacity{map="SB_CT6_V1"}"#),
        f64::from(proxy_common::capacity::IPV6_IDLE)
    );
    // Every map's kernel memory: the idle IPv6 table takes far less than
    // the IPv4 one.
    let ct_memory = must(&before, r#"switchboard_map_memory_bytes{map="SB_CT_V5"}"#);
    assert!(ct_memory > 0.0);
    let ct6_memory = must(&before, r#"switchboard_map_memory_bytes{map="SB_CT6_V1"}"#);
    assert!(
        ct6_memory > 0.0 && ct6_memory * 100.0 < ct_memory,
        "the idle IPv6 conntrack table takes far less than the IPv4 one: {ct6_memory} vs {ct_memory}"
    );
    // The collector reports each family after its first pass over that
    // family's table; the passes run one after the other.
    let fill_series =
        |family: &str| format!(r#"switchboard_conntrack_fill_ratio{{family="{family}"}}"#);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut collected = before.clone();
    while ["ipv4", "ipv6"]
        .iter()
        .any(|f| sample(&collected, &fill_series(f)).is_none())
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(100));
        collected = scrape(&sb);
    }
    for family in ["ipv4", "ipv6"] {
        let fill = must(&collected, &fill_series(family));
        assert!((0.0..=1.0).contains(&fill), "{family}: {fill}");
    }
    assert!(must(&before, r#"switchboard_map_entries{map="SB_FE_V1"}"#) > 0.0);
    assert_eq!(
        must(&before, "switchboard_sync_unprogrammed_frontends"),
        0.0
    );

    let tcp = sb
        .client(
            &sb_echo(),
            &["--tcp", &format!("{CLUSTER_IP}:80"), "--count", "20"],
        )
        .expect("client");
    assert!(tcp.all_ok(), "{}", tcp.raw);
    let udp = sb
        .client(
            &sb_echo(),
            &["--udp", &format!("{CLUSTER_IP}:53"), "--count", "10"],
        )
        .expect("client");
    assert!(udp.all_ok(), "{}", udp.raw);
    // A change: one more sync.
    write_manifest(&sb, "endpointslice.yaml", &endpointslice_yaml(&[1, 2]));
    wait_http_backends(&mut sb, 2);

    let after = scrape(&sb);
    let grew = |series: &str, at_least: f64| {
        let (b, a) = (sample(&before, series).unwrap_or(0.0), must(&after, series));
        assert!(
            a - b >= at_least,
            "{series}: {b} -> {a}, expected +{at_least}\nbefore:\n{before}\nafter:\n{after}"
        );
    };
    grew(
        &format!("switchboard_service_packets_total{{{HTTP_FRONTEND}}}"),
        20.0 * 3.0,
    );
    grew(
        &format!("switchboard_service_bytes_total{{{HTTP_FRONTEND}}}"),
        20.0 * 60.0,
    );
    grew(
        &format!("switchboard_service_flows_total{{{HTTP_FRONTEND}}}"),
        20.0,
    );
    grew(
        r#"switchboard_datapath_events_total{counter="forwarded"}"#,
        20.0 * 3.0,
    );
    grew(r#"switchboard_map_entries{map="SB_CT_V5"}"#, 1.0);
    grew("switchboard_sync_duration_seconds_count", 1.0);
    assert!(
        must(&after, "switchboard_sync_last_timestamp_seconds") > last_sync,
        "the last sync time moved:\n{after}"
    );
    assert_eq!(
        sample(
            &after,
            &format!("switchboard_service_drops_total{{{HTTP_FRONTEND}}}")
        ),
        Some(0.0)
    );
}

/// `/healthz` and `/livez` answer 200 with kube-proxy's fields; while the
/// Node has a deletionTimestamp `/healthz` turns 503 (nodeEligible false)
/// and `/livez` stays 200; without it, `/healthz` is 200 again.
#[test]
fn healthz_fails_while_the_node_is_deleted_and_livez_does_not() {
    let sb = demo_sandbox_with(&["--node-name", NODE]);
    let healthy = wait_get(&sb, HEALTHZ, "/healthz", "a 200", |r| r.status == 200);
    for field in [
        "\"lastUpdated\":",
        "\"currentTime\":",
        "\"nodeEligible\":true",
    ] {
        assert!(healthy.body.contains(field), "{}", healthy.body);
    }
    let live = get(&sb, HEALTHZ, "/livez").expect("livez");
    assert_eq!(live.status, 200, "{}", live.body);
    assert!(!live.body.contains("nodeEligible"), "{}", live.body);
    assert_eq!(get(&sb, HEALTHZ, "/nothing").expect("404").status, 404);

    write_manifest(&sb, "node.yaml", &node_yaml(true));
    let unhealthy = wait_get(&sb, HEALTHZ, "/healthz", "a 503", |r| r.status == 503);
    assert!(
        unhealthy.body.contains("\"nodeEligible\":false"),
        "{}",
        unhealthy.body
    );
    let live = get(&sb, HEALTHZ, "/livez").expect("livez");
    assert_eq!(live.status, 200, "/livez ignores the node: {}", live.body);

    write_manifest(&sb, "node.yaml", &node_yaml(false));
    wait_get(&sb, HEALTHZ, "/healthz", "a 200 again", |r| r.status == 200);
}

/// An EndpointSlice stamped with a recent last-change-trigger-time is
/// observed once in the programming latency histogram; one stamped before
/// the agent started is not.
#[test]
fn a_stamped_endpointslice_is_observed_in_the_programming_latency() {
    let mut sb = demo_sandbox_with(&[]);
    let before = scrape(&sb);
    assert_eq!(
        sample(&before, LATENCY_COUNT),
        Some(0.0),
        "the demo slice has no trigger time:\n{before}"
    );

    let trigger = SystemTime::now();
    write_manifest(&sb, "endpointslice.yaml", &stamped_slice(&[1, 2], trigger));
    wait_http_backends(&mut sb, 2);
    let observed = wait_get(&sb, METRICS, "/metrics", "one latency observation", |r| {
        sample(&r.body, LATENCY_COUNT) == Some(1.0)
    })
    .body;
    let sum = must(&observed, LATENCY_SUM);
    let waited = trigger.elapsed().expect("clock").as_secs_f64();
    assert!(
        sum > 0.0 && sum <= waited,
        "latency {sum} s, {waited} s since the trigger:\n{observed}"
    );

    // A trigger from before the agent started: programmed, not observed.
    let old = SystemTime::now() - Duration::from_secs(3600);
    write_manifest(&sb, "endpointslice.yaml", &stamped_slice(&[1, 2, 3], old));
    wait_http_backends(&mut sb, 3);
    let after = scrape(&sb);
    assert_eq!(sample(&after, LATENCY_COUNT), Some(1.0), "{after}");
}

/// The metric names the agent's `/metrics` exports: each `# TYPE` family
/// with the sample names its type gives it.
fn exported_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let (Some(name), Some(kind)) = (words.next(), words.next()) else {
            continue;
        };
        let suffixes: &[&str] = match kind {
            "counter" => &["_total", "_created"],
            "histogram" => &["_bucket", "_sum", "_count", "_created"],
            _ => &[""],
        };
        names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
    }
    names
}

/// The metric names a PromQL expression reads (every `switchboard_`
/// identifier in it).
fn queried_names(expr: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("switchboard_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(tail.len());
        found.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    found
}

#[test]
fn the_grafana_dashboard_queries_only_metrics_the_agent_exports() {
    let path = xtask::util::repo_root().join("manifests/grafana-dashboard.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read the dashboard"))
            .expect("the dashboard is JSON");
    let mut exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_owned))
        .collect();
    exprs.extend(
        dashboard["templating"]["list"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v["query"].as_str().map(str::to_owned)),
    );
    assert!(exprs.len() >= 8, "{exprs:#?}");
    let sb = demo_sandbox_with(&[]);
    // The collector's gauges exist once its first pass (which starts with
    // the agent, on a thread of its own) is done: scrape until then.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let (exported, unknown) = loop {
        let exported = exported_names(&scrape(&sb));
        let mut unknown = Vec::new();
        for expr in exprs.iter().filter(|e| e.contains('(') || e.contains('{')) {
            let names = queried_names(expr);
            assert!(
                !names.is_empty(),
                "an expression reads no metric of the agent's: {expr}"
            );
            unknown.extend(names.into_iter().filter(|n| !exported.contains(n)));
        }
        if unknown.is_empty() || std::time::Instant::now() > deadline {
            break (exported, unknown);
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert!(
        unknown.is_empty(),
        "the dashboard queries metrics the agent does not export: {unknown:?}\nexported: {exported:#?}"
    );
}
