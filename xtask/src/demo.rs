//! `cargo xtask demo`: the whole path with real packets, in a netns sandbox.
//!
//! A client namespace sends 30 TCP connections and 30 UDP requests to the
//! ClusterIP 10.96.0.10 of `manifests/demo/`; the agent in the node namespace
//! spreads them over pod1..pod3 (tc layer). Then a client in the node's own
//! namespace does the same, balanced by the socket layer on the sandbox's
//! cgroup. Prints each spread, the peers the clients saw, which layer did the
//! work and the `switchboard services` table, then removes the sandbox.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::sandbox::{find, pod_name, purge_tag, ClientRun, Sandbox, CLUSTER_IP, DEMO_TAG, PODS};
use crate::util::{is_root, repo_root};

const REQUESTS: u32 = 30;

pub fn run() -> Result<()> {
    if !is_root() {
        bail!("demo: run as root (it creates network namespaces and loads eBPF programs)");
    }
    crate::setup::run()?;
    let bins = crate::build::demo()?;

    // Ctrl-C / SIGTERM: remove the sandbox before exiting. (A run killed with
    // SIGKILL is cleaned up by the next run, which purges the `sbx` tag first.)
    ctrlc::set_handler(|| {
        eprintln!("\ndemo: interrupted, cleaning up");
        if let Err(e) = purge_tag(DEMO_TAG) {
            eprintln!("demo: cleanup: {e:#}");
        }
        std::process::exit(130);
    })
    .context("install Ctrl-C handler")?;

    println!("demo: creating sandbox {DEMO_TAG} (namespaces {DEMO_TAG}-node, {DEMO_TAG}-cli, {DEMO_TAG}-p1..p{PODS})");
    let mut sb = Sandbox::new(DEMO_TAG)?;
    let result = demo_in(&mut sb, &bins.switchboard, &bins.sb_echo);
    println!("demo: cleaning up");
    let cleanup = sb.cleanup();
    result?;
    cleanup?;
    println!("demo: done");
    Ok(())
}

fn demo_in(sb: &mut Sandbox, switchboard: &Path, sb_echo: &Path) -> Result<()> {
    sb.copy_manifests(&repo_root().join("manifests/demo"))?;
    println!("demo: starting pods pod1..pod{PODS} (sb-echo, TCP 8080, UDP 5353)");
    sb.start_pods(sb_echo)?;
    println!(
        "demo: starting agent: ip netns exec {} switchboard agent --source dir:{} --pin-root {}",
        sb.node_ns(),
        sb.manifest_dir().display(),
        sb.pin_dir.display()
    );
    sb.start_agent(switchboard)?;
    sb.wait_services(
        switchboard,
        Duration::from_secs(10),
        "demo/echo:http and demo/echo:dns with 3 backends each",
        |f| {
            ["demo/echo:http", "demo/echo:dns"]
                .iter()
                .all(|s| find(f, s).is_some_and(|fe| fe.backends.len() == PODS))
        },
    )?;
    println!("demo: agent programmed the Service");

    let pod_client = run_clients("the client namespace (a pod: tc layer)", |args| {
        sb.client(sb_echo, args)
    })?;
    let node = sb.node_ns();
    let host_client = run_clients(
        "the node's namespace (a host process: socket layer)",
        |args| sb.client_in_cgroup(sb_echo, &node, args),
    )?;
    print_layers(sb, switchboard)?;
    println!("switchboard services:");
    print!("{}", sb.services_raw(switchboard, false)?);
    println!();
    print_frontend_dump(sb);
    print_troubleshooting(sb, switchboard)?;

    for (tcp, udp) in [&pod_client, &host_client] {
        check(sb, tcp, udp)?;
    }
    Ok(())
}

/// Sends the TCP connections and UDP requests with `client` and prints how
/// they spread.
fn run_clients(
    from: &str,
    client: impl Fn(&[&str]) -> Result<ClientRun>,
) -> Result<(ClientRun, ClientRun)> {
    let count = REQUESTS.to_string();
    let tcp_addr = format!("{CLUSTER_IP}:80");
    let udp_addr = format!("{CLUSTER_IP}:53");
    println!("demo: {REQUESTS} TCP connections to {tcp_addr} and {REQUESTS} UDP requests to {udp_addr} from {from}");
    let tcp = client(&["--tcp", &tcp_addr, "--count", &count])?;
    let udp = client(&["--udp", &udp_addr, "--count", &count])?;
    println!();
    print_spread(&tcp, &udp);
    println!();
    Ok((tcp, udp))
}

/// Fails the demo if a request failed or a client saw a peer other than the
/// Service.
fn check(sb: &Sandbox, tcp: &ClientRun, udp: &ClientRun) -> Result<()> {
    if !tcp.all_ok() || !udp.all_ok() {
        bail!(
            "demo: some requests failed\nTCP:\n{}UDP:\n{}--- agent log ---\n{}",
            tcp.raw,
            udp.raw,
            sb.agent_log()
        );
    }
    for (run, want) in [
        (tcp, format!("{CLUSTER_IP}:80")),
        (udp, format!("{CLUSTER_IP}:53")),
    ] {
        if run.client_saw() != vec![want.clone()] {
            bail!(
                "demo: the client saw peers {:?}, expected only {want}",
                run.client_saw()
            );
        }
    }
    Ok(())
}

