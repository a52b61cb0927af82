//! Netns end-to-end tests of Service semantics with real traffic (root only):
//! the traffic follows each change of a Service or its EndpointSlice within
//! one second.
//!
//! Each test builds its own sandbox (`sbt<pid>-<n>`), starts `sb-echo` pods and
//! the `switchboard` agent with `--source dir:` on one manifest file holding
//! the Service `demo/echo` (ClusterIP 10.96.0.10, TCP 80) and its
//! EndpointSlice, so every change is one atomic rename. After a change the
//! test polls with short bursts of connections from the client namespace
//! until the new behaviour shows, prints how long that took (visible with
//! `--nocapture`) and fails if it took more than one second. While a Service
//! keeps backends, no connection may fail across a change; and a connection
//! established to an endpoint that then leaves keeps working (kube-proxy's
//! conntrack behaviour).
//!
//! The binaries come from `cargo xtask test`, which builds them and passes
//! SWITCHBOARD_BIN and SB_ECHO_BIN. Without those the tests fail (never pass
//! silently).

use std::collections::BTreeSet;
use std::fs;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use xtask::sandbox::{
    pod_ip, pod_name, Attempt, ClientRun, Sandbox, CLUSTER_IP, PODS, POD_TCP_PORT,
};
use xtask::testenv::{require_root, sb_echo, switchboard};

/// How fast the traffic must follow a change.
const FOLLOW_LIMIT: Duration = Duration::from_secs(1);
/// How long to keep polling after the limit, to report how late it was.
const GIVE_UP: Duration = Duration::from_secs(3);
/// The manifest file (Service and EndpointSlice together).
const FILE: &str = "echo.yaml";
/// Second port every pod listens on (for the moved-port test).
const ALT_PORT: u16 = 9090;

/// The Service address under test.
fn svc_addr() -> String {
    format!("{CLUSTER_IP}:80")
}

/// One endpoint of the slice: pod `pod` (1-based) with its conditions.
#[derive(Clone, Copy)]
struct Ep {
    pod: usize,
    ready: bool,
    serving: bool,
    terminating: bool,
}

fn ready(pod: usize) -> Ep {
    Ep {
        pod,
        ready: true,
        serving: true,
        terminating: false,
    }
}

fn not_ready(pod: usize) -> Ep {
    Ep {
        pod,
        ready: false,
        serving: false,
        terminating: false,
    }
}

fn terminating(pod: usize, serving: bool) -> Ep {
    Ep {
        pod,
        ready: false,
        serving,
        terminating: true,
    }
}

fn ready_pods(pods: &[usize]) -> Vec<Ep> {
    pods.iter().map(|&p| ready(p)).collect()
}

/// Service `demo/echo` (one TCP port `port_name`, 80 → targetPort `web`) and
/// its EndpointSlice, whose port of the same name is `slice_port`.
fn manifest(port_name: &str, slice_port: u16, eps: &[Ep]) -> String {
    let mut s = format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: echo\n  namespace: demo\n\
         spec:\n  clusterIP: {CLUSTER_IP}\n  ports:\n  - name: {port_name}\n    port: 80\n    protocol: TCP\n    targetPort: web\n\
         ---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: IPv4\n\
         metadata:\n  name: echo-abc12\n  namespace: demo\n  labels:\n    kubernetes.io/service-name: echo\n\
         ports:\n- name: {port_name}\n  port: {slice_port}\n  protocol: TCP\n"
    );
    if eps.is_empty() {
        s.push_str("endpoints: []\n");
    } else {
        s.push_str("endpoints:\n");
    }
    for ep in eps {
        s.push_str(&format!(
            "- addresses:\n  - {}\n  conditions:\n    ready: {}\n    serving: {}\n    terminating: {}\n  targetRef:\n    kind: Pod\n    name: {}\n    namespace: demo\n",
            pod_ip(ep.pod),
            ep.ready,
            ep.serving,
            ep.terminating,
            pod_name(ep.pod)
        ));
    }
    s
}

