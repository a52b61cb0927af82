//! kube-proxy-style rule sets for the same Services switchboard is given, so
//! the baselines do the work kube-proxy would make the kernel do.
//!
//! **iptables mode** follows the chain layout of kube-proxy's
//! `pkg/proxy/iptables/proxier.go` (the layout the Kubernetes docs describe for
//! the iptables proxy mode):
//! - `PREROUTING` and `OUTPUT` (nat) jump to `KUBE-SERVICES`;
//! - `KUBE-SERVICES` holds one rule per service port (`-d <clusterIP>/32 -p
//!   <proto> --dport <port>`) jumping to that port's `KUBE-SVC-<hash>` chain;
//!   these rules are matched one after another, which is why new-connection
//!   cost grows with the number of Services; the last rule sends local
//!   destinations to `KUBE-NODEPORTS`;
//! - `KUBE-SVC-<hash>`: first a masquerade mark for traffic from outside the
//!   cluster CIDR, then one rule per endpoint with `-m statistic --mode random
//!   --probability 1/(n-i)` (the last one unconditional) jumping to
//!   `KUBE-SEP-<hash>`;
//! - `KUBE-SEP-<hash>`: hairpin mark (`-s <endpoint>/32 -j KUBE-MARK-MASQ`)
//!   and `-j DNAT --to-destination <ip>:<port>`;
//! - `KUBE-MARK-MASQ` / `KUBE-POSTROUTING` with mark 0x4000 and `MASQUERADE
//!   --random-fully`; filter table `KUBE-FORWARD` (drop ctstate INVALID,
//!   accept marked and RELATED,ESTABLISHED).
//!
//! Chain names are the prefix plus 16 characters of a hash of the service port
//! (and endpoint), as kube-proxy does; kube-proxy hashes with SHA-256 and
//! base32, we use FNV-1a (the name length, hence rule size, is the same).
//!
//! **nftables mode** follows `pkg/proxy/nftables/proxier.go` (KEP-3866): one
//! table `ip kube-proxy`; base chains `nat-prerouting`/`nat-output` (dstnat)
//! jump to `services`, which does a single verdict-map lookup `ip daddr . meta
//! l4proto . th dport vmap @service-ips`; each service port has a chain
//! `service-<hash>-<ns>/<name>/<proto>/<port>` with the masquerade check and
//! `numgen random mod N vmap { 0 : goto endpoint-…, … }`; each endpoint chain
//! `endpoint-<hash>-…__<ip>/<port>` marks hairpin traffic and does `meta
//! l4proto <proto> dnat to <ip>:<port>`. `nat-postrouting` jumps to
//! `masquerading`; `filter-forward` drops ct state invalid and sends new
//! connections through the (empty) `no-endpoint-services` verdict map check.
//! Lookups are O(1) in the number of Services, which is what this mode buys.

use std::fmt::Write as _;

use super::workload::{Svc, CLUSTER_CIDR};

/// iptables-restore's filter table (kube-proxy's `KUBE-FORWARD`), then the
/// start of the nat table.
const IPTABLES_FILTER: &str = "*filter\n:KUBE-FORWARD - [0:0]\n\
-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n\
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n\
-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark 0x4000/0x4000 -j ACCEPT\n\
-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n\
COMMIT\n*nat\n";

/// The nat table's hooks into kube-proxy's chains, and the masquerade mark.
const IPTABLES_NAT_BASE: &str = "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n\
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n\
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000\n\
-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n";

/// The start of table `ip kube-proxy`: the masquerade chains and the base
/// chains on the nat hooks.
const NFT_BASE: &str = "table ip kube-proxy {\n\tcomment \"rules for kube-proxy\"\n\
\tchain mark-for-masquerade {\n\t\tmeta mark set meta mark | 0x4000\n\t}\n\
\tchain masquerading {\n\t\tmeta mark & 0x4000 == 0 return\n\t\tmeta mark set meta mark ^ 0x4000\n\t\tmasquerade fully-random\n\t}\n\
\tchain nat-prerouting {\n\t\ttype nat hook prerouting priority -100; policy accept;\n\t\tjump services\n\t}\n\
\tchain nat-output {\n\t\ttype nat hook output priority -100; policy accept;\n\t\tjump services\n\t}\n\
\tchain nat-postrouting {\n\t\ttype nat hook postrouting priority 100; policy accept;\n\t\tjump masquerading\n\t}\n";