/// What an on-call engineer would run: `status`, `explain` for the client's
/// flow, and `doctor` (each in the node's namespace, as on a node).
fn print_troubleshooting(sb: &Sandbox, switchboard: &Path) -> Result<()> {
    let bin = switchboard.to_string_lossy().into_owned();
    let pin = sb.pin_dir.to_string_lossy().into_owned();
    let from = format!("{}:40000", crate::sandbox::CLIENT_IP);
    let target = format!("{CLUSTER_IP}:80/TCP");
    for args in [
        vec!["status"],
        vec!["explain", target.as_str(), "--from", from.as_str()],
        vec!["doctor"],
    ] {
        let mut cmd = vec![bin.as_str()];
        cmd.extend_from_slice(&args);
        cmd.extend(["--pin-root", pin.as_str()]);
        println!("$ switchboard {}", args.join(" "));
        let out = sb.exec_status(&sb.node_ns(), &cmd)?;
        print!("{}", String::from_utf8_lossy(&out.stdout));
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        if !out.status.success() {
            bail!(
                "demo: `switchboard {}` found a problem ({})",
                args.join(" "),
                out.status
            );
        }
        println!();
    }
    Ok(())
}

/// Which layer did the work: the data path's counters.
fn print_layers(sb: &Sandbox, switchboard: &Path) -> Result<()> {
    let bin = switchboard.to_string_lossy().into_owned();
    let pin = sb.pin_dir.to_string_lossy().into_owned();
    let out = sb.exec(&sb.node_ns(), &[&bin, "stats", "--pin-root", &pin])?;
    let text = String::from_utf8_lossy(&out.stdout);
    println!("switchboard stats (the layers' counters):");
    for line in text.lines().filter(|l| {
        [
            "forwarded",
            "reversed",
            "sock_connect",
            "sock_sendmsg",
            "sock_reversed",
        ]
        .iter()
        .any(|name| l.trim_start().starts_with(name))
    }) {
        println!("{line}");
    }
    println!();
    Ok(())
}

fn print_spread(tcp: &ClientRun, udp: &ClientRun) {
    let (ts, us) = (tcp.spread(), udp.spread());
    let mut names: Vec<String> = (1..=PODS).map(pod_name).collect();
    for n in ts.keys().chain(us.keys()) {
        if !names.contains(n) {
            names.push(n.clone());
        }
    }
    let get = |m: &BTreeMap<String, usize>, n: &str| m.get(n).copied().unwrap_or(0);
    println!("{:<8} {:>10} {:>10}", "POD", "TCP :80", "UDP :53");
    for n in &names {
        println!("{:<8} {:>10} {:>10}", n, get(&ts, n), get(&us, n));
    }
    println!(
        "{:<8} {:>10} {:>10}",
        "failed",
        tcp.failures(),
        udp.failures()
    );
    println!(
        "peer the client saw: TCP {}  UDP {}",
        tcp.client_saw().join(","),
        udp.client_saw().join(",")
    );
    let pod_saw: Vec<String> = tcp
        .attempts
        .iter()
        .filter_map(|a| match a {
            crate::sandbox::Attempt::Ok { pod_saw, .. } => {
                Some(pod_saw.split(':').next().unwrap_or_default().to_string())
            }
            _ => None,
        })
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    println!("peer the pods saw (TCP): {}", pod_saw.join(","));
}

/// Shows that the pinned maps carry BTF: the slot 0 entry of one frontend as
/// `bpftool map lookup` prints it, with field names.
fn print_frontend_dump(sb: &Sandbox) {
    let map = sb.pin_dir.join("SB_FE_V1");
    let bpftool = |args: &[&str]| -> Result<String> {
        let out = std::process::Command::new("bpftool")
            .args(args)
            .output()
            .context("run bpftool")?;
        if !out.status.success() {
            bail!("{}", String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let map_s = map.to_string_lossy().into_owned();
    let result = (|| -> Result<String> {
        // -j gives the raw key bytes next to the BTF-formatted fields.
        let dump = bpftool(&["-j", "map", "dump", "pinned", &map_s])?;
        let entries: Vec<serde_json::Value> = serde_json::from_str(&dump)?;
        let entry = entries
            .iter()
            .find(|e| e["formatted"]["key"]["slot"] == 0)
            .context("no slot 0 entry")?;
        let key: Vec<String> = entry["key"]
            .as_array()
            .context("no raw key")?
            .iter()
            .filter_map(|b| b.as_str().map(str::to_string))
            .collect();
        let mut args = vec!["map", "lookup", "pinned", &map_s, "key", "hex"];
        let key_hex: Vec<&str> = key.iter().map(|b| b.trim_start_matches("0x")).collect();
        args.extend(key_hex);
        let shown = bpftool(&args)?;
        Ok(format!(
            "bpftool map lookup pinned {map_s} key hex {} (slot 0 of one of {} entries):\n{shown}",
            key.iter()
                .map(|b| b.trim_start_matches("0x"))
                .collect::<Vec<_>>()
                .join(" "),
            entries.len()
        ))
    })();
    match result {
        Ok(text) => println!("{}", text.trim_end()),
        Err(e) => println!("bpftool on {map_s}: {e:#}"),
    }
    println!();
}
