//! The agent's lifecycle on a node (root only, netns sandbox): a start that
//! fails leaves the running data path alone, one agent per pin root, a pin
//! root must be a bpffs, and continuous TCP and UDP through a Service lose
//! nothing while the agent is killed, restarted and upgraded to a build with
//! changed programs, with the Service changing meanwhile.
//!
//! The upgrade build comes from `cargo xtask test` (SWITCHBOARD_UPGRADE_BIN:
//! the same tree built with `switchboard`'s feature `revision-1`, whose pod
//! programs have other instructions).

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use xtask::sandbox::{find, ClientRun, Sandbox, CLUSTER_IP, PODS};
use xtask::testenv::{
    bpftool_json, demo_sandbox_with, endpointslice_yaml, sb_echo, switchboard, wait_agent_log,
    write_manifest,
};

fn upgrade_binary() -> PathBuf {
    let path = std::env::var_os("SWITCHBOARD_UPGRADE_BIN")
        .map(PathBuf::from)
        .expect("SWITCHBOARD_UPGRADE_BIN is not set: run the tests through `cargo xtask test`");
    assert!(path.exists(), "{} does not exist", path.display());
    path
}

/// The id and tag of the program in the TCX link `sb_from_pod` of the first
/// pod interface (from the link pinned under the pin root).
fn pod_program(sb: &Sandbox) -> (u64, String) {
    let links = sb.pin_dir.join("links");
    let pin = std::fs::read_dir(&links)
        .unwrap_or_else(|e| panic!("reading {}: {e}", links.display()))
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("tcx_") && n.ends_with("_sb_from_pod"))
        })
        .unwrap_or_else(|| panic!("no pinned sb_from_pod link under {}", links.display()));
    let link = bpftool_json(&["link", "show", "pinned", &pin.to_string_lossy()]);
    let id = link["prog_id"].as_u64().expect("prog_id in bpftool's link");
    let prog = bpftool_json(&["prog", "show", "id", &id.to_string()]);
    let tag = prog["tag"]
        .as_str()
        .expect("tag in bpftool's prog")
        .to_owned();
    (id, tag)
}

/// A continuous client: a new connection (TCP) or socket (UDP) every 10 ms
/// for `ms`, each allowed 2 s.
fn continuous(sb: &Sandbox, proto: &str, port: u16, ms: u64) -> Child {
    let addr = format!("{CLUSTER_IP}:{port}");
    let ms = ms.to_string();
    sb.client_spawn(
        &sb_echo(),
        &[
            proto,
            &addr,
            "--duration-ms",
            &ms,
            "--interval-ms",
            "10",
            "--timeout-ms",
            "2000",
        ],
    )
    .expect("start a client")
}

fn finish(child: Child, what: &str) -> ClientRun {
    let out = child.wait_with_output().expect("wait for the client");
    ClientRun::parse(&String::from_utf8_lossy(&out.stdout))
        .unwrap_or_else(|e| panic!("{what}: {e:#}"))
}

/// Starts `bin` as the sandbox's agent and waits until its programs took
/// over.
fn start_and_settle(sb: &mut Sandbox, bin: &Path) {
    sb.start_agent(bin).expect("start the agent");
    wait_agent_log(sb, xtask::sandbox::AGENT_READY, Duration::from_secs(10));
}