/// FNV-1a, 64 bits.
fn fnv(data: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// 16 base32 characters (A–Z, 2–7) of a hash of `data`.
pub(super) fn hash16(data: &str) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let (a, b) = (fnv(data), fnv(&format!("{data}#")));
    let mut out = String::with_capacity(16);
    for i in 0..16 {
        let word = if i < 12 {
            a >> (i * 5)
        } else {
            b >> ((i - 12) * 5)
        };
        out.push(ALPHABET[(word & 31) as usize] as char);
    }
    out
}

fn port_id(svc: &Svc, port: &super::workload::Port) -> String {
    format!("{}/{}:{}", svc.namespace, svc.name, port.name)
}

/// iptables-restore input (nat and filter tables) for `services`.
pub fn iptables(services: &[Svc]) -> String {
    let mut chains = String::new();
    let mut rules = String::new();
    let mut svc_rules = String::new();
    let _ = writeln!(chains, ":KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-POSTROUTING - [0:0]\n:KUBE-MARK-MASQ - [0:0]");
    for svc in services {
        for port in &svc.ports {
            let id = port_id(svc, port);
            let proto = port.proto.lower();
            let svc_chain = format!("KUBE-SVC-{}", hash16(&format!("{id}{proto}")));
            let _ = writeln!(chains, ":{svc_chain} - [0:0]");
            let _ = writeln!(
                svc_rules,
                "-A KUBE-SERVICES -m comment --comment \"{id} cluster IP\" -m {proto} -p {proto} -d {}/32 --dport {} -j {svc_chain}",
                svc.cluster_ip, port.port
            );
            let _ = writeln!(
                rules,
                "-A {svc_chain} -m comment --comment \"{id} cluster IP\" -m {proto} -p {proto} -d {}/32 --dport {} ! -s {CLUSTER_CIDR} -j KUBE-MARK-MASQ",
                svc.cluster_ip, port.port
            );
            let n = svc.endpoints.len();
            for (i, ep) in svc.endpoints.iter().enumerate() {
                let sep = format!(
                    "KUBE-SEP-{}",
                    hash16(&format!("{id}{proto}{ep}:{}", port.target))
                );
                let _ = writeln!(chains, ":{sep} - [0:0]");
                if i + 1 < n {
                    let probability = 1.0 / (n - i) as f64;
                    let _ = writeln!(
                        rules,
                        "-A {svc_chain} -m comment --comment \"{id} -> {ep}:{}\" -m statistic --mode random --probability {probability:.10} -j {sep}",
                        port.target
                    );
                } else {
                    let _ = writeln!(
                        rules,
                        "-A {svc_chain} -m comment --comment \"{id} -> {ep}:{}\" -j {sep}",
                        port.target
                    );
                }
                let _ = writeln!(
                    rules,
                    "-A {sep} -m comment --comment {id} -s {ep}/32 -j KUBE-MARK-MASQ"
                );
                let _ = writeln!(
                    rules,
                    "-A {sep} -m comment --comment {id} -m {proto} -p {proto} -j DNAT --to-destination {ep}:{}",
                    port.target
                );
            }
        }
    }
    let mut out = String::with_capacity(chains.len() + rules.len() + svc_rules.len() + 1024);
    out.push_str(IPTABLES_FILTER);
    out.push_str(&chains);
    out.push_str(IPTABLES_NAT_BASE);
    out.push_str(&svc_rules);
    out.push_str("-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n");
    out.push_str(&rules);
    out.push_str("COMMIT\n");
    out
}

