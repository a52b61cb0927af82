//! What the root-only integration tests (`xtask/tests/*.rs`) need from their
//! environment: the binaries `cargo xtask test` built, and root.
use std::fs;
use std::path::PathBuf;
use std::time::Duration;

use crate::sandbox::{find, pod_ip, pod_name, Sandbox, PODS};

/// A binary named by environment variable `var`. Panics with the command to
/// run when it is unset or missing: these tests never pass silently.
fn bin(var: &str) -> PathBuf {
    let path = std::env::var_os(var).unwrap_or_else(|| {
        panic!("{var} is not set: run the end-to-end tests with `cargo xtask test` (as root), which builds the binaries and sets it")
    });
    let path = PathBuf::from(path);
    assert!(
        path.exists(),
        "{var}={} does not exist: run `cargo xtask test`",
        path.display()
    );
    path
}

/// `SWITCHBOARD_BIN`: the agent and CLI.
pub fn switchboard() -> PathBuf {
    bin("SWITCHBOARD_BIN")
}

/// `SB_ECHO_BIN`: the pod server and client.
pub fn sb_echo() -> PathBuf {
    bin("SB_ECHO_BIN")
}

pub fn require_root() {
    assert!(
        crate::util::is_root(),
        "the netns end-to-end tests need root: run `cargo xtask test` as root"
    );
}

/// A sandbox with pods and an agent (started with `agent_args` on top of the
/// sandbox's own) serving the demo manifests, programmed with all three pods
/// on both ports.
pub fn demo_sandbox_with(agent_args: &[&str]) -> Sandbox {
    require_root();
    let (sw, echo) = (switchboard(), sb_echo());
    let mut sb = Sandbox::for_test().expect("create sandbox");
    sb.copy_manifests(&crate::util::repo_root().join("manifests/demo"))
        .expect("copy the demo manifests");
    sb.start_pods(&echo).expect("start pods");
    sb.start_agent_with(&sw, agent_args).expect("start agent");
    if let Err(e) = sb.wait_services(
        &sw,
        Duration::from_secs(10),
        "demo/echo:http and demo/echo:dns with 3 backends",
        |f| {
            ["demo/echo:http", "demo/echo:dns"]
                .iter()
                .all(|s| find(f, s).is_some_and(|fe| fe.backends.len() == PODS))
        },
    ) {
        panic!("{e:#}");
    }
    sb
}

/// Replaces a manifest atomically (write elsewhere, then rename into the
/// watched directory), the way editors and `kubectl ... > tmp && mv` do.
pub fn write_manifest(sb: &Sandbox, name: &str, contents: &str) {
    let tmp = sb.dir.join(format!(".{name}.tmp"));
    fs::write(&tmp, contents).expect("write the manifest");
    fs::rename(&tmp, sb.manifest_dir().join(name)).expect("write the manifest");
}

/// An EndpointSlice for `demo/echo` with the given pods (1-based) as endpoints.
pub fn endpointslice_yaml(pods: &[usize]) -> String {
    let mut s = String::from(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: IPv4\n\
         metadata:\n  name: echo-abc12\n  namespace: demo\n  labels:\n    kubernetes.io/service-name: echo\n\
         endpoints:\n",
    );
    for &i in pods {
        s.push_str(&format!(
            "- addresses:\n  - {}\n  conditions:\n    ready: true\n  targetRef:\n    kind: Pod\n    name: {}\n    namespace: demo\n",
            pod_ip(i),
            pod_name(i)
        ));
    }
    s.push_str(
        "ports:\n- name: http\n  port: 8080\n  protocol: TCP\n- name: dns\n  port: 5353\n  protocol: UDP\n",
    );
    s
}
