//! Permission errors, told apart by their errno (never by their text), and
//! the capabilities the agent needs, read from `/proc/self/status`
//! (`CapEff`), to name the one that is missing when the kernel says EPERM.
//! Without CAP_BPF the first error is an EPERM creating some map; without
//! CAP_NET_ADMIN, an EPERM loading a tc program; without CAP_PERFMON, a long
//! verifier log. None of them names the capability.
use std::{error::Error, io};

/// Capability numbers (linux/capability.h).
pub const CAP_NET_ADMIN: u32 = 12;
pub const CAP_SYS_ADMIN: u32 = 21;
pub const CAP_PERFMON: u32 = 38;
pub const CAP_BPF: u32 = 39;

/// A capability the agent needs, and what for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Needed {
    pub name: &'static str,
    pub bit: u32,
    pub what_for: &'static str,
}

/// What the agent needs. CAP_SYS_ADMIN stands in for CAP_BPF and
/// CAP_PERFMON (the kernel's `bpf_capable()` and `perfmon_capable()`), not
/// for CAP_NET_ADMIN.
pub const NEEDED: [Needed; 3] = [
    Needed {
        name: "CAP_BPF",
        bit: CAP_BPF,
        what_for: "creating the maps and loading programs",
    },
    Needed {
        name: "CAP_NET_ADMIN",
        bit: CAP_NET_ADMIN,
        what_for: "loading and attaching the tc and XDP programs",
    },
    Needed {
        name: "CAP_PERFMON",
        bit: CAP_PERFMON,
        what_for: "the verifier's acceptance of the programs' pointer arithmetic",
    },
];

/// Whether `error`, or any error it was caused by, is the kernel's EPERM or
/// EACCES.
pub fn permission_denied(error: &(dyn Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        let denied = |errno: Option<i32>| matches!(errno, Some(libc::EPERM | libc::EACCES));
        if let Some(io) = e.downcast_ref::<io::Error>() {
            if denied(io.raw_os_error()) || io.kind() == io::ErrorKind::PermissionDenied {
                return true;
            }
        }
        if let Some(errno) = e.downcast_ref::<nix::errno::Errno>() {
            if denied(Some(*errno as i32)) {
                return true;
            }
        }
        next = e.source();
    }
    false
}

/// The `CapEff` mask in the text of `/proc/<pid>/status`.
pub fn parse_cap_eff(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
}

/// This process's `CapEff` mask, if `/proc/self/status` reads.
pub fn own_cap_eff() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_cap_eff(&status)
}

/// Whether this process holds capability `bit` (effective).
pub fn own_has(bit: u32) -> bool {
    own_cap_eff().is_some_and(|cap_eff| cap_eff & (1u64 << bit) != 0)
}

/// The needed capabilities missing from `cap_eff`.
pub fn missing(cap_eff: u64) -> Vec<Needed> {
    let has = |bit: u32| cap_eff & (1u64 << bit) != 0;
    NEEDED
        .into_iter()
        .filter(|n| !has(n.bit))
        .filter(|n| n.bit == CAP_NET_ADMIN || !has(CAP_SYS_ADMIN))
        .collect()
}

/// What to say when the kernel refused with `cap_eff` as the effective
/// set: the missing capabilities and what each is for (`None`: none is
/// missing, the refusal has another cause).
pub fn hint(cap_eff: u64) -> Option<String> {
    let missing = missing(cap_eff);
    if missing.is_empty() {
        return None;
    }
    let list: Vec<String> = missing
        .iter()
        .map(|n| format!("{} ({})", n.name, n.what_for))
        .collect();
    Some(format!(
        "permission denied: this process lacks {}; run the agent as root, or add them to its capabilities (the DaemonSet's securityContext)",
        list.join(", ")
    ))
}

/// `error` with the missing capabilities named on top, when it is a
/// permission error and some are missing.
pub fn name_missing(error: anyhow::Error) -> anyhow::Error {
    if !error.chain().any(permission_denied) {
        return error;
    }
    match own_cap_eff().and_then(hint) {
        Some(hint) => error.context(hint),
        None => error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: u64 = 0x0000_01ff_ffff_ffff;

    fn without(bits: &[u32]) -> u64 {
        bits.iter().fold(ALL, |mask, bit| mask & !(1u64 << bit))
    }

    #[test]
    fn cap_eff_is_read_from_proc_status() {
        let status = "Name:\tswitchboard\nCapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\nCapEff:\t000000c000001000\nCapBnd:\t000001ffffffffff\n";
        let eff = parse_cap_eff(status).expect("CapEff");
        assert_eq!(
            eff,
            (1 << CAP_BPF) | (1 << CAP_PERFMON) | (1 << CAP_NET_ADMIN)
        );
        assert_eq!(parse_cap_eff("Name:\tx\n"), None);
        assert_eq!(parse_cap_eff("CapEff:\tzz\n"), None);
        let own = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
        assert!(parse_cap_eff(&own).is_some(), "{own}");
    }

    #[test]
    fn the_missing_capabilities_are_named_with_what_they_are_for() {
        assert_eq!(hint(ALL), None, "root lacks nothing");
        let no_bpf = hint(without(&[CAP_BPF, CAP_SYS_ADMIN])).expect("CAP_BPF");
        assert!(no_bpf.contains("CAP_BPF (creating the maps"), "{no_bpf}");
        assert!(
            !no_bpf.contains("CAP_NET_ADMIN") && !no_bpf.contains("CAP_PERFMON"),
            "{no_bpf}"
        );
        let no_net = hint(without(&[CAP_NET_ADMIN])).expect("CAP_NET_ADMIN");
        assert!(
            no_net.contains("CAP_NET_ADMIN (loading and attaching the tc and XDP programs)"),
            "{no_net}"
        );
        let no_perfmon = hint(without(&[CAP_PERFMON, CAP_SYS_ADMIN])).expect("CAP_PERFMON");
        assert!(
            no_perfmon.contains("CAP_PERFMON (the verifier's"),
            "{no_perfmon}"
        );
        // CAP_SYS_ADMIN covers CAP_BPF and CAP_PERFMON, never CAP_NET_ADMIN.
        assert_eq!(hint(without(&[CAP_BPF, CAP_PERFMON])), None);
        let names: Vec<&str> = missing(0).iter().map(|n| n.name).collect();
        assert_eq!(names, ["CAP_BPF", "CAP_NET_ADMIN", "CAP_PERFMON"]);
    }

    #[test]
    fn permission_errors_are_told_by_errno_anywhere_in_the_chain() {
        let eperm = aya::programs::ProgramError::SyscallError(aya::sys::SyscallError {
            call: "bpf_prog_get_next_id",
            io_error: io::Error::from_raw_os_error(libc::EPERM),
        });
        assert!(permission_denied(&eperm));
        let wrapped = anyhow::Error::from(eperm).context("loading the eBPF programs");
        assert!(wrapped.chain().any(permission_denied));
        // Map creation without CAP_BPF, as the loader reports it.
        let map = aya::EbpfError::MapError(aya::maps::MapError::CreateError {
            name: "SB_SCRATCH6_V1".into(),
            io_error: io::Error::from_raw_os_error(libc::EPERM),
        });
        assert!(permission_denied(&map));
        let other = io::Error::from_raw_os_error(libc::EINVAL);
        assert!(!permission_denied(&other));
        assert!(permission_denied(&nix::errno::Errno::EPERM));
        // Not a permission error: left as it is.
        let plain = anyhow::anyhow!("something else");
        assert_eq!(format!("{:#}", name_missing(plain)), "something else");
    }
}