#[test]
fn zero_loss_across_kill_restart_upgrade_and_service_changes() {
    let mut sb = demo_sandbox_with(&[]);
    let (sw, upgrade) = (switchboard(), upgrade_binary());
    let (first_id, first_tag) = pod_program(&sb);
    let run_ms = 9000;
    let tcp = continuous(&sb, "--tcp", 80, run_ms);
    let udp = continuous(&sb, "--udp", 53, run_ms);
    std::thread::sleep(Duration::from_millis(800));

    // SIGKILL; the Service loses pod3 while no agent runs; a restart adopts.
    let killed = sb.kill_agent().expect("kill the agent");
    assert!(!killed.success(), "SIGKILL is not a clean exit: {killed:?}");
    write_manifest(&sb, "endpointslice.yaml", &endpointslice_yaml(&[1, 2]));
    std::thread::sleep(Duration::from_millis(500));
    start_and_settle(&mut sb, &sw);
    sb.wait_services(&sw, Duration::from_secs(5), "pod3 gone", |f| {
        find(f, "demo/echo:http").is_some_and(|fe| fe.backends.len() == 2)
    })
    .unwrap_or_else(|e| panic!("{e:#}"));
    std::thread::sleep(Duration::from_millis(800));

    // Upgrade: SIGTERM, then the build with changed programs; pod3 returns
    // while it starts.
    sb.stop_agent().expect("stop the agent");
    write_manifest(&sb, "endpointslice.yaml", &endpointslice_yaml(&[1, 2, 3]));
    start_and_settle(&mut sb, &upgrade);
    sb.wait_services(&sw, Duration::from_secs(5), "pod3 back", |f| {
        find(f, "demo/echo:http").is_some_and(|fe| fe.backends.len() == PODS)
    })
    .unwrap_or_else(|e| panic!("{e:#}"));
    let (upgraded_id, upgraded_tag) = pod_program(&sb);
    assert_ne!(
        upgraded_id, first_id,
        "the upgrade swapped in a new program"
    );
    assert_ne!(
        upgraded_tag, first_tag,
        "the upgrade build's program has other instructions (feature revision-1)"
    );
    std::thread::sleep(Duration::from_millis(800));

    // And back: SIGKILL the upgraded agent, restart the ordinary build.
    sb.kill_agent().expect("kill the upgraded agent");
    start_and_settle(&mut sb, &sw);
    let (_, back_tag) = pod_program(&sb);
    assert_eq!(back_tag, first_tag, "the ordinary build's program is back");

    let tcp = finish(tcp, "tcp client");
    let udp = finish(udp, "udp client");
    let failed = |run: &ClientRun| run.failures();
    println!(
        "zero-loss: TCP {} connections, {} failed; UDP {} exchanges, {} failed \
         (across SIGKILL + restart, upgrade to changed programs, SIGKILL + downgrade, two EndpointSlice changes)",
        tcp.attempts.len(),
        failed(&tcp),
        udp.attempts.len(),
        failed(&udp)
    );
    assert!(
        tcp.attempts.len() > 200,
        "too few TCP attempts to mean anything:\n{}",
        tcp.raw
    );
    assert!(
        udp.attempts.len() > 200,
        "too few UDP attempts to mean anything:\n{}",
        udp.raw
    );
    assert_eq!(failed(&tcp), 0, "TCP failures:\n{}", tcp.raw);
    assert_eq!(failed(&udp), 0, "UDP failures:\n{}", udp.raw);
    assert_eq!(
        tcp.spread().len(),
        PODS,
        "every pod served TCP: {:?}",
        tcp.spread()
    );
    sb.cleanup().expect("cleanup");
}

#[test]
fn a_failed_start_leaves_the_running_data_path_alone() {
    let mut sb = demo_sandbox_with(&[]);
    let sw = switchboard();
    let before = pod_program(&sb);
    // What the maps forward where (the counters move with the test's own
    // traffic).
    let programmed = |sb: &Sandbox| -> Vec<(String, String, u16, Vec<String>)> {
        sb.services(&sw)
            .expect("services")
            .iter()
            .map(|f| {
                (
                    f.service.clone(),
                    f.address.clone(),
                    f.port,
                    f.backend_addrs(),
                )
            })
            .collect()
    };
    let services_before = programmed(&sb);
    sb.stop_agent().expect("stop the agent");
    let pin = sb.pin_dir.to_string_lossy().into_owned();
    let bin = sw.to_string_lossy().into_owned();
    let node = sb.node_ns();
    // An `--uplink` that does not exist is no failure: the agent waits for
    // it (`e2e_links`).
    let (what, bad) = (
        "a source directory that does not exist",
        ["--source", "dir:/nonexistent/switchboard-typo"],
    );
    {
        let mut args = vec![
            bin.as_str(),
            "agent",
            "--pin-root",
            &pin,
            "--socket-lb=false",
        ];
        args.extend(bad.iter().copied());
        let out = sb.exec_status(&node, &args).expect("run the agent");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{what}: the agent must fail:\n{stderr}"
        );
        assert_eq!(
            pod_program(&sb),
            before,
            "{what}: the pod programs were replaced:\n{stderr}"
        );
        assert_eq!(programmed(&sb), services_before, "{what}: the maps changed");
        let run = sb
            .client(
                &sb_echo(),
                &["--tcp", &format!("{CLUSTER_IP}:80"), "--count", "20"],
            )
            .expect("client");
        assert!(
            run.all_ok(),
            "{what}: the Service stopped answering:\n{}",
            run.raw
        );
        eprintln!(
            "{what}: {}",
            stderr
                .lines()
                .find(|l| l.contains("Error"))
                .unwrap_or_default()
        );
    }
    let out = sb
        .exec_status(
            &node,
            &[
                &bin,
                "agent",
                "--pin-root",
                &pin,
                "--source",
                "dir:/nonexistent/switchboard-typo",
            ],
        )
        .expect("run the agent");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/nonexistent/switchboard-typo"),
        "the error names the bad source path: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    sb.cleanup().expect("cleanup");
}

