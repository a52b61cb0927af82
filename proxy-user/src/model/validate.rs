//! Which versions of an object the model can use at all.
//!
//! An object-level error is a field the API server's validation would refuse
//! (so a cluster never delivers it, but a hand-edited manifest can): the
//! version as a whole cannot be used, and the model keeps the last version of
//! that object it could use (its last good state), or programs nothing of it
//! when it has none. The errors, named by field:
//!
//! * Service: no `metadata.name`; no `spec`; an unknown `spec.type`; no
//!   cluster IP (`spec.clusterIP` deleted or empty; `None` is headless, not an
//!   error); a cluster IP or external IP that is not an IP address; cluster
//!   IPs and IP families that disagree (more than two cluster IPs or
//!   families, two of one family, a cluster IP whose family is not the
//!   `ipFamilies` entry at its index, an unknown family or `ipFamilyPolicy`,
//!   two families or cluster IPs under `SingleStack`); a
//!   `spec.ports[].port` or `nodePort` outside 1..=65535; a protocol other
//!   than TCP, UDP or SCTP.
//! * EndpointSlice: no `addressType` (or an unknown one); a
//!   `ports[].port` outside 1..=65535; a protocol other than TCP, UDP or SCTP.
//!
//! Legitimate changes, applied as they come: ExternalName, headless
//! (`clusterIP: None`, the headless label), another proxy's label, a deletion
//! (which also forgets the last good version), a slice with no endpoints, a
//! Service with no ports, SCTP (valid Kubernetes, unsupported here: that port
//! alone is skipped and reported).
//!
//! Problems confined to one part of a usable object skip only that part and
//! are reported by the rules that meet them: an endpoint without addresses or
//! with an address not of the slice's `addressType` (one endpoint), a slice
//! port without a
//! number (its endpoints for that port), a load-balancer ingress IP that does
//! not parse (that address: it is status, written by a controller), an
//! unknown `switchboard.io/lb-algorithm` or an out-of-range affinity timeout
//! (the default is used).
//!
//! An object handed to another proxy is never judged: it is not ours.

use super::{
    parse_ip, IpFamily, IpFamilyPolicy, ModelWarning, Raw, ServiceInfo, ServiceSpecInfo, SliceInfo,
};

/// Why a version cannot be used: `field: problem`, one per bad field.
pub(super) fn service_problems(svc: &ServiceInfo) -> Vec<String> {
    let mut problems = Vec::new();
    if svc.key.name.is_empty() {
        problems.push("metadata.name: missing".to_owned());
    }
    let Some(spec) = &svc.spec else {
        problems.push("spec: missing".to_owned());
        return problems;
    };
    match spec.type_.as_deref() {
        None | Some("ClusterIP" | "NodePort" | "LoadBalancer") => {}
        Some("ExternalName") => return problems,
        Some(other) => {
            problems.push(format!(
                "spec.type: {other:?} is not ClusterIP, NodePort, LoadBalancer or ExternalName"
            ));
            return problems;
        }
    }
    if spec.cluster_ips.iter().any(|ip| ip == "None") {
        return problems; // headless: nothing to program, nothing to judge
    }
    if spec.cluster_ips.iter().all(|ip| ip.is_empty()) {
        problems.push(
            "spec.clusterIP: missing (a manifest directory has no IP allocator: set spec.clusterIP)"
                .to_owned(),
        );
    }
    let single = spec.cluster_ips.len() == 1;
    for (i, raw) in spec.cluster_ips.iter().enumerate() {
        if !raw.is_empty() && parse_ip(raw).is_none() {
            let field = if single {
                "spec.clusterIP".to_owned()
            } else {
                format!("spec.clusterIPs[{i}]")
            };
            problems.push(format!("{field}: {raw:?} is not an IP address"));
        }
    }
    family_problems(spec, &mut problems);
    for (i, raw) in spec.external_ips().iter().enumerate() {
        if parse_ip(raw).is_none() {
            problems.push(format!(
                "spec.externalIPs[{i}]: {raw:?} is not an IP address"
            ));
        }
    }
    for (i, p) in spec.ports.iter().enumerate() {
        if !valid_port(p.port) {
            problems.push(format!(
                "spec.ports[{i}].port: {} is not a valid port",
                p.port
            ));
        }
        if let Some(np) = p.node_port {
            if !valid_port(np) {
                problems.push(format!(
                    "spec.ports[{i}].nodePort: {np} is not a valid port"
                ));
            }
        }
        if let Some(problem) = protocol_problem(p.protocol.as_deref()) {
            problems.push(format!("spec.ports[{i}].protocol: {problem}"));
        }
    }
    problems
}

