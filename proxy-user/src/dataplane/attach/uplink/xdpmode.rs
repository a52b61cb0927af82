//! Where an uplink's XDP program runs: `--xdp-mode` resolved per uplink
//! from what the link is (see [`resolve_xdp_mode`]).

/// How the uplink program runs (`--xdp-mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum XdpMode {
    /// Per uplink, what works there (see [`resolve_xdp_mode`]): native XDP on
    /// a physical NIC whose driver takes it, tc only elsewhere (veth, other
    /// virtual devices, drivers without native XDP).
    Auto,
    /// In the driver, before the kernel allocates the packet (veth included).
    Native,
    /// In the kernel's generic hook, for drivers without XDP support.
    Generic,
    /// No XDP: the same logic as a tc ingress program.
    Off,
}

/// The hook an uplink's XDP program ends up in, [`XdpMode`] resolved for
/// that uplink (`Off`: no XDP program, tc only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpHook {
    Native,
    Generic,
    Off,
}

impl XdpHook {
    pub const ALL: [XdpHook; 3] = [XdpHook::Native, XdpHook::Generic, XdpHook::Off];

    /// `native`, `generic` or `off`, as `--xdp-mode` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            XdpHook::Native => "native",
            XdpHook::Generic => "generic",
            XdpHook::Off => "off",
        }
    }
}

impl std::fmt::Display for XdpHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What [`resolve_xdp_mode`] needs to know of an uplink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkFacts<'a> {
    /// The link's kind (`IFLA_INFO_KIND`: `veth`, `bridge`, `vxlan`, `bond`,
    /// ...); `None` for a physical NIC (its driver has no rtnetlink link type).
    pub kind: Option<&'a str>,
    /// A native XDP attach was tried on it and refused.
    pub native_refused: bool,
}

/// [`resolve_xdp_mode`]'s answer for one uplink.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XdpChoice {
    pub hook: XdpHook,
    /// Why, for the log and `switchboard status`.
    pub reason: String,
    /// What an operator should hear about an explicit mode that is likely to
    /// lose or corrupt traffic here (logged as a warning).
    pub warning: Option<String>,
}

/// Why tc alone serves a veth uplink best.
const VETH_REASON: &str = "veth uplink: tc only (native XDP loses the frames it sends back out \
     with XDP_TX unless the veth's peer runs an XDP program or GRO, and frames from local \
     senders with checksum offload carry partial checksums the XDP program cannot update; \
     generic XDP would only copy every packet before the same work)";

/// Link kinds whose frames come off a wire, so complete checksums, and whose
/// drivers may run XDP natively: a physical NIC (no kind) and a bond of them.
fn wire_kind(kind: Option<&str>) -> bool {
    matches!(kind, None | Some("bond"))
}