/// An `nft -f` file that replaces table `ip kube-proxy` with the rules for
/// `services`, atomically (one transaction).
pub fn nftables(services: &[Svc]) -> String {
    let mut chains = String::new();
    let mut elements: Vec<String> = Vec::new();
    for svc in services {
        for port in &svc.ports {
            let proto = port.proto.lower();
            let id = format!("{}/{}/{proto}/{}", svc.namespace, svc.name, port.name);
            let svc_chain = format!("service-{}-{id}", &hash16(&id)[..8]);
            elements.push(format!(
                "{} . {proto} . {} : goto {svc_chain}",
                svc.cluster_ip, port.port
            ));
            let endpoints: Vec<(String, u16)> = svc
                .endpoints
                .iter()
                .map(|ep| (ep.to_string(), port.target))
                .collect();
            let at = (svc.cluster_ip, proto, port.port);
            nft_service(&mut chains, &svc_chain, &id, at, &endpoints);
        }
    }
    let mut out = String::with_capacity(chains.len() + elements.len() * 80 + 2048);
    out.push_str("add table ip kube-proxy\ndelete table ip kube-proxy\n");
    out.push_str(NFT_BASE);
    out.push_str("\tmap no-endpoint-services {\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n\t}\n");
    out.push_str("\tchain service-endpoints-check {\n\t\tip daddr . meta l4proto . th dport vmap @no-endpoint-services\n\t}\n");
    out.push_str("\tchain filter-forward {\n\t\ttype filter hook forward priority -110; policy accept;\n\t\tct state invalid drop\n\t\tct state new jump service-endpoints-check\n\t}\n");
    out.push_str("\tmap service-ips {\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n\t\tcomment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\"\n");
    if !elements.is_empty() {
        let _ = writeln!(out, "\t\telements = {{ {} }}", elements.join(",\n\t\t\t"));
    }
    out.push_str("\t}\n");
    out.push_str(
        "\tchain services {\n\t\tip daddr . meta l4proto . th dport vmap @service-ips\n\t}\n",
    );
    out.push_str(&chains);
    out.push_str("}\n");
    out
}

/// A service port's chain `svc_chain` (the masquerade check for traffic to
/// `at` = (cluster IP, protocol, port) from outside the cluster, then the
/// random choice of an endpoint) and one chain per endpoint (address,
/// target port) with its hairpin mark and `dnat`.
fn nft_service(
    chains: &mut String,
    svc_chain: &str,
    id: &str,
    at: (std::net::Ipv4Addr, &str, u16),
    endpoints: &[(String, u16)],
) {
    let (cluster_ip, proto, port) = at;
    let mut vmap = Vec::new();
    let mut ep_chains = String::new();
    for (i, (ep, target)) in endpoints.iter().enumerate() {
        let ep_id = format!("{id}__{ep}/{target}");
        let ep_chain = format!("endpoint-{}-{ep_id}", &hash16(&ep_id)[..8]);
        vmap.push(format!("{i} : goto {ep_chain}"));
        let _ = write!(
            ep_chains,
            "\tchain {ep_chain} {{\n\t\tip saddr {ep} jump mark-for-masquerade\n\t\tmeta l4proto {proto} dnat to {ep}:{target}\n\t}}\n"
        );
    }
    let _ = write!(
        chains,
        "\tchain {svc_chain} {{\n\t\tip daddr {cluster_ip} {proto} dport {port} ip saddr != {CLUSTER_CIDR} jump mark-for-masquerade\n"
    );
    if !vmap.is_empty() {
        let _ = writeln!(
            chains,
            "\t\tnumgen random mod {} vmap {{ {} }}",
            vmap.len(),
            vmap.join(", ")
        );
    }
    chains.push_str("\t}\n");
    chains.push_str(&ep_chains);
}

/// One NodePort Service port as kube-proxy sees it.
pub struct NodePortSvc {
    /// `namespace/name:port`.
    pub id: String,
    /// `tcp` or `udp`.
    pub proto: &'static str,
    pub cluster_ip: std::net::Ipv4Addr,
    pub port: u16,
    pub node_port: u16,
    /// (address, target port) of each endpoint.
    pub endpoints: Vec<(String, u16)>,
    /// Traffic from outside is masqueraded (`externalTrafficPolicy:
    /// Cluster` to backends on other nodes; left out for local backends,
    /// as switchboard keeps the client's address there, which makes the
    /// baseline cheaper, not dearer).
    pub masquerade: bool,
}