#[test]
fn a_second_agent_on_the_same_pin_root_exits_naming_the_first() {
    let mut sb = demo_sandbox_with(&[]);
    let sw = switchboard().to_string_lossy().into_owned();
    let first = sb.agent_pid().expect("the first agent's pid");
    let pin = sb.pin_dir.to_string_lossy().into_owned();
    let source = format!("dir:{}", sb.manifest_dir().display());
    let out = sb
        .exec_status(
            &sb.node_ns(),
            &[
                &sw,
                "agent",
                "--source",
                &source,
                "--pin-root",
                &pin,
                "--socket-lb=false",
            ],
        )
        .expect("run a second agent");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the second agent must exit:\n{stderr}"
    );
    assert!(
        stderr.contains(&format!("pid {first}")),
        "the error names the first agent's pid {first}:\n{stderr}"
    );
    assert!(sb.agent_running(), "the first agent keeps running");
    let run = sb
        .client(
            &sb_echo(),
            &["--tcp", &format!("{CLUSTER_IP}:80"), "--count", "10"],
        )
        .expect("client");
    assert!(run.all_ok(), "{}", run.raw);
    sb.cleanup().expect("cleanup");
}

#[test]
fn a_pin_root_that_is_not_a_bpffs_is_refused() {
    let mut sb = Sandbox::for_test().expect("sandbox");
    sb.copy_manifests(&xtask::util::repo_root().join("manifests/demo"))
        .expect("manifests");
    let plain = sb.dir.join("not-bpffs");
    std::fs::create_dir_all(&plain).expect("plain dir");
    let sw = switchboard().to_string_lossy().into_owned();
    let source = format!("dir:{}", sb.manifest_dir().display());
    let out = sb
        .exec_status(
            &sb.node_ns(),
            &[
                &sw,
                "agent",
                "--source",
                &source,
                "--pin-root",
                &plain.to_string_lossy(),
                "--socket-lb=false",
            ],
        )
        .expect("run the agent");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a plain directory must be refused:\n{stderr}"
    );
    assert!(
        stderr.contains("is not on a bpffs"),
        "a clear error:\n{stderr}"
    );
    let left: Vec<_> = std::fs::read_dir(&plain).expect("read").flatten().collect();
    assert!(
        left.is_empty(),
        "nothing may be pinned or written there: {left:?}"
    );
    assert!(
        !xtask::sandbox::status_file(&plain)
            .with_extension("lock")
            .exists(),
        "a refused start leaves no lock file"
    );
    sb.cleanup().expect("cleanup");
}

#[test]
fn a_capacity_change_resizes_the_maps_online_and_keeps_established_flows() {
    let mut sb = demo_sandbox_with(&["--max-conntrack", "4096", "--max-frontend-entries", "32768"]);
    let sw = switchboard();
    let ct = sb.pin_dir.join("SB_CT_V5");
    // The frontend bitmap grows with the frontend map: 32 bits per entry.
    let bitmap = sb.pin_dir.join(proxy_common::names::FRONTEND_FILTER);
    let max_entries = |path: &Path| {
        bpftool_json(&["map", "show", "pinned", &path.to_string_lossy()])["max_entries"]
            .as_u64()
            .expect("max_entries")
    };
    assert_eq!(max_entries(&ct), 4096);
    assert_eq!(max_entries(&bitmap), 16384);
    let hold = sb
        .client_spawn(
            &sb_echo(),
            &["--tcp", &format!("{CLUSTER_IP}:80"), "--hold", "4"],
        )
        .expect("a long-lived connection");
    std::thread::sleep(Duration::from_millis(700));
    sb.stop_agent().expect("stop the agent");
    sb.start_agent_with(
        &sw,
        &["--max-conntrack", "8192", "--max-frontend-entries", "65536"],
    )
    .expect("restart with bigger conntrack and frontend maps");
    wait_agent_log(&sb, "map resized", Duration::from_secs(10));
    assert_eq!(
        max_entries(&ct),
        8192,
        "the pinned conntrack map has the new size"
    );
    assert_eq!(
        max_entries(&bitmap),
        32768,
        "the pinned frontend bitmap grew with the frontend map"
    );
    assert!(
        !sb.pin_dir.join("SB_CT_V5_resize").exists(),
        "the staging pin is gone once the new map took the old name"
    );
    let out = hold.wait_with_output().expect("the held connection");
    assert!(
        out.status.success(),
        "the connection established before the resize lost replies:\n{}\n--- agent log ---\n{}",
        String::from_utf8_lossy(&out.stdout),
        sb.agent_log()
    );
    let run = sb
        .client(
            &sb_echo(),
            &["--tcp", &format!("{CLUSTER_IP}:80"), "--count", "20"],
        )
        .expect("client");
    assert!(
        run.all_ok(),
        "new connections after the resize:\n{}",
        run.raw
    );
    sb.cleanup().expect("cleanup");
}

