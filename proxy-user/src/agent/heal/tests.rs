use super::*;

fn listed(name: &str, index: u32, role: &str, hooks: &[&str]) -> AttachedInterface {
    AttachedInterface {
        name: name.into(),
        index,
        role: role.into(),
        hooks: hooks.iter().map(|h| (*h).to_owned()).collect(),
        xdp: None,
    }
}

fn actual(name: &str, index: u32, pod: bool) -> hooks::IfaceHooks {
    hooks::IfaceHooks {
        name: name.into(),
        index,
        pod,
        ..hooks::IfaceHooks::default()
    }
}

const POD: [&str; 2] = ["tcx ingress sb_from_pod", "tcx egress sb_to_pod"];

/// Desired (the agent's interfaces) against actual (the kernel's): only
/// the agent's interfaces that lack a program are drift; a pod veth the
/// agent has not attached yet (the rescan's business), an interface that
/// is gone, and one whose programs are all there (as TCX or as netlink
/// filters alike) are not. Programs that are not ours are named.
#[test]
fn only_the_agents_interfaces_missing_a_program_are_drift() {
    let listed = [
        listed("pod1", 11, "pod", &POD),
        listed("pod2", 12, "pod", &POD),
        listed("pod3", 13, "pod", &POD),
        listed("gone", 14, "pod", &POD),
        listed(
            "eth0",
            2,
            "uplink",
            &[
                "tcx ingress sb_from_uplink",
                "tcx egress sb_to_uplink",
                "xdp native sb_xdp_uplink",
            ],
        ),
    ];
    let mut pod1 = actual("pod1", 11, true);
    pod1.tcx_ingress = vec!["sb_from_pod".into(), "cilium_x".into()];
    let mut pod2 = actual("pod2", 12, true);
    pod2.tc_ingress = vec!["sb_from_pod".into()];
    pod2.tc_egress = vec!["sb_to_pod".into()];
    let mut pod3 = actual("pod3", 13, true);
    pod3.tcx_ingress = vec!["sb_from_pod".into()];
    pod3.tcx_egress = vec!["sb_to_pod".into()];
    let mut eth0 = actual("eth0", 2, false);
    eth0.tcx_ingress = vec!["sb_from_uplink".into()];
    eth0.tcx_egress = vec!["sb_to_uplink".into()];
    eth0.xdp = Some(("other_xdp".into(), "native".into()));
    let unattached = actual("new", 20, true);
    let drift = program_drift(&listed, &[pod1, pod2, pod3, eth0, unattached]);
    assert_eq!(
        drift,
        [
            ProgramDrift {
                name: "eth0".into(),
                index: 2,
                role: "uplink".into(),
                missing: vec!["xdp native sb_xdp_uplink".into()],
                attached:
                    "tcx ingress sb_from_uplink, tcx egress sb_to_uplink, xdp native other_xdp"
                        .into(),
                foreign: vec!["xdp native other_xdp".into()],
            },
            ProgramDrift {
                name: "pod1".into(),
                index: 11,
                role: "pod".into(),
                missing: vec!["tcx egress sb_to_pod".into()],
                attached: "tcx ingress sb_from_pod, tcx ingress cilium_x".into(),
                foreign: vec!["tcx ingress cilium_x".into()],
            },
        ]
    );
}
