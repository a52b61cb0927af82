//! The manifests under `manifests/` (the install, its example overlays and the
//! demo objects) are valid Kubernetes objects with no misspelled fields, and
//! the install holds what a kube-proxy-free node needs: least-privilege RBAC
//! equal to what the agent watches, probes on kube-proxy's health port, an API
//! server address that does not depend on a ClusterIP, the host mounts the
//! agent uses, and no privileged agent container. Pure: reads files only.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
};

use k8s_openapi::{
    api::{
        apps::v1::DaemonSet,
        core::v1::{ConfigMap, Container, Node, Service, ServiceAccount},
        discovery::v1::EndpointSlice,
        rbac::v1::{ClusterRole, ClusterRoleBinding},
    },
    apimachinery::pkg::util::intstr::IntOrString,
    Resource,
};
use serde::{de::DeserializeOwned, Serialize};
use serde_json::Value;

fn manifests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests")
}

/// Every `.yaml`/`.yml` file under `dir`, recursively, sorted.
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml")
            ) {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

fn is_kustomization(path: &Path) -> bool {
    matches!(
        path.file_name().and_then(|n| n.to_str()),
        Some("kustomization.yaml" | "kustomization.yml" | "Kustomization")
    )
}

/// The YAML documents of a multi-document string, as JSON values (empty
/// documents skipped).
fn documents(text: &str) -> Result<Vec<Value>, String> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| e.to_string())?;
    Ok(docs.into_iter().filter(|doc| !doc.is_null()).collect())
}

/// Deserializes `doc` as `T` and serializes it back.
fn round_trip<T: DeserializeOwned + Serialize>(doc: &Value) -> Result<Value, String> {
    let typed: T = serde_json::from_value(doc.clone()).map_err(|e| e.to_string())?;
    serde_json::to_value(&typed).map_err(|e| e.to_string())
}

/// Every field path of `original` must exist, with the same value, in
/// `round_tripped`: a field the typed object dropped is one the API server
/// does not know (k8s-openapi ignores unknown fields, so a typo would pass a
/// plain deserialization). Returns the offending paths.
fn unknown_fields(original: &Value, round_tripped: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    compare(original, Some(round_tripped), String::new(), &mut problems);
    problems
}

fn compare(original: &Value, back: Option<&Value>, path: String, problems: &mut Vec<String>) {
    match (original, back) {
        // An explicit null says no more than an absent field.
        (Value::Null, _) => {}
        (_, None) => problems.push(format!("{path}: unknown field")),
        (Value::Object(fields), Some(Value::Object(back_fields))) => {
            for (key, value) in fields {
                let child = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                compare(value, back_fields.get(key), child, problems);
            }
        }
        (Value::Array(items), Some(Value::Array(back_items)))
            if items.len() == back_items.len() =>
        {
            for (index, (item, back_item)) in items.iter().zip(back_items).enumerate() {
                compare(item, Some(back_item), format!("{path}[{index}]"), problems);
            }
        }
        (original, Some(back)) if original == back => {}
        (original, Some(back)) => problems.push(format!(
            "{path}: {original} became {back} (wrong type or shape)"
        )),
    }
}

/// Checks one document against the k8s-openapi type its apiVersion and kind
/// name; returns `kind/name`.
fn check_document(doc: &Value) -> Result<String, String> {
    let api_version = doc["apiVersion"]
        .as_str()
        .ok_or("no apiVersion")?
        .to_owned();
    let kind = doc["kind"].as_str().ok_or("no kind")?.to_owned();
    macro_rules! by_type {
        ($($ty:ty),* $(,)?) => {
            $(
                if api_version == <$ty>::API_VERSION && kind == <$ty>::KIND {
                    round_trip::<$ty>(doc)
                } else
            )*
            {
                Err(format!("{api_version} {kind}: not a kind this test knows (add its type)"))
            }
        };
    }
    let back = by_type!(
        DaemonSet,
        ConfigMap,
        ClusterRole,
        ClusterRoleBinding,
        ServiceAccount,
        Service,
        EndpointSlice,
        Node,
    )?;
    let problems = unknown_fields(doc, &back);
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    let name = doc["metadata"]["name"].as_str().unwrap_or("?");
    Ok(format!("{kind}/{name}"))
}

