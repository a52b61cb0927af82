//! Netns end-to-end tests of the maps' kernel memory (root only): an idle
//! node holds little, and a flow table grows online under traffic without
//! losing an entry or a connection.
//!
//! Each test starts the demo sandbox (node, client and three pod
//! namespaces; the agent on the node with the demo manifests) and reads the
//! maps' capacities and memory from `/metrics` in the node's namespace and
//! from `switchboard status`.
//!
//! The binaries come from SWITCHBOARD_BIN and SB_ECHO_BIN (`cargo xtask test`).

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::Stdio;
use std::time::{Duration, Instant};

use xtask::sandbox::{Attempt, ClientRun, Sandbox, AGENT_READY, CLUSTER_IP};
use xtask::testenv::{demo_sandbox_with, sb_echo, status_line, wait_agent_log};

use crate::e2e_observe::{must, sample, scrape, wait_reachable};

/// The most map memory an idle node may hold at the default flags.
const IDLE_BUDGET: f64 = 32.0 * 1_048_576.0;

/// Every `switchboard_map_memory_bytes` sample of `text`, summed.
fn total_memory(text: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with("switchboard_map_memory_bytes{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// An idle node with one Service (the demo), at the default flags, holds
/// at most 32 MiB of map memory, `/metrics` and `switchboard status` say
/// so; the connection-tracking table keeps its full capacity (it is
/// allocated per entry), and the socket layer's table starts small with
/// room to grow to `--max-conntrack`.
#[test]
fn an_idle_node_holds_at_most_32_mib_of_map_memory() {
    let mut sb = demo_sandbox_with(&[]);
    wait_reachable(&sb);
    let text = scrape(&sb);
    let total = total_memory(&text);
    eprintln!("the idle node's map memory: {:.1} MiB", total / 1_048_576.0);
    assert!(
        total > 0.0 && total <= IDLE_BUDGET,
        "{:.1} MiB of map memory on an idle node:\n{text}",
        total / 1_048_576.0
    );
    let ct = proxy_common::capacity::CONNTRACK;
    assert_eq!(
        must(&text, r#"switchboard_map_capacity{map="SB_CT_V5"}"#),
        f64::from(ct),
        "conntrack keeps its capacity"
    );
    let ct_memory = must(&text, r#"switchboard_map_memory_bytes{map="SB_CT_V5"}"#);
    assert!(
        ct_memory < f64::from(ct) * 20.0,
        "an empty conntrack table holds its buckets only: {ct_memory} bytes"
    );
    let sockets = must(&text, r#"switchboard_map_capacity{map="SB_SOCK_V1"}"#);
    assert!(
        sockets < f64::from(ct) / 16.0,
        "the socket layer's table starts small: {sockets}"
    );
    assert_eq!(
        must(&text, r#"switchboard_map_capacity_max{map="SB_SOCK_V1"}"#),
        f64::from(ct),
        "and may grow to --max-conntrack"
    );
    let (total_line, status) = status_line(&sb.pin_dir, "  total");
    if let Some(memory) = status.split("KERNEL MEMORY OF THE MAPS").nth(1) {
        eprintln!("switchboard status, kernel memory of the maps:{memory}");
    }
    let status_mib: f64 = total_line
        .as_deref()
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no total in status:\n{status}"));
    assert!(
        status_mib <= 32.0,
        "status says {status_mib} MiB:\n{status}"
    );
    sb.cleanup().expect("cleanup");
}

/// How many connected UDP sockets the test keeps open: past half of the
/// socket layer's starting size (below, 1024), below what its LRU holds
/// before it evicts.
const HELD: usize = 600;
/// The socket layer's table's starting size in that test.
const START: u32 = 1024;

/// A flow table fills past half its starting size under traffic: the agent
/// grows it online (a restart in place, same pid), reported in its log,
/// `/metrics` and `switchboard status`; no connection fails meanwhile, and
/// the socket layer's entries made before the growth are there after it
/// (each connected UDP socket is still answered by its pod, and
/// `getpeername` still shows the ClusterIP).
#[test]
fn a_flow_table_grows_online_under_traffic_without_losing_an_entry() {
    let start = START.to_string();
    let mut sb = demo_sandbox_with(&["--flow-table-start-entries", &start]);
    wait_reachable(&sb);
    let pid = sb.agent_pid().expect("the agent runs");
    let capacity =
        |sb: &Sandbox| sample(&scrape(sb), r#"switchboard_map_capacity{map="SB_SOCK_V1"}"#);
    assert_eq!(capacity(&sb), Some(f64::from(START)), "starts at the flag");

    // TCP connections through the socket layer throughout: one every 10 ms.
    let run_ms = 15_000;
    let tcp = sb
        .client_in_cgroup_spawn(
            &sb_echo(),
            &sb.client_ns(),
            &[
                "--tcp",
                &format!("{CLUSTER_IP}:80"),
                "--duration-ms",
                &run_ms.to_string(),
                "--interval-ms",
                "10",
                "--timeout-ms",
                "2000",
            ],
        )
        .expect("start the TCP client");

    // Connected UDP sockets, kept open: one socket-layer entry each.
    let echo = sb_echo().to_string_lossy().into_owned();
    let held = HELD.to_string();
    let dns = format!("{CLUSTER_IP}:53");
    let args = [
        echo.as_str(),
        "client",
        "--udp",
        &dns,
        "--keep-until-stdin",
        "--count",
        &held,
        "--timeout-ms",
        "2000",
    ];
    let mut keeper = sb
        .command_in_cgroup(&sb.client_ns(), &args)
        .expect("command")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the UDP client");
    let mut out = BufReader::new(keeper.stdout.take().expect("piped"));
    let mut first = String::new();
    loop {
        let mut line = String::new();
        let n = out.read_line(&mut line).expect("read the UDP client");
        assert!(n > 0, "the UDP client ended early:\n{first}");
        if line.starts_with("held ") {
            break;
        }
        first.push_str(&line);
    }
    let first = ClientRun::parse(&first).expect("first round");
    assert!(
        first.all_ok() && first.attempts.len() == HELD,
        "every socket answered once: {}",
        first.raw
    );
    for attempt in &first.attempts {
        if let Attempt::Ok { client_saw, .. } = attempt {
            assert_eq!(client_saw, &dns, "getpeername shows the ClusterIP");
        }
    }

    // The check finds the table half full; the restart grows it.
    wait_agent_log(&sb, "a flow table is half full", Duration::from_secs(10));
    let deadline = Instant::now() + Duration::from_secs(30);
    while sb.agent_log().matches(AGENT_READY).count() < 2 {
        assert!(
            Instant::now() < deadline,
            "the restarted agent never took over:\n{}",
            sb.agent_log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(sb.agent_pid(), Some(pid), "restarted in place");
    let log = sb.agent_log();
    let grown = log
        .lines()
        .find(|l| l.contains("growing a flow table online") && l.contains("SB_SOCK_V1"))
        .unwrap_or_else(|| panic!("no growth logged:\n{log}"));
    let want = 2 * START;
    assert!(
        grown.contains(&format!("from={START}")) && grown.contains(&format!("to={want}")),
        "{grown}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while capacity(&sb) != Some(f64::from(want)) {
        assert!(
            Instant::now() < deadline,
            "the metric shows {:?}, not {want}",
            capacity(&sb)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, status) = status_line(&sb.pin_dir, "");
    let kernel = status
        .split("KERNEL MEMORY")
        .nth(1)
        .and_then(|s| {
            s.lines()
                .find(|l| l.trim_start().starts_with("SB_SOCK_V1 "))
        })
        .map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .unwrap_or_else(|| panic!("no SB_SOCK_V1 memory row:\n{status}"));
    assert_eq!(
        kernel[1..3],
        [
            want.to_string(),
            proxy_common::capacity::CONNTRACK.to_string()
        ],
        "status shows the grown capacity and how far it grows:\n{status}"
    );

    // Every socket, again: the same pod answers, the same peer shows.
    writeln!(keeper.stdin.as_mut().expect("piped"), "go").expect("tell the UDP client");
    let mut second = String::new();
    for line in out.lines() {
        second.push_str(&line.expect("read the UDP client"));
        second.push('\n');
    }
    let status_code = keeper.wait().expect("the UDP client");
    let second = ClientRun::parse(&second).expect("second round");
    assert!(
        status_code.success() && second.all_ok() && second.attempts.len() == HELD,
        "every socket made before the growth is answered after it, by its pod and from the ClusterIP:\n{}",
        second.raw
    );

    let out = tcp.wait_with_output().expect("the TCP client");
    let run = ClientRun::parse(&String::from_utf8_lossy(&out.stdout)).expect("client output");
    eprintln!(
        "growth: SB_SOCK_V1 from {START} to {want} holding {}; {HELD} connected UDP sockets \
         answered before and after ({} failed after); {} TCP connections meanwhile, {} failed",
        grown
            .split_whitespace()
            .find(|w| w.starts_with("entries="))
            .unwrap_or("entries=?"),
        second.failures(),
        run.attempts.len(),
        run.failures()
    );
    assert!(
        run.attempts.len() > 300,
        "the TCP client ran throughout: {} attempts",
        run.attempts.len()
    );
    assert!(
        run.failures() == 0,
        "connections failed while the table grew:\n{}\nagent log:\n{}",
        run.raw,
        sb.agent_log()
    );
    sb.cleanup().expect("cleanup");
}
