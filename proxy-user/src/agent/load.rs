//! The start's load phase: the eBPF object loaded and its maps created or
//! adopted while the source reads (see `preload`), then sized to the first
//! view, the pin root stamped, and the maps opened for the sync, which
//! adopts what they hold. No program is attached yet: the programs already
//! attached keep forwarding with the maps they use.
use std::path::Path;

use anyhow::Context as _;
use aya::Ebpf;
use proxy_common::Config;
use tracing::{debug, info};

use crate::{
    agent::config::AgentConfig,
    agent::lock::LockedPinRoot,
    agent::preload::Preload,
    dataplane::{
        attach::socket_layer, load::ip_summed, load::object, maps::PinnedMaps, pins::format,
        pins::resize::Resize,
    },
    source::Changes,
    sync::store::{Capacities, Ipv6Tables},
    sync::Syncer,
    util::heap,
};

/// A load started before the source's first view.
pub(super) struct Load {
    /// The load under way (`None` when a pinned map has another size: the
    /// load then waits for the first view).
    preload: Option<Preload>,
    /// Whether an IPv6 map pinned here holds an entry.
    ipv6_pinned: bool,
}

/// What the load hands the later phases (the maps go to the syncer).
pub(super) struct Loaded {
    pub ebpf: Ebpf,
    /// How the programs update L4 checksums (the status file says).
    pub checksums: ip_summed::Access,
    /// The pinned maps being resized (mostly none): the entries written
    /// meanwhile are copied, and the new maps pinned, once the programs
    /// took over.
    pub resize: Resize,
    pub capacities: Capacities,
    /// The data-path configuration written into the maps.
    pub datapath_config: Config,
}

impl Load {
    /// Starts loading `object` on a thread of its own, with the IPv6 flow
    /// tables sized as the pins tell (see [`ipv6_tables`]): the first view
    /// may still add an IPv6 Service.
    pub(super) fn start(object: &'static [u8], config: &AgentConfig) -> Load {
        let ipv6_pinned = object::ipv6_pinned_in_use(&config.pin_root);
        let expected = Capacities {
            ipv6: ipv6_tables(ipv6_pinned, false),
            ..config.capacities
        };
        Load {
            preload: Preload::start(object, &config.pin_root, expected),
            ipv6_pinned,
        }
    }

    /// The source failed: the load is undone, so that the pin root is as
    /// it was before it. Returns `error`.
    pub(super) fn abandon(self, error: anyhow::Error) -> anyhow::Error {
        if let Some(preload) = self.preload {
            preload.abandon();
        }
        error
    }

    /// Finishes the load with the capacities `first_view` calls for, and
    /// hands the maps to a syncer, which adopts what they hold. Every map
    /// resized is filled from its pinned copy before the syncer reads it.
    pub(super) fn finish(
        self,
        object: &'static [u8],
        config: &AgentConfig,
        locked: &LockedPinRoot,
        first_view: &Changes,
    ) -> anyhow::Result<(Loaded, Syncer<PinnedMaps>)> {
        let capacities = Capacities {
            ipv6: ipv6_tables(self.ipv6_pinned, has_ipv6_service(first_view)),
            ..config.capacities
        };
        let (loaded, resize) = self.load_with(object, &config.pin_root, &capacities)?;
        let object::Loaded {
            mut ebpf,
            checksums,
        } = loaded;
        release_object(object);
        stamp_format(&config.pin_root, locked.format)?;
        if !resize.maps().is_empty() {
            let copied = resize
                .copy(true)
                .context("copying the maps being resized")?;
            info!(?copied, "resized maps filled from the pinned ones");
        }
        let mut maps = PinnedMaps::take(&mut ebpf).context("opening the maps")?;
        let datapath_config =
            socket_layer::datapath_config().context("reading the node's network namespace")?;
        maps.set_config(datapath_config)
            .context("writing the data-path configuration")?;
        let syncer = adopt(maps, capacities, config, locked);
        let loaded = Loaded {
            ebpf,
            checksums,
            resize,
            capacities,
            datapath_config,
        };
        Ok((loaded, syncer))
    }

    /// The load with `capacities`: the early one when it loaded these and
    /// no pinned map has another size; else a load now, with the pinned
    /// maps of another size staged for an online resize.
    fn load_with(
        self,
        object: &'static [u8],
        pin_root: &Path,
        capacities: &Capacities,
    ) -> anyhow::Result<(object::Loaded, Resize)> {
        if let Some(loaded) = self.preload.and_then(|p| p.finish(capacities)) {
            let resize =
                Resize::prepare(pin_root, &[]).context("preparing to resize the pinned maps")?;
            return Ok((loaded.context("loading the eBPF programs")?, resize));
        }
        let mismatches = object::capacity_mismatches(pin_root, capacities);
        for mismatch in &mismatches {
            info!(map = mismatch.map, "{mismatch}: resizing online");
        }
        let resize = Resize::prepare(pin_root, &mismatches)
            .context("preparing to resize the pinned maps")?;
        let loaded = object::load(object, pin_root, capacities, resize.maps())
            .context("loading the eBPF programs")?;
        Ok((loaded, resize))
    }
}

/// The object is parsed and loaded; it is read again only by a restart:
/// its pages go back to the kernel.
fn release_object(object: &'static [u8]) {
    let released = heap::release(object);
    debug!(
        mib = released as f64 / 1_048_576.0,
        "the embedded eBPF object's pages handed back"
    );
}

/// Stamps the pin root with this version's format (`previous`: the stamp
/// it had).
fn stamp_format(pin_root: &Path, previous: Option<u32>) -> anyhow::Result<()> {
    if format::stamp(pin_root).context("recording the pin root's format")? {
        info!(
            format = format::FORMAT,
            previous = ?previous,
            "pin root format recorded"
        );
    }
    Ok(())
}

/// The syncer, adopting what `maps` hold (entries of no complete frontend
/// are removed), with the agent's defaults for every frontend.
fn adopt(
    maps: PinnedMaps,
    capacities: Capacities,
    config: &AgentConfig,
    locked: &LockedPinRoot,
) -> Syncer<PinnedMaps> {
    let mut syncer = Syncer::adopt(maps, capacities);
    syncer.set_default_algorithm(config.lb_algorithm);
    syncer.set_direct_return(
        config.nodeport_mode == crate::dataplane::attach::uplink::NodePortMode::Dsr,
    );
    info!(
        pin_root = %config.pin_root.display(),
        lock = %locked.lock.path().display(),
        adopted = syncer.programmed().count(),
        "maps loaded"
    );
    syncer
}

/// How big the IPv6 flow tables must be: full when the source's first view
/// has an IPv6 Service (`ipv6_service`), or an IPv6 map pinned here holds
/// an entry (`pinned_in_use`: an earlier agent served IPv6, and tables with
/// live entries are never shrunk); else small ([`Ipv6Tables::Idle`]). Small
/// while the node has no IPv6 Service, grown when one appears.
fn ipv6_tables(pinned_in_use: bool, ipv6_service: bool) -> Ipv6Tables {
    if ipv6_service || pinned_in_use {
        Ipv6Tables::Full
    } else {
        Ipv6Tables::Idle
    }
}

/// Whether `changes` hold a Service with an IPv6 address.
pub(super) fn has_ipv6_service(changes: &Changes) -> bool {
    changes
        .services
        .values()
        .flatten()
        .any(|s| s.has_ipv6_address())
}