#[test]
fn every_manifest_is_a_valid_object_without_unknown_fields() {
    let files = yaml_files(&manifests_dir());
    assert!(files.len() > 5, "found only {files:?}");
    let mut failures = Vec::new();
    let mut checked = 0;
    for file in files.iter().filter(|f| !is_kustomization(f)) {
        let text = fs::read_to_string(file).expect("read manifest");
        match documents(&text) {
            Err(e) => failures.push(format!("{}: {e}", file.display())),
            Ok(docs) => {
                assert!(!docs.is_empty(), "{}: no documents", file.display());
                for doc in &docs {
                    match check_document(doc) {
                        Ok(_) => checked += 1,
                        Err(e) => failures.push(format!("{}: {e}", file.display())),
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "invalid manifests:\n{}",
        failures.join("\n")
    );
    assert!(checked >= 8, "only {checked} documents checked");
}

#[test]
fn the_unknown_field_check_catches_misspellings() {
    let daemonset = r#"
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: x
spec:
  selector:
    matchLabels: {app: x}
  template:
    metadata:
      labels: {app: x}
    spec:
      hostNetwrok: true
      containers:
      - name: x
        image: x
        imagePullPolcy: Always
        ports:
        - containerPort: 10256
"#;
    let docs = documents(daemonset).expect("parse");
    let error = check_document(&docs[0]).expect_err("misspelled fields must be rejected");
    assert!(
        error.contains("spec.template.spec.hostNetwrok: unknown field"),
        "{error}"
    );
    assert!(
        error.contains("spec.template.spec.containers[0].imagePullPolcy: unknown field"),
        "{error}"
    );

    // A value of the wrong type is reported too, not coerced silently.
    let wrong_type = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {a: \"1\"}\nbinaryData: {}\nimmutable: true\n";
    let docs = documents(wrong_type).expect("parse");
    check_document(&docs[0]).expect("a correct ConfigMap passes");
    let bad = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x, labelz: {a: b}}\n";
    let error = check_document(&documents(bad).expect("parse")[0]).expect_err("labelz");
    assert!(error.contains("metadata.labelz"), "{error}");

    // Unknown kinds are refused rather than skipped.
    let unknown = "apiVersion: v1\nkind: Pdo\nmetadata: {name: x}\n";
    assert!(check_document(&documents(unknown).expect("parse")[0]).is_err());
}

/// Every `resources:` entry and patch path of every kustomization exists; a
/// directory entry holds a kustomization of its own.
#[test]
fn kustomizations_reference_existing_files() {
    let root = manifests_dir();
    let kustomizations: Vec<PathBuf> = yaml_files(&root)
        .into_iter()
        .filter(|f| is_kustomization(f))
        .collect();
    assert!(
        kustomizations.len() >= 3,
        "expected the install and the kubeadm and k3s overlays: {kustomizations:?}"
    );
    for file in &kustomizations {
        let dir = file.parent().expect("file in a directory");
        let text = fs::read_to_string(file).expect("read kustomization");
        let doc: Value = serde_saphyr::from_str(&text).expect("kustomization is YAML");
        assert_eq!(doc["kind"], "Kustomization", "{}", file.display());
        assert_eq!(
            doc["apiVersion"],
            "kustomize.config.k8s.io/v1beta1",
            "{}",
            file.display()
        );
        let resources = doc["resources"]
            .as_array()
            .unwrap_or_else(|| panic!("{}: no resources", file.display()));
        for entry in resources {
            let entry = entry.as_str().expect("resource entries are strings");
            let path = dir.join(entry);
            assert!(
                path.exists(),
                "{}: resource {entry} does not exist",
                file.display()
            );
            if path.is_dir() {
                assert!(
                    path.join("kustomization.yaml").exists(),
                    "{}: resource directory {entry} has no kustomization.yaml",
                    file.display()
                );
            }
        }
        for patch in doc["patches"].as_array().into_iter().flatten() {
            if let Some(entry) = patch["path"].as_str() {
                assert!(
                    dir.join(entry).exists(),
                    "{}: patch {entry} does not exist",
                    file.display()
                );
            }
        }
    }
    // The install lists every manifest next to it (a new file is not forgotten).
    let text = fs::read_to_string(root.join("kustomization.yaml")).expect("read");
    let doc: Value = serde_saphyr::from_str(&text).expect("YAML");
    let listed: BTreeSet<&str> = doc["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for entry in fs::read_dir(&root).expect("read manifests/") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        if path.is_file() && name.ends_with(".yaml") && !is_kustomization(&path) {
            assert!(
                listed.contains(name.as_str()),
                "kustomization.yaml does not list {name}"
            );
        }
    }
}

fn load<T: DeserializeOwned>(file: &str) -> T {
    let path = manifests_dir().join(file);
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

#[test]
fn cluster_role_grants_exactly_what_the_agent_watches() {
    let role: ClusterRole = load("clusterrole.yaml");
    let mut granted = BTreeSet::new();
    for rule in role.rules.expect("rules") {
        assert!(rule.resource_names.is_none(), "no resourceNames expected");
        assert!(
            rule.non_resource_urls.is_none(),
            "no nonResourceURLs expected"
        );
        for group in rule.api_groups.expect("apiGroups") {
            for resource in rule.resources.as_deref().expect("resources") {
                for verb in &rule.verbs {
                    granted.insert((group.clone(), resource.clone(), verb.clone()));
                }
            }
        }
    }
    let wanted: BTreeSet<(String, String, String)> =
        proxy_user::source::cluster::watched_resources()
            .into_iter()
            .flat_map(|(group, resource)| {
                proxy_user::source::cluster::WATCH_VERBS
                    .iter()
                    .map(move |verb| (group.to_owned(), resource.to_owned(), (*verb).to_owned()))
            })
            .collect();
    assert_eq!(granted, wanted);

    let binding: ClusterRoleBinding = load("clusterrolebinding.yaml");
    let account: ServiceAccount = load("serviceaccount.yaml");
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    assert_eq!(Some(&binding.role_ref.name), role.metadata.name.as_ref());
    let subjects = binding.subjects.expect("subjects");
    assert!(subjects.iter().any(|s| s.kind == "ServiceAccount"
        && Some(&s.name) == account.metadata.name.as_ref()
        && s.namespace == account.metadata.namespace));
}

/// The agent container of the DaemonSet (the one that runs `switchboard agent`).
fn agent_container(ds: &DaemonSet) -> &Container {
    let spec = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod spec");
    spec.containers
        .iter()
        .find(|c| {
            c.args
                .as_deref()
                .and_then(|a| a.first())
                .map(String::as_str)
                == Some("agent")
        })
        .expect("a container with args `agent …`")
}

/// The value following `flag` in the agent's arguments.
fn arg_value<'a>(container: &'a Container, flag: &str) -> Option<&'a str> {
    let args = container.args.as_deref()?;
    let index = args.iter().position(|a| a == flag)?;
    args.get(index + 1).map(String::as_str)
}

#[test]
fn daemonset_runs_without_kube_proxy_and_with_least_privilege() {
    let ds: DaemonSet = load("daemonset.yaml");
    let config: ConfigMap = load("configmap.yaml");
    let config_data = config.data.clone().expect("ConfigMap data");
    let pod = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod spec");
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(
        pod.service_account_name.as_deref(),
        Some("switchboard"),
        "runs as the ServiceAccount the ClusterRoleBinding names"
    );

    // DNS must not go through a ClusterIP (absent means ClusterFirst).
    let dns = pod.dns_policy.as_deref().expect("dnsPolicy set");
    assert!(!dns.starts_with("ClusterFirst"), "dnsPolicy {dns}");
    assert_eq!(
        pod.node_selector
            .as_ref()
            .and_then(|s| s.get("kubernetes.io/os"))
            .map(String::as_str),
        Some("linux")
    );
    assert!(
        pod.tolerations.as_ref().is_some_and(|t| t
            .iter()
            .any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none())),
        "tolerates every taint, as kube-proxy does"
    );
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );

    let agent = agent_container(&ds);

    // Probes on kube-proxy's health port, which the agent serves there.
    let probe_of = |probe: Option<&k8s_openapi::api::core::v1::Probe>| {
        let get = probe
            .and_then(|p| p.http_get.as_ref())
            .expect("httpGet probe");
        (get.path.clone(), get.port.clone())
    };
    assert_eq!(
        probe_of(agent.liveness_probe.as_ref()),
        (Some("/livez".to_owned()), IntOrString::Int(10256))
    );
    assert_eq!(
        probe_of(agent.readiness_probe.as_ref()),
        (Some("/healthz".to_owned()), IntOrString::Int(10256))
    );
    let healthz = arg_value(agent, "--healthz-bind-address").unwrap_or("0.0.0.0:10256");
    assert!(
        healthz.ends_with(":10256") && !healthz.starts_with("127."),
        "{healthz}"
    );

    // The API server address comes from the ConfigMap, under the names the
    // in-cluster configuration reads.
    let env = agent.env.as_deref().expect("env");
    for var in ["KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"] {
        let entry = env
            .iter()
            .find(|e| e.name == var)
            .unwrap_or_else(|| panic!("no {var}"));
        let key = entry
            .value_from
            .as_ref()
            .and_then(|v| v.config_map_key_ref.as_ref())
            .unwrap_or_else(|| panic!("{var} not from a ConfigMap"));
        assert_eq!(Some(&key.name), config.metadata.name.as_ref(), "{var}");
        assert_eq!(key.key, var);
        assert!(key.optional != Some(true), "{var} must not be optional");
        assert!(
            config_data.get(var).is_some_and(|v| !v.is_empty()),
            "configmap.yaml has no {var}"
        );
    }
    // Every ConfigMap key the DaemonSet reads exists.
    for entry in env {
        if let Some(key) = entry
            .value_from
            .as_ref()
            .and_then(|v| v.config_map_key_ref.as_ref())
        {
            assert!(
                config_data.contains_key(&key.key),
                "ConfigMap lacks key {}",
                key.key
            );
        }
    }

    // Least privilege: not privileged, every capability dropped but the
    // ones the comments in daemonset.yaml justify.
    let security = agent.security_context.as_ref().expect("securityContext");
    assert_ne!(
        security.privileged,
        Some(true),
        "the agent container must not be privileged"
    );
    assert_eq!(security.allow_privilege_escalation, Some(false));
    let caps = security.capabilities.as_ref().expect("capabilities");
    assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_owned()][..]));
    let added: BTreeSet<&str> = caps.add.iter().flatten().map(String::as_str).collect();
    assert_eq!(added, BTreeSet::from(["BPF", "NET_ADMIN", "PERFMON"]));

    // Volumes: the host's bpffs, the host's cgroup2 and the status directory.
    let volumes = pod.volumes.as_deref().expect("volumes");
    let host_path_of = |name: &str| {
        volumes
            .iter()
            .find(|v| v.name == name)
            .and_then(|v| v.host_path.as_ref())
            .map(|h| h.path.clone())
    };
    let mounts = agent.volume_mounts.as_deref().expect("volumeMounts");
    let mount_at = |path: &str| {
        mounts
            .iter()
            .find(|m| m.mount_path == path)
            .unwrap_or_else(|| panic!("the agent mounts nothing at {path}"))
    };
    let bpffs = mount_at("/sys/fs/bpf");
    assert_eq!(host_path_of(&bpffs.name).as_deref(), Some("/sys/fs/bpf"));
    assert_eq!(bpffs.mount_propagation.as_deref(), Some("HostToContainer"));
    let pin_root = config_data.get("pin-root").expect("pin-root");
    assert!(pin_root.starts_with("/sys/fs/bpf/"), "{pin_root}");
    assert_eq!(arg_value(agent, "--pin-root"), Some("$(PIN_ROOT)"));

    let cgroup_root = arg_value(agent, "--cgroup-root").expect("--cgroup-root");
    let cgroup = mount_at(cgroup_root);
    assert!(
        matches!(
            host_path_of(&cgroup.name).as_deref(),
            Some("/sys/fs/cgroup" | "/sys/fs/cgroup/unified")
        ),
        "--cgroup-root {cgroup_root} is not the host's cgroup2 hierarchy"
    );

    let run = mount_at("/run/switchboard");
    assert_eq!(host_path_of(&run.name).as_deref(), Some("/run/switchboard"));
    assert!(
        Path::new(proxy_user::observe::status::STATUS_DIR).starts_with("/run/switchboard"),
        "the status directory moved out of the mounted /run/switchboard"
    );

    // Every mount of every container names a volume.
    let names: BTreeSet<&str> = volumes.iter().map(|v| v.name.as_str()).collect();
    let init = pod.init_containers.as_deref().unwrap_or_default();
    for container in pod.containers.iter().chain(init) {
        for mount in container.volume_mounts.iter().flatten() {
            assert!(
                names.contains(mount.name.as_str()),
                "{}: no volume {}",
                container.name,
                mount.name
            );
        }
        assert_eq!(
            container.image, agent.image,
            "one image for every container"
        );
    }

    // The bpffs init step: mounts bpffs on the host's /sys/fs/bpf when missing,
    // with propagation back to the host.
    let mount_bpffs = init
        .iter()
        .find(|c| {
            c.command
                .iter()
                .flatten()
                .any(|a| a.contains("mount -t bpf"))
        })
        .expect("an init container mounting bpffs");
    let init_mount = mount_bpffs
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == "/sys/fs/bpf")
        .expect("init container mounts /sys/fs/bpf");
    assert_eq!(
        host_path_of(&init_mount.name).as_deref(),
        Some("/sys/fs/bpf")
    );
    assert_eq!(
        init_mount.mount_propagation.as_deref(),
        Some("Bidirectional")
    );
    assert_eq!(
        mount_bpffs
            .security_context
            .as_ref()
            .and_then(|s| s.privileged),
        Some(true),
        "Bidirectional propagation is allowed only in privileged containers"
    );
}

/// The example overlays set both API server keys of the base ConfigMap.
#[test]
fn example_overlays_set_the_api_server_address() {
    let base: ConfigMap = load("configmap.yaml");
    for overlay in [
        "examples/kubeadm/api-server.yaml",
        "examples/k3s/api-server.yaml",
    ] {
        let patch: ConfigMap = load(overlay);
        assert_eq!(patch.metadata.name, base.metadata.name, "{overlay}");
        assert_eq!(
            patch.metadata.namespace, base.metadata.namespace,
            "{overlay}"
        );
        let data = patch.data.expect("data");
        let host = data.get("KUBERNETES_SERVICE_HOST").expect("host");
        assert!(
            host.parse::<std::net::IpAddr>().is_ok(),
            "{overlay}: {host}"
        );
        let port = data.get("KUBERNETES_SERVICE_PORT").expect("port");
        assert!(port.parse::<u16>().is_ok(), "{overlay}: {port}");
    }
}