/// The moment a manifest was changed, on both clocks: `sb-echo client`
/// stamps its attempts with Unix milliseconds.
#[derive(Clone, Copy)]
struct Change {
    at: Instant,
    unix_ms: u128,
}

impl Change {
    fn elapsed(&self) -> Duration {
        self.at.elapsed()
    }
}

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// Replaces a manifest atomically (write elsewhere, then rename into the
/// watched directory); returns the moment of the rename.
fn write_manifest(sb: &Sandbox, name: &str, contents: &str) -> Change {
    let tmp = sb.dir.join(format!(".{name}.tmp"));
    fs::write(&tmp, contents).unwrap();
    let change = Change {
        at: Instant::now(),
        unix_ms: unix_ms(),
    };
    fs::rename(&tmp, sb.manifest_dir().join(name)).unwrap();
    change
}

/// `switchboard services -o json`, as JSON values (every field the CLI prints).
fn try_services_json(sb: &Sandbox) -> Result<Vec<Value>, String> {
    let raw = sb
        .services_raw(&switchboard(), true)
        .map_err(|e| format!("{e:#}"))?;
    serde_json::from_str(&raw).map_err(|e| format!("parse {raw}: {e}"))
}

fn services_json(sb: &Sandbox) -> Vec<Value> {
    try_services_json(sb).unwrap_or_else(|e| panic!("{e}"))
}

fn row<'a>(rows: &'a [Value], service: &str) -> Option<&'a Value> {
    rows.iter().find(|r| r["service"] == service)
}

/// `address:port` of a row's backends, sorted.
fn backends(row: &Value) -> Vec<String> {
    let mut v: Vec<String> = row["backends"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|b| format!("{}:{}", b["address"].as_str().unwrap_or("?"), b["port"]))
        .collect();
    v.sort();
    v
}

fn drops(rows: &[Value], service: &str) -> u64 {
    row(rows, service)
        .and_then(|r| r["drops_no_backend"].as_u64())
        .unwrap_or_else(|| panic!("no drops_no_backend for {service}: {rows:#?}"))
}