/// Decides where an uplink's XDP program runs for `requested`:
///
/// - `auto` on a veth: tc only (see [`VETH_REASON`]; kind nodes are
///   containers with veth uplinks);
/// - `auto` on another virtual device (bridge, vxlan, macvlan, tun, ...):
///   tc only. Most have no native XDP, and their frames may come from local
///   senders with partial checksums, which the XDP program (incremental
///   updates of a complete checksum) would rewrite wrongly, in generic mode
///   too; the tc program updates through the kernel's helpers, which handle
///   `CHECKSUM_PARTIAL`. Generic XDP would add nothing over tc but a copy;
/// - `auto` on a physical NIC or a bond: native; if the driver refuses it,
///   tc only (again: generic XDP runs after the kernel allocated the packet,
///   as tc does, and linearises it first);
/// - `native`, `generic`, `off`: as asked. Native on a veth is allowed (the
///   operator may have given the peer an XDP program) with a warning, as is
///   XDP on any other virtual device; native refused by the driver falls
///   back to generic.
pub fn resolve_xdp_mode(requested: XdpMode, facts: &LinkFacts<'_>) -> XdpChoice {
    let kind = facts.kind;
    let choice = |hook, reason: String| XdpChoice {
        hook,
        reason,
        warning: None,
    };
    match requested {
        XdpMode::Auto => match kind {
            Some("veth") => choice(XdpHook::Off, format!("auto: {VETH_REASON}")),
            Some(other) if !wire_kind(kind) => choice(
                XdpHook::Off,
                format!(
                    "auto: virtual uplink ({other}): tc only (no native XDP here, and frames from \
                     local senders may carry partial checksums that only tc's helpers update right)"
                ),
            ),
            _ if facts.native_refused => choice(
                XdpHook::Off,
                "auto: the driver refused native XDP: tc only (generic XDP adds nothing over tc)"
                    .to_owned(),
            ),
            _ => choice(XdpHook::Native, "auto: native XDP in the driver".to_owned()),
        },
        XdpMode::Native | XdpMode::Generic => {
            let (hook, reason) = match requested {
                XdpMode::Native if facts.native_refused => (
                    XdpHook::Generic,
                    "--xdp-mode native refused by the driver: generic XDP".to_owned(),
                ),
                XdpMode::Native => (XdpHook::Native, "--xdp-mode native".to_owned()),
                _ => (XdpHook::Generic, "--xdp-mode generic".to_owned()),
            };
            let warning = match kind {
                Some("veth") if hook == XdpHook::Native => Some(
                    "native XDP on a veth uplink: frames sent back out with XDP_TX (to backends on \
                     other nodes, and their replies) are lost unless the veth's peer runs an XDP \
                     program or has GRO on, and frames from local senders with checksum offload \
                     carry partial checksums the XDP program rewrites wrongly. Unless the peer is \
                     set up for it and senders write complete checksums, use --xdp-mode auto \
                     (tc only on veth) or off"
                        .to_owned(),
                ),
                Some(other) if !wire_kind(kind) => Some(format!(
                    "{hook} XDP on a virtual uplink ({other}): frames from local senders with \
                     checksum offload carry partial checksums the XDP program rewrites wrongly; \
                     use --xdp-mode auto (tc only here) or off unless every sender writes \
                     complete checksums"
                )),
                _ => None,
            };
            XdpChoice {
                hook,
                reason,
                warning,
            }
        }
        XdpMode::Off => choice(XdpHook::Off, "--xdp-mode off".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xdp_modes_resolve_per_uplink() {
        /// Asked, link kind, native refused → hook, start of the reason,
        /// whether a warning is given.
        type Case = (
            XdpMode,
            Option<&'static str>,
            bool,
            XdpHook,
            &'static str,
            bool,
        );
        use XdpHook::{Generic as G, Native as N, Off as O};
        use XdpMode::{Auto, Generic, Native, Off};
        let table: &[Case] = &[
            (Auto, Some("veth"), false, O, "auto: veth uplink", false),
            (
                Auto,
                Some("bridge"),
                false,
                O,
                "auto: virtual uplink (bridge)",
                false,
            ),
            (
                Auto,
                Some("vxlan"),
                false,
                O,
                "auto: virtual uplink (vxlan)",
                false,
            ),
            (
                Auto,
                Some("macvlan"),
                false,
                O,
                "auto: virtual uplink (macvlan)",
                false,
            ),
            (Auto, None, false, N, "auto: native", false),
            (Auto, Some("bond"), false, N, "auto: native", false),
            (
                Auto,
                None,
                true,
                O,
                "auto: the driver refused native XDP",
                false,
            ),
            (
                Auto,
                Some("bond"),
                true,
                O,
                "auto: the driver refused native XDP",
                false,
            ),
            (Native, Some("veth"), false, N, "--xdp-mode native", true),
            (
                Native,
                Some("bridge"),
                true,
                G,
                "--xdp-mode native refused",
                true,
            ),
            (Native, None, false, N, "--xdp-mode native", false),
            (Native, None, true, G, "--xdp-mode native refused", false),
            (Generic, None, false, G, "--xdp-mode generic", false),
            (Generic, Some("veth"), false, G, "--xdp-mode generic", true),
            (Generic, Some("vxlan"), false, G, "--xdp-mode generic", true),
            (Off, Some("veth"), false, O, "--xdp-mode off", false),
            (Off, None, false, O, "--xdp-mode off", false),
        ];
        for &(asked, kind, native_refused, hook, reason, warned) in table {
            let facts = LinkFacts {
                kind,
                native_refused,
            };
            let got = resolve_xdp_mode(asked, &facts);
            let case = format!("{asked:?} on {kind:?} (native refused: {native_refused})");
            assert_eq!(got.hook, hook, "{case}: {got:?}");
            assert!(got.reason.starts_with(reason), "{case}: {got:?}");
            assert_eq!(got.warning.is_some(), warned, "{case}: {got:?}");
        }
    }

    #[test]
    fn the_veth_warning_names_the_problem_and_the_fix() {
        let facts = LinkFacts {
            kind: Some("veth"),
            native_refused: false,
        };
        let warning = resolve_xdp_mode(XdpMode::Native, &facts)
            .warning
            .expect("a warning");
        for words in ["XDP_TX", "peer", "partial checksums", "--xdp-mode auto"] {
            assert!(warning.contains(words), "{words:?} missing: {warning}");
        }
        let reason = resolve_xdp_mode(XdpMode::Auto, &facts).reason;
        for words in ["tc only", "XDP_TX", "partial checksums", "generic"] {
            assert!(reason.contains(words), "{words:?} missing: {reason}");
        }
    }
}
