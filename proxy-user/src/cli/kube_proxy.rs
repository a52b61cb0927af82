//! kube-proxy's leftovers in the current network namespace: its `KUBE-*`
//! iptables chains (iptables-nft and legacy, IPv4 and IPv6), its nftables
//! tables (`kube-proxy` in the `ip` and `ip6` families) and IPVS mode's
//! `kube-ipvs0` interface; and their removal.
//!
//! There is no maintained Rust crate for iptables, so the `iptables-save` /
//! `iptables-restore` and `nft` tools are run. A table is rewritten whole
//! with `iptables-restore`: everything but kube-proxy's chains and the jumps
//! to them is written back as it was, in one atomic replace.
use std::{
    io::Write as _,
    path::PathBuf,
    process::{Command, Stdio},
};

use serde::Serialize;

/// The tables kube-proxy writes to.
const TABLES: [&str; 3] = ["filter", "nat", "mangle"];
/// (save, restore) tool pairs, in the order they are tried.
const TOOLS: [(&str, &str); 4] = [
    ("iptables-save", "iptables-restore"),
    ("iptables-legacy-save", "iptables-legacy-restore"),
    ("ip6tables-save", "ip6tables-restore"),
    ("ip6tables-legacy-save", "ip6tables-legacy-restore"),
];
/// The families kube-proxy's nftables mode makes a `kube-proxy` table in.
const NFT_FAMILIES: [&str; 2] = ["ip", "ip6"];
pub const IPVS_INTERFACE: &str = "kube-ipvs0";

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Leftovers {
    /// `iptables-save nat: KUBE-SERVICES`.
    pub iptables_chains: Vec<String>,
    /// `ip kube-proxy`.
    pub nft_tables: Vec<String>,
    pub ipvs_interface: bool,
    /// The tools that were looked at (`iptables-save`, `nft`, ...); one
    /// that is not installed here was not checked.
    pub checked: Vec<String>,
}

/// What [`remove`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Removed {
    pub iptables_chains: Vec<String>,
    pub nft_tables: Vec<String>,
    pub errors: Vec<String>,
}

/// A tool on `PATH`, if installed.
fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// Runs `tool args`, returning its stdout when it succeeds.
fn output(tool: &PathBuf, args: &[&str]) -> Option<String> {
    let out = Command::new(tool)
        .args(args)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The `KUBE-*` chains an `iptables-save` dump declares.
pub fn kube_chains(dump: &str) -> Vec<String> {
    dump.lines()
        .filter_map(|l| l.strip_prefix(':'))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| c.starts_with("KUBE-"))
        .map(str::to_owned)
        .collect()
}

/// The dump without kube-proxy's chains, their rules and the jumps to
/// them; `None` when it has none of them.
pub fn without_kube(dump: &str) -> Option<String> {
    if kube_chains(dump).is_empty() {
        return None;
    }
    let kube_rule = |line: &str| {
        let words: Vec<&str> = line.split_whitespace().collect();
        let in_kube_chain =
            words.first() == Some(&"-A") && words.get(1).is_some_and(|c| c.starts_with("KUBE-"));
        let jumps = words.windows(2).any(|w| {
            matches!(w[0], "-j" | "-g" | "--jump" | "--goto") && w[1].starts_with("KUBE-")
        });
        in_kube_chain || jumps
    };
    let kept: Vec<&str> = dump
        .lines()
        .filter(|l| !(l.starts_with(":KUBE-") || kube_rule(l)))
        .collect();
    Some(kept.join("\n") + "\n")
}

/// The `kube-proxy` tables `nft list tables` lists.
pub fn kube_nft_tables(listing: &str) -> Vec<String> {
    listing
        .lines()
        .filter_map(|l| l.trim().strip_prefix("table "))
        .filter_map(|rest| {
            let mut words = rest.split_whitespace();
            let (family, name) = (words.next()?, words.next()?);
            (name == "kube-proxy" && NFT_FAMILIES.contains(&family))
                .then(|| format!("{family} {name}"))
        })
        .collect()
}