/// `switchboard stats` (the data path's counters and map fill), for failure
/// messages.
fn global_stats(sb: &Sandbox) -> String {
    let bin = switchboard().to_string_lossy().into_owned();
    let pin = sb.pin_dir.to_string_lossy().into_owned();
    match sb.exec_status(&sb.node_ns(), &[&bin, "stats", "--pin-root", &pin]) {
        Ok(out) => format!(
            "--- switchboard stats ---\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => format!("switchboard stats: {e:#}"),
    }
}

/// Polls `switchboard services -o json` until `pred` holds (10 s).
fn wait_rows(sb: &mut Sandbox, what: &str, pred: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let rows = try_services_json(sb);
        if let Ok(rows) = &rows {
            // The agent syncs before its programs take over.
            if pred(rows) && sb.agent_ready() {
                return rows.clone();
            }
        }
        if Instant::now() > deadline || !sb.agent_running() {
            panic!(
                "waiting for {what} (agent running: {}); last services: {rows:#?}\n--- agent log ---\n{}",
                sb.agent_running(),
                sb.agent_log()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn client(sb: &Sandbox, args: &[&str]) -> ClientRun {
    sb.client(&sb_echo(), args)
        .unwrap_or_else(|e| panic!("{e:#}"))
}

/// `n` TCP connections to the Service, one after the other.
fn connections(sb: &Sandbox, n: u32) -> ClientRun {
    let args = burst_ok(n);
    client(sb, &args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// Which pods answered (names as the servers give them).
fn answered(run: &ClientRun) -> BTreeSet<String> {
    run.names().into_iter().collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// `n` TCP connections to the Service, each of which must answer
/// (a generous timeout: a loaded machine may be slow, but nothing is dropped).
fn burst_ok(n: u32) -> Vec<String> {
    vec![
        "--tcp".into(),
        svc_addr(),
        "--count".into(),
        n.to_string(),
        "--timeout-ms".into(),
        "1000".into(),
    ]
}

/// Two TCP connections with a short connect timeout (for dropped traffic).
fn burst_fail() -> Vec<String> {
    vec![
        "--tcp".into(),
        svc_addr(),
        "--count".into(),
        "2".into(),
        "--timeout-ms".into(),
        "100".into(),
    ]
}

/// What the traffic shows once it has followed a change.
enum Expect<'a> {
    /// Every new connection is answered, only by these servers, and each of
    /// them answers.
    Answers(&'a [&'a str]),
    /// Every new connection fails: refused at once (no endpoints: an ICMP
    /// port unreachable from the Service address, as kube-proxy rejects).
    Dropped,
}

/// Connections in a row that must show the new behaviour before it counts.
const ANSWERS_IN_A_ROW: usize = 24;
const DROPS_IN_A_ROW: usize = 3;

/// Polls with short bursts of connections after `change` until the traffic
/// shows `expect`, then prints and returns how long it took: from the change
/// to the first connection of the final stretch that shows the new behaviour
/// (for [`Expect::Answers`], to the first answer of whichever expected server
/// answered last in that stretch). Times come from the client's own stamps,
/// so a slow burst does not blur them. When a server leaves, the time can be
/// early by a few connections (a chance run of answers from the others just
/// before the change landed). Fails if that took more than
/// [`FOLLOW_LIMIT`], or if any connection failed along the way under
/// [`Expect::Answers`] (the Service keeps backends throughout, so nothing may
/// be lost: a connection whose SYN went to a backend just before it left
/// must still complete, as under kube-proxy's conntrack; see
/// `established_connection_survives_its_endpoint_leaving`).
fn follow(sb: &Sandbox, change: Change, what: &str, expect: Expect) -> Duration {
    let args = match expect {
        Expect::Answers(_) => burst_ok(8),
        Expect::Dropped => burst_fail(),
    };
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut attempts: Vec<Attempt> = Vec::new();
    let mut raw = String::new();
    let mut bursts = 0;
    loop {
        let run = client(sb, &args);
        bursts += 1;
        raw.push_str(&run.raw);
        if matches!(expect, Expect::Answers(_)) && run.failures() > 0 {
            panic!(
                "{what}: connections failed after the change (at {} ms since the epoch; burst {bursts}):\n{raw}\n{}\n--- agent log ---\n{}",
                change.unix_ms,
                global_stats(sb),
                sb.agent_log()
            );
        }
        attempts.extend(run.attempts);
        if let Some(at_ms) = followed_at(&attempts, &expect) {
            let took = Duration::from_millis(at_ms.saturating_sub(change.unix_ms) as u64);
            eprintln!(
                "{what}: followed after {} ms ({bursts} bursts, {} connections)",
                took.as_millis(),
                attempts.len()
            );
            assert!(
                took <= FOLLOW_LIMIT,
                "{what}: the traffic followed only after {took:?} (limit {FOLLOW_LIMIT:?}); change at {} ms since the epoch, connections:\n{raw}\n--- agent log ---\n{}",
                change.unix_ms,
                sb.agent_log()
            );
            return took;
        }
        if change.elapsed() > GIVE_UP {
            panic!(
                "{what}: the traffic did not follow within {GIVE_UP:?} ({bursts} bursts); change at {} ms since the epoch, connections:\n{raw}\nservices: {:#?}\n--- agent log ---\n{}",
                change.unix_ms,
                services_json(sb),
                sb.agent_log()
            );
        }
    }
}

/// When the attempts (in order) show `expect` for good: the final stretch of
/// attempts that all show it, if it is long enough and complete.
fn followed_at(attempts: &[Attempt], expect: &Expect) -> Option<u128> {
    let good = |a: &Attempt| match (expect, a) {
        (Expect::Answers(names), Attempt::Ok { name, .. }) => names.contains(&name.as_str()),
        (Expect::Dropped, Attempt::Err { message, .. }) => message.contains("Connection refused"),
        _ => false,
    };
    let start = attempts.iter().rposition(|a| !good(a)).map_or(0, |i| i + 1);
    let stretch = &attempts[start..];
    match expect {
        Expect::Answers(names) => {
            if stretch.len() < ANSWERS_IN_A_ROW {
                return None;
            }
            let mut at = stretch[0].start_ms();
            for name in *names {
                let first = stretch.iter().find(|a| a.name() == Some(name))?;
                at = at.max(first.start_ms());
            }
            Some(at)
        }
        Expect::Dropped => (stretch.len() >= DROPS_IN_A_ROW).then(|| stretch[0].start_ms()),
    }
}

/// Sandbox with pods (TCP 8080, plus [`ALT_PORT`] answering as `pod<i>-<port>`
/// when `alt_port`), the manifest `yaml` and the agent, once the CLI shows
/// `ready` holds.
fn sandbox(yaml: &str, alt_port: bool, ready: impl Fn(&[Value]) -> bool) -> Sandbox {
    require_root();
    let (sw, echo) = (switchboard(), sb_echo());
    let mut sb = Sandbox::for_test().expect("create sandbox");
    sb.start_pods(&echo).expect("start pods");
    if alt_port {
        let bin = echo.to_string_lossy().into_owned();
        for i in 1..=PODS {
            let (ns, name) = (sb.pod_ns(i), format!("{}-{ALT_PORT}", pod_name(i)));
            sb.spawn(
                &name,
                &ns,
                &[&bin, "--name", &name, "--tcp", &ALT_PORT.to_string()],
            )
            .expect("start second server");
        }
        for i in 1..=PODS {
            let addr = format!("{}:{ALT_PORT}", pod_ip(i));
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                let run = client(&sb, &["--tcp", &addr, "--timeout-ms", "300"]);
                if run.all_ok() {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{addr} does not answer: {}",
                    run.raw
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    write_manifest(&sb, FILE, yaml);
    sb.start_agent(&sw).expect("start agent");
    wait_rows(&mut sb, "the initial state", ready);
    sb
}

fn http_backends(pods: &[usize], port: u16) -> Vec<String> {
    let mut v: Vec<String> = pods
        .iter()
        .map(|&i| format!("{}:{port}", pod_ip(i)))
        .collect();
    v.sort();
    v
}

/// Scaling a backend set up (1 → 3: all three answer) and down (3 → 1: only
/// the one left gets new connections); no connection fails on the way.
#[test]
fn scale_up_and_down_follows_within_1s() {
    let mut sb = sandbox(
        &manifest("http", POD_TCP_PORT, &ready_pods(&[1])),
        false,
        |r| row(r, "demo/echo:http").is_some_and(|r| backends(r).len() == 1),
    );
    let before = connections(&sb, 10);
    assert!(before.all_ok(), "{}", before.raw);
    assert_eq!(answered(&before), set(&["pod1"]), "{}", before.raw);

    let t0 = write_manifest(
        &sb,
        FILE,
        &manifest("http", POD_TCP_PORT, &ready_pods(&[1, 2, 3])),
    );
    follow(
        &sb,
        t0,
        "scale 1 -> 3",
        Expect::Answers(&["pod1", "pod2", "pod3"]),
    );
    let rows = wait_rows(&mut sb, "3 backends", |r| {
        row(r, "demo/echo:http").is_some_and(|r| backends(r).len() == 3)
    });
    assert_eq!(
        backends(row(&rows, "demo/echo:http").unwrap()),
        http_backends(&[1, 2, 3], POD_TCP_PORT)
    );

    let t0 = write_manifest(
        &sb,
        FILE,
        &manifest("http", POD_TCP_PORT, &ready_pods(&[2])),
    );
    follow(&sb, t0, "scale 3 -> 1", Expect::Answers(&["pod2"]));
    let after = connections(&sb, 40);
    assert!(after.all_ok(), "{}", after.raw);
    assert_eq!(
        answered(&after),
        set(&["pod2"]),
        "new connections still reach removed pods:\n{}",
        after.raw
    );
    let rows = services_json(&sb);
    assert_eq!(
        backends(row(&rows, "demo/echo:http").unwrap()),
        http_backends(&[2], POD_TCP_PORT)
    );
}

/// An endpoint flipped `ready: false` gets no new connections; flipped back,
/// it gets them again.
#[test]
fn not_ready_endpoint_is_avoided_then_reached_again_within_1s() {
    let mut sb = sandbox(
        &manifest("http", POD_TCP_PORT, &ready_pods(&[1, 2, 3])),
        false,
        |r| row(r, "demo/echo:http").is_some_and(|r| backends(r).len() == 3),
    );
    let t0 = write_manifest(
        &sb,
        FILE,
        &manifest("http", POD_TCP_PORT, &[ready(1), not_ready(2), ready(3)]),
    );
    follow(
        &sb,
        t0,
        "pod2 not ready",
        Expect::Answers(&["pod1", "pod3"]),
    );
    let after = connections(&sb, 40);
    assert!(after.all_ok(), "{}", after.raw);
    assert!(
        !answered(&after).contains("pod2"),
        "a not-ready pod still gets new connections:\n{}",
        after.raw
    );
    let rows = wait_rows(&mut sb, "2 backends", |r| {
        row(r, "demo/echo:http").is_some_and(|r| backends(r).len() == 2)
    });
    assert_eq!(
        backends(row(&rows, "demo/echo:http").unwrap()),
        http_backends(&[1, 3], POD_TCP_PORT)
    );

    let t0 = write_manifest(
        &sb,
        FILE,
        &manifest("http", POD_TCP_PORT, &ready_pods(&[1, 2, 3])),
    );
    follow(
        &sb,
        t0,
        "pod2 ready again",
        Expect::Answers(&["pod1", "pod2", "pod3"]),
    );
    let rows = services_json(&sb);
    assert_eq!(
        backends(row(&rows, "demo/echo:http").unwrap()),
        http_backends(&[1, 2, 3], POD_TCP_PORT)
    );
}

/// kube-proxy's terminating fallback: when no endpoint is ready, the serving
/// and terminating ones still get traffic (a connection stream across the
/// change loses nothing); one that stops serving is left out; when none
/// serves, connections fail (dropped, so they time out).
#[test]
fn terminating_fallback_keeps_traffic_until_serving_stops() {
    let mut sb = sandbox(
        &manifest("http", POD_TCP_PORT, &ready_pods(&[1, 2, 3])),
        false,
        |r| row(r, "demo/echo:http").is_some_and(|r| backends(r).len() == 3),
    );
    // A stream of connections across the change to "all terminating".
    let stream = sb
        .client_spawn(
            &sb_echo(),
            &[
                "--tcp",
                &svc_addr(),
                "--duration-ms",
                "1500",
                "--interval-ms",
                "5",
                "--timeout-ms",
                "1000",
            ],
        )
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let all_terminating: Vec<Ep> = (1..=PODS).map(|i| terminating(i, true)).collect();
    let t0 = write_manifest(&sb, FILE, &manifest("http", POD_TCP_PORT, &all_terminating));
    let rows = wait_rows(&mut sb, "terminating fallback", |r| {
        row(r, "demo/echo:http").is_some_and(|r| r["terminating_fallback"] == true)
    });
    let recorded = t0.elapsed();
    eprintln!(
        "all terminating: fallback recorded after {} ms",
        recorded.as_millis()
    );
    assert!(
        recorded <= FOLLOW_LIMIT,
        "fallback recorded after {recorded:?}"
    );
    assert_eq!(
        backends(row(&rows, "demo/echo:http").unwrap()),
        http_backends(&[1, 2, 3], POD_TCP_PORT)
    );
    let out = stream.wait_with_output().unwrap();
    let run = ClientRun::parse(&String::from_utf8_lossy(&out.stdout)).unwrap();
    assert!(
        run.all_ok() && run.attempts.len() >= 20,
        "connections failed across the change to all-terminating endpoints:\n{}",
        run.raw
    );
    let after = connections(&sb, 30);
    assert!(after.all_ok(), "{}", after.raw);
    assert_eq!(
        answered(&after),
        set(&["pod1", "pod2", "pod3"]),
        "serving, terminating endpoints should all get traffic:\n{}",
        after.raw
    );

    // pod3 stops serving: the fallback is pod1 and pod2 only.
    let t0 = write_manifest(
        &sb,
        FILE,
        &manifest(
            "http",
            POD_TCP_PORT,
            &[
                terminating(1, true),
                terminating(2, true),
                terminating(3, false),
            ],
        ),
    );
    follow(
        &sb,
        t0,
        "pod3 stops serving",
        Expect::Answers(&["pod1", "pod2"]),
    );

    // None serves: nothing to fall back to, connections are dropped.
    let none_serving: Vec<Ep> = (1..=PODS).map(|i| terminating(i, false)).collect();
    let t0 = write_manifest(&sb, FILE, &manifest("http", POD_TCP_PORT, &none_serving));
    follow(&sb, t0, "no endpoint serving", Expect::Dropped);
    let rows = services_json(&sb);
    let http = row(&rows, "demo/echo:http").unwrap();
    assert_eq!(backends(http), Vec::<String>::new(), "{http:#}");
    assert_eq!(http["terminating_fallback"], false, "{http:#}");
    let run = client(
        &sb,
        &["--tcp", &svc_addr(), "--count", "3", "--timeout-ms", "200"],
    );
    assert_eq!(run.failures(), 3, "{}", run.raw);
}

/// A Service port `http` with `targetPort: web`: when the pods' `web` port
/// moves (8080 → 9090 in the slice), traffic follows to the new port; when the
/// port is renamed (`http` → `www`, Service and slice) and moved back, it
/// follows again, the CLI shows the new name and port, and the client still
/// sees the Service address as its peer.
#[test]
fn renamed_and_moved_port_follows_within_1s() {
    let mut sb = sandbox(
        &manifest("http", POD_TCP_PORT, &ready_pods(&[1, 2, 3])),
        true,
        |r| row(r, "demo/echo:http").is_some_and(|r| backends(r).len() == 3),
    );
    let on_8080 = ["pod1", "pod2", "pod3"];
    let on_alt = ["pod1-9090", "pod2-9090", "pod3-9090"];
    assert_eq!(ALT_PORT, 9090);
    let before = connections(&sb, 24);
    assert!(before.all_ok(), "{}", before.raw);
    assert_eq!(answered(&before), set(&on_8080), "{}", before.raw);

    // Moved: the slice's `http` port is now 9090.
    let t0 = write_manifest(
        &sb,
        FILE,
        &manifest("http", ALT_PORT, &ready_pods(&[1, 2, 3])),
    );
    follow(
        &sb,
        t0,
        "target port 8080 -> 9090",
        Expect::Answers(&on_alt),
    );
    let rows = wait_rows(&mut sb, "backends on 9090", |r| {
        row(r, "demo/echo:http").is_some_and(|r| backends(r) == http_backends(&[1, 2, 3], ALT_PORT))
    });
    assert_eq!(row(&rows, "demo/echo:http").unwrap()["port"], 80);

    // Renamed and moved back: Service port and slice port are now `www`, 8080.
    let t0 = write_manifest(
        &sb,
        FILE,
        &manifest("www", POD_TCP_PORT, &ready_pods(&[1, 2, 3])),
    );
    follow(
        &sb,
        t0,
        "port renamed http -> www, target 9090 -> 8080",
        Expect::Answers(&on_8080),
    );
    let rows = wait_rows(
        &mut sb,
        "demo/echo:www on 8080 and no demo/echo:http",
        |r| {
            row(r, "demo/echo:http").is_none()
                && row(r, "demo/echo:www")
                    .is_some_and(|r| backends(r) == http_backends(&[1, 2, 3], POD_TCP_PORT))
        },
    );
    let www = row(&rows, "demo/echo:www").unwrap();
    assert_eq!(
        (www["address"].as_str(), www["port"].as_u64()),
        (Some(CLUSTER_IP), Some(80)),
        "{www:#}"
    );
    let after = connections(&sb, 24);
    assert!(after.all_ok(), "{}", after.raw);
    assert_eq!(answered(&after), set(&on_8080), "{}", after.raw);
    assert_eq!(
        after.client_saw(),
        vec![svc_addr()],
        "replies must come from the Service address"
    );
}

/// A Service whose endpoints all go away, and one that never had any: new
/// connections are refused at once (an ICMP port unreachable from the
/// Service address, as kube-proxy rejects; see e2e_reject.rs) and the
/// per-service `drops_no_backend` counter rises.
#[test]
fn service_without_endpoints_drops_and_counts() {
    let empty = "apiVersion: v1\nkind: Service\nmetadata:\n  name: empty\n  namespace: demo\n\
                 spec:\n  clusterIP: 10.96.0.11\n  ports:\n  - name: http\n    port: 80\n    protocol: TCP\n";
    let yaml = format!(
        "{}---\n{empty}",
        manifest("http", POD_TCP_PORT, &ready_pods(&[1, 2, 3]))
    );
    let mut sb = sandbox(&yaml, false, |r| {
        row(r, "demo/echo:http").is_some_and(|r| backends(r).len() == 3)
            && row(r, "demo/empty:http").is_some()
    });
    let before = connections(&sb, 10);
    assert!(before.all_ok(), "{}", before.raw);

    // The Service that never had endpoints.
    let rows = services_json(&sb);
    let d0 = drops(&rows, "demo/empty:http");
    assert_eq!(
        backends(row(&rows, "demo/empty:http").unwrap()),
        Vec::<String>::new()
    );
    let began = Instant::now();
    let run = client(
        &sb,
        &[
            "--tcp",
            "10.96.0.11:80",
            "--count",
            "4",
            "--timeout-ms",
            "150",
        ],
    );
    let took = began.elapsed();
    assert_eq!(run.failures(), 4, "{}", run.raw);
    assert!(
        run.raw.lines().all(|l| l.contains("Connection refused")),
        "connections should be refused (rejected), not time out:\n{}",
        run.raw
    );
    assert!(took < Duration::from_secs(3), "4 attempts took {took:?}");
    let d1 = drops(&services_json(&sb), "demo/empty:http");
    assert!(
        d1 >= d0 + 4,
        "drops_no_backend of demo/empty:http went from {d0} to {d1} after 4 dropped connections"
    );

    // All endpoints of demo/echo go away.
    let d0 = drops(&rows, "demo/echo:http");
    let yaml = format!("{}---\n{empty}", manifest("http", POD_TCP_PORT, &[]));
    let t0 = write_manifest(&sb, FILE, &yaml);
    follow(&sb, t0, "all endpoints removed", Expect::Dropped);
    let rows = wait_rows(&mut sb, "demo/echo:http without backends", |r| {
        row(r, "demo/echo:http").is_some_and(|r| backends(r).is_empty())
    });
    let d1 = drops(&rows, "demo/echo:http");
    let run = client(
        &sb,
        &["--tcp", &svc_addr(), "--count", "4", "--timeout-ms", "150"],
    );
    assert_eq!(run.failures(), 4, "{}", run.raw);
    assert!(
        run.raw.lines().all(|l| l.contains("Connection refused")),
        "connections should be refused (rejected), not time out:\n{}",
        run.raw
    );
    let d2 = drops(&services_json(&sb), "demo/echo:http");
    eprintln!("drops_no_backend of demo/echo:http: {d0} before, {d1} after the change, {d2} after 4 more attempts");
    assert!(
        d1 > d0,
        "no drop counted while the change took effect ({d0} -> {d1})"
    );
    assert!(
        d2 >= d1 + 4,
        "drops_no_backend went from {d1} to {d2} after 4 dropped connections"
    );
}

/// An established TCP connection keeps its backend when that endpoint leaves
/// the Service (here: it turns not ready while the pod keeps running), as
/// kube-proxy's conntrack does; only new connections go elsewhere.
#[test]
fn established_connection_survives_its_endpoint_leaving() {
    let sb = sandbox(
        &manifest("http", POD_TCP_PORT, &ready_pods(&[1])),
        false,
        |r| row(r, "demo/echo:http").is_some_and(|r| backends(r).len() == 1),
    );
    let hold = sb
        .client_spawn(
            &sb_echo(),
            &["--tcp", &svc_addr(), "--hold", "2", "--timeout-ms", "3000"],
        )
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let t0 = write_manifest(
        &sb,
        FILE,
        &manifest("http", POD_TCP_PORT, &[not_ready(1), ready(2)]),
    );
    follow(
        &sb,
        t0,
        "pod1 not ready, pod2 ready",
        Expect::Answers(&["pod2"]),
    );
    let out = hold.wait_with_output().unwrap();
    let raw = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && raw.starts_with("ok ") && raw.contains(" pod1 "),
        "the connection established to pod1 broke when pod1 left the Service: {raw}\n{}\n--- agent log ---\n{}",
        global_stats(&sb),
        sb.agent_log()
    );
}

/// An edit that parses but cannot be used (a port of 70000) keeps
/// the Service's last good state: it still answers, and `switchboard
/// services` marks it held with the problem by field. A file with a syntax
/// error is listed among the problems until it is removed; fixing the edit
/// clears the mark.
#[test]
fn an_invalid_edit_keeps_the_last_good_state_and_says_so() {
    let good = manifest("http", POD_TCP_PORT, &ready_pods(&[1, 2]));
    let mut sb = sandbox(&good, false, |r| {
        row(r, "demo/echo:http").is_some_and(|r| backends(r).len() == 2)
    });
    let invalid = good.replacen("    port: 80\n", "    port: 70000\n", 1);
    assert_ne!(invalid, good);
    write_manifest(&sb, FILE, &invalid);
    let rows = wait_rows(&mut sb, "demo/echo held", |r| {
        row(r, "demo/echo:http").is_some_and(|r| r["held"] == true)
    });
    let held = row(&rows, "demo/echo:http").unwrap();
    assert_eq!(backends(held), http_backends(&[1, 2], POD_TCP_PORT));
    let problems = held["problems"].to_string();
    assert!(
        problems.contains("Service demo/echo: spec.ports[0].port: 70000 is not a valid port"),
        "{held:#}"
    );
    let run = connections(&sb, 20);
    assert!(
        run.all_ok(),
        "the held Service must still answer:\n{}",
        run.raw
    );
    assert_eq!(answered(&run), set(&["pod1", "pod2"]), "{}", run.raw);
    let table = sb.services_raw(&switchboard(), false).unwrap();
    assert!(table.contains(" held "), "{table}");
    assert!(
        table.contains("demo/echo: spec.ports[0].port: 70000 is not a valid port; keeping the last good version"),
        "{table}"
    );

    // A file that does not parse is listed until it goes.
    fs::write(
        sb.manifest_dir().join("broken.yaml"),
        "kind: Service\nmetadata: {name: [\n",
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let table = sb.services_raw(&switchboard(), false).unwrap();
        if table.contains("broken.yaml: document 1: syntax error") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the broken file is not listed:\n{table}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    fs::remove_file(sb.manifest_dir().join("broken.yaml")).unwrap();

    write_manifest(&sb, FILE, &good);
    wait_rows(&mut sb, "demo/echo no longer held", |r| {
        row(r, "demo/echo:http").is_some_and(|r| r["held"] == false)
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let table = sb.services_raw(&switchboard(), false).unwrap();
        if !table.contains("broken.yaml") && !table.contains("70000") {
            break;
        }
        assert!(Instant::now() < deadline, "problems linger:\n{table}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