/// kube-proxy's iptables layout (`pkg/proxy/iptables/proxier.go`) for
/// NodePort Services, as a node's kube-proxy writes it: `PREROUTING` →
/// `KUBE-SERVICES` (cluster IP rules, then `--dst-type LOCAL` →
/// `KUBE-NODEPORTS`) → `KUBE-EXT-<hash>` → `KUBE-SVC-<hash>` →
/// `KUBE-SEP-<hash>` (`statistic --mode random`, DNAT), masquerade through
/// `KUBE-MARK-MASQ` and `KUBE-POSTROUTING`; filter `KUBE-FORWARD`.
pub fn nodeport_iptables(ports: &[NodePortSvc]) -> String {
    let mut chains = String::new();
    let mut services = String::new();
    let mut nodeports = String::new();
    let mut rules = String::new();
    for p in ports {
        let (id, proto, port, node_port) = (&p.id, p.proto, p.port, p.node_port);
        let svc = format!("KUBE-SVC-{}", hash16(&format!("{id}{proto}")));
        let ext = format!("KUBE-EXT-{}", hash16(&format!("{id}{proto}ext")));
        let _ = writeln!(chains, ":{svc} - [0:0]\n:{ext} - [0:0]");
        let _ = writeln!(
            services,
            "-A KUBE-SERVICES -m comment --comment \"{id} cluster IP\" -m {proto} -p {proto} -d {}/32 --dport {port} -j {svc}",
            p.cluster_ip
        );
        let _ = writeln!(
            nodeports,
            "-A KUBE-NODEPORTS -m comment --comment {id} -m {proto} -p {proto} --dport {node_port} -j {ext}"
        );
        if p.masquerade {
            let _ = writeln!(
                rules,
                "-A {ext} -m comment --comment \"masquerade traffic for {id} external destinations\" -j KUBE-MARK-MASQ"
            );
        }
        let _ = writeln!(rules, "-A {ext} -j {svc}");
        let _ = writeln!(
            rules,
            "-A {svc} -m comment --comment \"{id} cluster IP\" -m {proto} -p {proto} -d {}/32 --dport {port} ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ",
            p.cluster_ip
        );
        for (i, (ep, target)) in p.endpoints.iter().enumerate() {
            let sep = format!("KUBE-SEP-{}", hash16(&format!("{id}{proto}{ep}:{target}")));
            let _ = writeln!(chains, ":{sep} - [0:0]");
            if i + 1 < p.endpoints.len() {
                let _ = writeln!(
                    rules,
                    "-A {svc} -m comment --comment \"{id} -> {ep}:{target}\" -m statistic --mode random --probability {:.10} -j {sep}",
                    1.0 / (p.endpoints.len() - i) as f64
                );
            } else {
                let _ = writeln!(
                    rules,
                    "-A {svc} -m comment --comment \"{id} -> {ep}:{target}\" -j {sep}"
                );
            }
            let _ = writeln!(
                rules,
                "-A {sep} -m comment --comment {id} -s {ep}/32 -j KUBE-MARK-MASQ"
            );
            let _ = writeln!(
                rules,
                "-A {sep} -m comment --comment {id} -m {proto} -p {proto} -j DNAT --to-destination {ep}:{target}"
            );
        }
    }
    let mut out = String::new();
    out.push_str(IPTABLES_FILTER);
    out.push_str(":KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-POSTROUTING - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n");
    out.push_str(&chains);
    out.push_str(IPTABLES_NAT_BASE);
    out.push_str(&services);
    out.push_str("-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n");
    out.push_str(&nodeports);
    out.push_str(&rules);
    out.push_str("COMMIT\n");
    out
}