/// Cluster IPs against `ipFamilies` and `ipFamilyPolicy`, as the API server
/// checks them (it would refuse such a Service).
fn family_problems(spec: &ServiceSpecInfo, problems: &mut Vec<String>) {
    let mut families: Vec<IpFamily> = Vec::new();
    for (i, raw) in spec.ip_families.iter().enumerate() {
        match raw {
            Raw::Known(f) if families.contains(f) => {
                problems.push(format!("spec.ipFamilies[{i}]: {f} is listed twice"));
            }
            Raw::Known(f) => families.push(*f),
            Raw::Other(other) => problems.push(format!(
                "spec.ipFamilies[{i}]: {other:?} is not IPv4 or IPv6"
            )),
        }
    }
    if spec.ip_families.len() > 2 {
        problems.push(format!(
            "spec.ipFamilies: {} families listed, at most two (one of each) are allowed",
            spec.ip_families.len()
        ));
    }
    let ips: Vec<(usize, IpFamily)> = spec
        .cluster_ips
        .iter()
        .enumerate()
        .filter_map(|(i, raw)| Some((i, IpFamily::of(parse_ip(raw)?))))
        .collect();
    if spec.cluster_ips.len() > 2 {
        problems.push(format!(
            "spec.clusterIPs: {} addresses, at most two (one of each family) are allowed",
            spec.cluster_ips.len()
        ));
    } else if let [(_, a), (_, b)] = ips.as_slice() {
        if a == b {
            problems.push(format!(
                "spec.clusterIPs: two {a} addresses; a dual-stack Service has one of each family"
            ));
        }
    }
    for &(i, family) in &ips {
        let field = if spec.cluster_ips.len() == 1 {
            "spec.clusterIP".to_owned()
        } else {
            format!("spec.clusterIPs[{i}]")
        };
        match spec.ip_families.get(i) {
            Some(Raw::Known(listed)) if *listed != family => problems.push(format!(
                "{field}: {} is {family} but spec.ipFamilies[{i}] is {listed}",
                spec.cluster_ips[i].trim()
            )),
            None if !spec.ip_families.is_empty() => problems.push(format!(
                "{field}: {} is {family}, a family spec.ipFamilies does not list",
                spec.cluster_ips[i].trim()
            )),
            _ => {}
        }
    }
    match &spec.ip_family_policy {
        None
        | Some(Raw::Known(IpFamilyPolicy::PreferDualStack | IpFamilyPolicy::RequireDualStack)) => {}
        Some(Raw::Known(IpFamilyPolicy::SingleStack)) => {
            if spec.ip_families.len() > 1 || spec.cluster_ips.len() > 1 {
                problems.push(
                    "spec.ipFamilyPolicy: SingleStack, but more than one cluster IP or IP family is given (use PreferDualStack or RequireDualStack)"
                        .to_owned(),
                );
            }
        }
        Some(Raw::Other(other)) => problems.push(format!(
            "spec.ipFamilyPolicy: {other:?} is not SingleStack, PreferDualStack or RequireDualStack"
        )),
    }
}

/// Why a slice version cannot be used (see the module's list).
pub(super) fn slice_problems(slice: &SliceInfo) -> Vec<String> {
    let mut problems = Vec::new();
    match &*slice.address_type {
        "IPv4" | "IPv6" => {}
        "FQDN" => return problems, // not ours, nothing to judge
        "" => {
            problems.push("addressType: missing".to_owned());
            return problems;
        }
        other => {
            problems.push(format!("addressType: {other:?} is not IPv4, IPv6 or FQDN"));
            return problems;
        }
    }
    for (i, p) in slice.ports.iter().enumerate() {
        if let Some(port) = p.port {
            if !valid_port(port) {
                problems.push(format!("ports[{i}].port: {port} is not a valid port"));
            }
        }
        if let Some(problem) = protocol_problem(p.protocol.as_deref()) {
            problems.push(format!("ports[{i}].protocol: {problem}"));
        }
    }
    problems
}

/// The warnings for a version that cannot be used. `held`: an earlier
/// version of the object is kept in its place.
pub(super) fn rejection_warnings(
    object: &str,
    problems: &[String],
    held: bool,
) -> Vec<ModelWarning> {
    let consequence = if held {
        "keeping the last good version"
    } else {
        "not programmed (no earlier valid version)"
    };
    problems
        .iter()
        .map(|p| ModelWarning {
            object: object.to_owned(),
            problem: format!("{p}; {consequence}"),
        })
        .collect()
}

fn valid_port(p: i32) -> bool {
    (1..=65_535).contains(&p)
}

fn protocol_problem(protocol: Option<&str>) -> Option<String> {
    match protocol {
        None | Some("TCP" | "UDP" | "SCTP") => None,
        Some(other) => Some(format!("{other:?} is not TCP, UDP or SCTP")),
    }
}