/// Finds kube-proxy's leftovers (`interfaces`: this namespace's names).
pub fn find(interfaces: &[String]) -> Leftovers {
    let mut found = Leftovers {
        ipvs_interface: interfaces.iter().any(|i| i == IPVS_INTERFACE),
        ..Leftovers::default()
    };
    for (save, _) in TOOLS {
        let Some(tool) = find_tool(save) else {
            continue;
        };
        found.checked.push((*save).to_owned());
        for table in TABLES {
            if let Some(dump) = output(&tool, &["-t", table]) {
                found.iptables_chains.extend(
                    kube_chains(&dump)
                        .into_iter()
                        .map(|c| format!("{save} {table}: {c}")),
                );
            }
        }
    }
    if let Some(nft) = find_tool("nft") {
        found.checked.push("nft".to_owned());
        if let Some(listing) = output(&nft, &["list", "tables"]) {
            found.nft_tables = kube_nft_tables(&listing);
        }
    }
    found
}

/// Removes kube-proxy's chains and tables from this network namespace.
pub fn remove() -> Removed {
    let mut removed = Removed::default();
    for (save, restore) in TOOLS {
        let (Some(save_tool), Some(restore_tool)) = (find_tool(save), find_tool(restore)) else {
            continue;
        };
        for table in TABLES {
            let Some(dump) = output(&save_tool, &["-t", table]) else {
                continue;
            };
            let Some(kept) = without_kube(&dump) else {
                continue;
            };
            match restore_table(&restore_tool, &kept) {
                Ok(()) => removed.iptables_chains.extend(
                    kube_chains(&dump)
                        .into_iter()
                        .map(|c| format!("{save} {table}: {c}")),
                ),
                Err(e) => removed.errors.push(format!("{restore} ({table}): {e}")),
            }
        }
    }
    if let Some(nft) = find_tool("nft") {
        let tables = output(&nft, &["list", "tables"])
            .map(|l| kube_nft_tables(&l))
            .unwrap_or_default();
        for table in tables {
            let mut args = vec!["delete", "table"];
            args.extend(table.split_whitespace());
            match Command::new(&nft)
                .args(&args)
                .stderr(Stdio::piped())
                .output()
            {
                Ok(out) if out.status.success() => removed.nft_tables.push(table),
                Ok(out) => removed.errors.push(format!(
                    "nft delete table {table}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                )),
                Err(e) => removed.errors.push(format!("nft: {e}")),
            }
        }
    }
    removed
}

/// Replaces one table with `rules` (an `iptables-save` dump of it).
fn restore_table(tool: &PathBuf, rules: &str) -> Result<(), String> {
    let mut child = Command::new(tool)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(rules.as_bytes())
            .map_err(|e| e.to_string())?;
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAT: &str =
        "# Generated by iptables-save\n*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
:KUBE-SERVICES - [0:0]\n:KUBE-SVC-ABC - [0:0]\n:DOCKER - [0:0]\n\
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
-A OUTPUT -j DOCKER\n-A KUBE-SERVICES -d 10.96.0.10/32 -j KUBE-SVC-ABC\nCOMMIT\n";

    #[test]
    fn kube_chains_and_the_jumps_to_them_go_the_rest_stays() {
        assert_eq!(kube_chains(NAT), ["KUBE-SERVICES", "KUBE-SVC-ABC"]);
        let kept = without_kube(NAT).expect("has kube chains");
        assert!(!kept.contains("KUBE-"), "{kept}");
        assert!(
            kept.contains(":DOCKER - [0:0]") && kept.contains("-A OUTPUT -j DOCKER"),
            "{kept}"
        );
        assert!(kept.contains("*nat") && kept.contains("COMMIT"), "{kept}");
        assert_eq!(without_kube("*nat\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n"), None);
    }

    #[test]
    fn only_kube_proxy_tables_of_ip_and_ip6_are_named() {
        let listing =
            "table ip filter\ntable ip kube-proxy\ntable ip6 kube-proxy\ntable inet kube-proxy2\n";
        assert_eq!(
            kube_nft_tables(listing),
            ["ip kube-proxy", "ip6 kube-proxy"]
        );
    }
}