/// kube-proxy's nftables layout (`pkg/proxy/nftables/proxier.go`) for
/// NodePort Services: `services` looks the cluster IP up in `service-ips`,
/// then a local destination's protocol and port in `service-nodeports`,
/// which goes to `external-<hash>-…` (the masquerade mark where due) and on
/// to the service chain's `numgen random` endpoint choice, each endpoint
/// chain a `dnat`. The table is replaced in one transaction.
pub fn nodeport_nftables(ports: &[NodePortSvc]) -> String {
    let mut chains = String::new();
    let mut service_ips = Vec::new();
    let mut nodeports = Vec::new();
    for p in ports {
        let proto = p.proto;
        let id = format!("{}/{proto}/{}", p.id.replace(':', "/"), p.port);
        let svc_chain = format!("service-{}-{id}", &hash16(&id)[..8]);
        let ext_chain = format!("external-{}-{id}", &hash16(&format!("{id}ext"))[..8]);
        service_ips.push(format!(
            "{} . {proto} . {} : goto {svc_chain}",
            p.cluster_ip, p.port
        ));
        nodeports.push(format!("{proto} . {} : goto {ext_chain}", p.node_port));
        let _ = writeln!(chains, "\tchain {ext_chain} {{");
        if p.masquerade {
            chains.push_str("\t\tjump mark-for-masquerade\n");
        }
        let _ = write!(chains, "\t\tgoto {svc_chain}\n\t}}\n");
        let at = (p.cluster_ip, proto, p.port);
        nft_service(&mut chains, &svc_chain, &id, at, &p.endpoints);
    }
    let mut out = String::from("add table ip kube-proxy\ndelete table ip kube-proxy\n");
    out.push_str(NFT_BASE);
    out.push_str("\tchain filter-forward {\n\t\ttype filter hook forward priority -110; policy accept;\n\t\tct state invalid drop\n\t}\n");
    let _ = write!(
        out,
        "\tmap service-ips {{\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n\t\telements = {{ {} }}\n\t}}\n",
        service_ips.join(", ")
    );
    let _ = write!(
        out,
        "\tmap service-nodeports {{\n\t\ttype inet_proto . inet_service : verdict\n\t\telements = {{ {} }}\n\t}}\n",
        nodeports.join(", ")
    );
    out.push_str("\tchain services {\n\t\tip daddr . meta l4proto . th dport vmap @service-ips\n\t\tfib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports\n\t}\n");
    out.push_str(&chains);
    out.push_str("}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::super::workload::services;
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn iptables_layout_matches_kube_proxy() {
        let pods = [
            Ipv4Addr::new(10, 244, 1, 2),
            Ipv4Addr::new(10, 244, 2, 2),
            Ipv4Addr::new(10, 244, 3, 2),
        ];
        let rules = iptables(&services(1, &pods));
        assert!(rules.contains(
            "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"
        ));
        assert!(rules.contains("-d 10.96.0.10/32 --dport 80 -j KUBE-SVC-"));
        assert!(rules.contains("--probability 0.3333333333 -j KUBE-SEP-"));
        assert!(rules.contains("--probability 0.5000000000 -j KUBE-SEP-"));
        assert!(rules.contains("-j DNAT --to-destination 10.244.3.2:8080"));
        assert_eq!(rules.matches("COMMIT").count(), 2);
        // 3 ports x 3 endpoints: 9 endpoint chains.
        assert_eq!(
            rules
                .lines()
                .filter(|l| l.starts_with(":KUBE-SEP-"))
                .count(),
            9
        );
    }

    #[test]
    fn nftables_layout_matches_kube_proxy() {
        let pods = [Ipv4Addr::new(10, 244, 1, 2), Ipv4Addr::new(10, 244, 2, 2)];
        let text = nftables(&services(2, &pods));
        assert!(text.contains("ip daddr . meta l4proto . th dport vmap @service-ips"));
        assert!(text.contains("10.96.0.10 . tcp . 80 : goto service-"));
        assert!(text.contains("numgen random mod 2 vmap { 0 : goto endpoint-"));
        assert!(text.contains("numgen random mod 10 vmap"));
        assert!(text.contains("meta l4proto udp dnat to 10.244.2.2:5353"));
    }

    #[test]
    fn chain_names_are_stable_and_distinct() {
        assert_eq!(hash16("a"), hash16("a"));
        assert_ne!(hash16("a"), hash16("b"));
        assert_eq!(hash16("x").len(), 16);
    }
}