/// An agent that finds a pin root of a newer format (a newer
/// version ran there) refuses to start, naming both formats and the way
/// out, and leaves the running data path alone; `status` reports it.
#[test]
fn a_pin_root_of_a_newer_format_is_refused_naming_both_versions() {
    let mut sb = demo_sandbox_with(&[]);
    let sw = switchboard().to_string_lossy().into_owned();
    let stamp = sb.pin_dir.join("SB_FORMAT");
    let ours = std::fs::read_link(&stamp).expect("the agent stamped the pin root's format");
    let ours = ours.to_string_lossy().into_owned();
    assert!(ours.parse::<u32>().is_ok(), "a format number: {ours:?}");
    let before = pod_program(&sb);
    sb.stop_agent().expect("stop the agent");
    // A newer version's stamp.
    let newer = "9999";
    let fresh = sb.pin_dir.join("SB_FORMAT_new");
    std::os::unix::fs::symlink(newer, &fresh).expect("make the newer stamp");
    std::fs::rename(&fresh, &stamp).expect("stamp the pin root newer");

    let pin = sb.pin_dir.to_string_lossy().into_owned();
    let source = format!("dir:{}", sb.manifest_dir().display());
    let node = sb.node_ns();
    let out = sb
        .exec_status(
            &node,
            &[
                &sw,
                "agent",
                "--source",
                &source,
                "--pin-root",
                &pin,
                "--socket-lb=false",
            ],
        )
        .expect("run the agent");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a newer pin root must be refused:\n{stderr}"
    );
    assert!(
        stderr.contains(&format!("format {newer}")),
        "names the pin root's format:\n{stderr}"
    );
    assert!(
        stderr.contains(&format!("(format {ours})")),
        "names this binary's format:\n{stderr}"
    );
    assert!(
        stderr.contains("switchboard cleanup"),
        "names the way out:\n{stderr}"
    );
    assert_eq!(
        pod_program(&sb),
        before,
        "the running data path is left alone"
    );
    assert_eq!(
        std::fs::read_link(&stamp).expect("stamp").to_string_lossy(),
        newer,
        "the refused agent did not restamp"
    );
    let status = sb
        .exec_status(&node, &[&sw, "status", "--pin-root", &pin])
        .expect("run status");
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(!status.status.success(), "status fails:\n{text}");
    assert!(
        text.contains(&format!(
            "is of format {newer}, newer than this switchboard's"
        )),
        "{text}"
    );
    eprintln!(
        "refused: {}",
        stderr
            .lines()
            .find(|l| l.contains("format"))
            .unwrap_or_default()
    );
    sb.cleanup().expect("cleanup");
}

