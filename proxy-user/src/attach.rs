//! Finding pod interfaces and attaching the tc programs to them.
//!
//! A pod interface is a veth in the agent's namespace whose peer lives in
//! another namespace (the kernel reports the peer's namespace id on such links).
//! Both programs are attached with netlink (clsact), which outlives the agent:
//! traffic keeps flowing while the agent restarts, and a new agent replaces the
//! filters the old one left.
use std::collections::HashMap;

use aya::programs::{
    tc::{self, NlOptions, TcAttachOptions, TcError},
    ProgramError, SchedClassifier, TcAttachType,
};
use aya::Ebpf;
use futures::TryStreamExt as _;
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkInfo, LinkMessage};
use proxy_common::programs;
use tracing::{debug, info, warn};

#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("netlink: {0}")]
    Netlink(#[from] rtnetlink::Error),
    #[error("netlink socket")]
    Socket(#[source] std::io::Error),
    #[error("adding the clsact qdisc to {iface}")]
    Qdisc { iface: String, source: TcError },
    #[error("attaching {program} to {iface}")]
    Attach {
        iface: String,
        program: &'static str,
        source: ProgramError,
    },
    #[error("program {0} is missing from the loaded object")]
    MissingProgram(&'static str),
}

/// A veth whose peer is in another namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodInterface {
    pub name: String,
    pub index: u32,
}

/// Whether a link is a veth with its peer in another namespace.
pub fn pod_interface(link: &LinkMessage) -> Option<PodInterface> {
    let mut name = None;
    let mut is_veth = false;
    let mut peer_elsewhere = false;
    for attr in &link.attributes {
        match attr {
            LinkAttribute::IfName(n) => name = Some(n.clone()),
            LinkAttribute::LinkNetNsId(_) => peer_elsewhere = true,
            LinkAttribute::LinkInfo(infos) => {
                is_veth = infos
                    .iter()
                    .any(|info| matches!(info, LinkInfo::Kind(InfoKind::Veth)));
            }
            _ => {}
        }
    }
    match (name, is_veth && peer_elsewhere) {
        (Some(name), true) => Some(PodInterface {
            name,
            index: link.header.index,
        }),
        _ => None,
    }
}

/// Lists the pod interfaces of the current network namespace.
pub async fn pod_interfaces(handle: &rtnetlink::Handle) -> Result<Vec<PodInterface>, AttachError> {
    let mut links = handle.link().get().execute();
    let mut found = Vec::new();
    while let Some(link) = links.try_next().await? {
        if let Some(pod) = pod_interface(&link) {
            found.push(pod);
        }
    }
    Ok(found)
}

/// Keeps track of which interfaces carry our programs.
#[derive(Default)]
pub struct Attacher {
    /// Interface name → index it had when we attached (a veth re-created
    /// under the same name gets a new index and is attached again).
    attached: HashMap<String, u32>,
}

impl Attacher {
    /// Attaches to every pod interface not yet attached; forgets interfaces
    /// that are gone. Errors on one interface are logged and do not stop
    /// the others.
    pub fn reconcile(&mut self, ebpf: &mut Ebpf, interfaces: &[PodInterface]) {
        self.attached.retain(|name, index| {
            interfaces
                .iter()
                .any(|i| &i.name == name && i.index == *index)
        });
        for iface in interfaces {
            if self.attached.get(&iface.name) == Some(&iface.index) {
                continue;
            }
            match attach(ebpf, &iface.name) {
                Ok(()) => {
                    info!(iface = %iface.name, "programs attached");
                    self.attached.insert(iface.name.clone(), iface.index);
                }
                Err(error) => {
                    warn!(iface = %iface.name, error = %anyhow::Error::from(error), "attach failed; will retry")
                }
            }
        }
    }

    pub fn attached(&self) -> usize {
        self.attached.len()
    }
}

/// Attaches both programs to `iface`, replacing filters an earlier agent left.
pub fn attach(ebpf: &mut Ebpf, iface: &str) -> Result<(), AttachError> {
    match tc::qdisc_add_clsact(iface) {
        Ok(()) => {}
        Err(TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => {}
        Err(source) => {
            return Err(AttachError::Qdisc {
                iface: iface.to_owned(),
                source,
            })
        }
    }
    for (name, hook) in [
        (programs::TC_FROM_POD, TcAttachType::Ingress),
        (programs::TC_TO_POD, TcAttachType::Egress),
    ] {
        // A previous agent's filter (same program name): remove it first.
        match tc::qdisc_detach_program(iface, hook, name) {
            Ok(()) => debug!(iface, program = name, "replaced an earlier filter"),
            Err(error) => debug!(iface, program = name, %error, "no earlier filter"),
        }
        let program: &mut SchedClassifier = ebpf
            .program_mut(name)
            .ok_or(AttachError::MissingProgram(name))?
            .try_into()
            .map_err(|source| AttachError::Attach {
                iface: iface.to_owned(),
                program: name,
                source,
            })?;
        let link_id = program
            .attach_with_options(iface, hook, TcAttachOptions::Netlink(NlOptions::default()))
            .map_err(|source| AttachError::Attach {
                iface: iface.to_owned(),
                program: name,
                source,
            })?;
        // Own the link and let it go without detaching: the filter stays when
        // the agent exits, so traffic survives a restart.
        let link = program
            .take_link(link_id)
            .map_err(|source| AttachError::Attach {
                iface: iface.to_owned(),
                program: name,
                source,
            })?;
        std::mem::forget(link);
    }
    Ok(())
}