/// With umask 000 the pin and link directories were 0777 and the
/// status and lock files 0666 (any user could unlink a link pin and detach
/// a pod's programs). The agent sets their modes itself.
#[test]
fn the_agent_sets_its_file_modes_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt as _;
    xtask::testenv::require_root();
    let mut sb = Sandbox::for_test().expect("sandbox");
    sb.copy_manifests(&xtask::util::repo_root().join("manifests/demo"))
        .expect("manifests");
    sb.start_pods(&sb_echo()).expect("pods");
    let wrapper = sb.dir.join("switchboard-umask-000");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\numask 000\nexec '{}' \"$@\"\n",
            switchboard().display()
        ),
    )
    .expect("write the wrapper");
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    start_and_settle(&mut sb, &wrapper);
    let mode = |path: &Path| {
        std::fs::symlink_metadata(path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .permissions()
            .mode()
            & 0o7777
    };
    let status = xtask::sandbox::status_file(&sb.pin_dir);
    let lock = status.with_extension("lock");
    assert_eq!(
        mode(&sb.pin_dir.join("links")),
        0o700,
        "the links directory"
    );
    assert_eq!(
        mode(&sb.pin_dir) & 0o022,
        0,
        "the pin root: only root writes"
    );
    assert_eq!(mode(&status), 0o644, "the status file");
    assert_eq!(mode(&lock), 0o644, "the lock file");
    assert_eq!(
        mode(status.parent().expect("dir")),
        0o750,
        "the status directory"
    );
    for entry in std::fs::read_dir(sb.pin_dir.join("links"))
        .expect("links")
        .flatten()
    {
        assert_eq!(mode(&entry.path()) & 0o077, 0, "{}", entry.path().display());
    }
    sb.cleanup().expect("cleanup");
}

/// A failed first start on a fresh pin root (nothing pinned
/// before) takes away every pin it made, the link pins (and with them its
/// programs on the pod interfaces) included.
#[test]
fn a_failed_first_start_leaves_no_pins() {
    xtask::testenv::require_root();
    let mut sb = Sandbox::for_test().expect("sandbox");
    sb.copy_manifests(&xtask::util::repo_root().join("manifests/demo"))
        .expect("manifests");
    sb.start_pods(&sb_echo()).expect("pods");
    let sw = switchboard().to_string_lossy().into_owned();
    let pin = sb.pin_dir.to_string_lossy().into_owned();
    let source = format!("dir:{}", sb.manifest_dir().display());
    // The socket layer attaches last: a cgroup that does not exist fails the
    // start once maps, pod programs and links are pinned.
    let cgroup = sb.dir.join("no-such-cgroup").to_string_lossy().into_owned();
    let out = sb
        .exec_status(
            &sb.node_ns(),
            &[
                &sw,
                "agent",
                "--source",
                &source,
                "--pin-root",
                &pin,
                "--cgroup-root",
                &cgroup,
            ],
        )
        .expect("run the agent");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the start must fail:\n{stderr}");
    assert!(
        stderr.contains("no-such-cgroup"),
        "it failed where meant to:\n{stderr}"
    );
    assert!(stderr.contains("the pins it made are removed"), "{stderr}");
    let left = pins_left(&sb);
    assert!(left.is_empty(), "nothing stays pinned: {left:?}");
    assert!(
        !xtask::sandbox::status_file(&sb.pin_dir).exists(),
        "no status file of an agent that never ran"
    );
    sb.cleanup().expect("cleanup");
}

/// The agent loads the eBPF object while its source reads; a
/// source that fails on a fresh pin root (here at once, while the load is
/// under way) leaves nothing pinned: the load is undone before the agent
/// exits.
#[test]
fn a_source_that_fails_while_the_object_loads_leaves_no_pins() {
    xtask::testenv::require_root();
    let mut sb = Sandbox::for_test().expect("sandbox");
    let sw = switchboard().to_string_lossy().into_owned();
    let pin = sb.pin_dir.to_string_lossy().into_owned();
    let out = sb
        .exec_status(
            &sb.node_ns(),
            &[
                &sw,
                "agent",
                "--pin-root",
                &pin,
                "--socket-lb=false",
                "--source",
                "dir:/nonexistent/switchboard-typo",
            ],
        )
        .expect("run the agent");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the start must fail:\n{stderr}");
    assert!(
        stderr.contains("switchboard-typo"),
        "it failed where meant to:\n{stderr}"
    );
    let left = pins_left(&sb);
    assert!(left.is_empty(), "nothing stays pinned: {left:?}\n{stderr}");
    sb.cleanup().expect("cleanup");
}

/// What of switchboard's is pinned under the sandbox's pin root (the
/// bpffs mount's own entries, maps.debug and progs.debug, are not).
fn pins_left(sb: &Sandbox) -> Vec<String> {
    std::fs::read_dir(&sb.pin_dir)
        .expect("read the pin root")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("SB_") || name == "links")
        .collect()
}
