//! Properties of the sync engine over random sequences of desired states:
//! after every sync the maps hold exactly the desired state, and a sync that
//! stops at any write (the agent killed, or a write refused) leaves every slot
//! a lookup can reach naming a backend that exists.
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;
use proxy_common::{frontend_flags, scope, FrontendSlot};

use super::memstore::{k, MemStore};
use super::Syncer;
use crate::{
    model::{
        BackendAddr, DesiredState, Frontend, FrontendAddr, FrontendKind, IpFamily, LbAlgorithm,
        Protocol, ServicePortName,
    },
    sync::encode::{backend_addr, revnat_name, scoped_key, slot_zero_attributes, FrontendDefaults},
    sync::store::Capacities,
};

/// Where one step's sync stops, if it does.
#[derive(Clone, Copy, Debug)]
enum Stop {
    /// Every write succeeds.
    Never,
    /// The agent dies after this many writes; a new one adopts the maps.
    Crash(usize),
    /// Writes fail after this many; the same syncer carries on at the next sync.
    Refused(usize),
}

/// One frontend as the generators describe it, turned into a [`Frontend`].
#[derive(Clone, Debug)]
struct FrontendSpec {
    addr: usize,
    service: usize,
    backends: BTreeSet<usize>,
    /// `Some`: an external kind under `externalTrafficPolicy: Local`, with
    /// this local set.
    local_set: Option<BTreeSet<usize>>,
    algorithm: Option<LbAlgorithm>,
    affinity_timeout_s: Option<u32>,
}

/// The first [`ADDRESSES_V4`] frontend addresses are IPv4, the rest IPv6.
const ADDRESSES: usize = 12;
const ADDRESSES_V4: usize = 8;
const BACKENDS: usize = 6;

fn frontend_addr(index: usize) -> FrontendAddr {
    let host = 1 + (index / 2) as u8;
    FrontendAddr {
        ip: match index < ADDRESSES_V4 {
            true => IpAddr::V4(Ipv4Addr::new(10, 96, 0, host)),
            false => IpAddr::V6(Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, u16::from(host))),
        },
        port: 80,
        protocol: if index.is_multiple_of(2) {
            Protocol::Tcp
        } else {
            Protocol::Udp
        },
    }
}

/// Backend `index` of the family a frontend's backends have.
fn backend(family: IpFamily, index: usize) -> BackendAddr {
    BackendAddr {
        ip: match family {
            IpFamily::V4 => IpAddr::V4(Ipv4Addr::new(10, 244, 0, 1 + index as u8)),
            IpFamily::V6 => IpAddr::V6(Ipv6Addr::new(
                0xfd00,
                0x244,
                0,
                0,
                0,
                0,
                0,
                1 + index as u16,
            )),
        },
        port: 8080,
    }
}

impl FrontendSpec {
    fn frontend(&self) -> Frontend {
        let name = ServicePortName {
            namespace: "default".into(),
            name: format!("svc-{}", self.service).into(),
            port: "".into(),
        };
        let addr = frontend_addr(self.addr);
        let backend = |index| backend(addr.family(), index);
        let mut frontend = Frontend::cluster_ip(
            addr,
            name,
            self.backends.iter().copied().map(backend).collect(),
        );
        if let Some(local) = &self.local_set {
            frontend.kind = FrontendKind::NodePort;
            frontend.local_only = true;
            frontend.external_backends = Some(local.iter().copied().map(backend).collect());
        }
        frontend.algorithm = self.algorithm;
        frontend.affinity_timeout_s = self.affinity_timeout_s;
        frontend
    }
}

fn backend_set() -> impl Strategy<Value = BTreeSet<usize>> {
    proptest::collection::btree_set(0..BACKENDS, 0..=4)
}

fn frontend_spec(addr: usize) -> impl Strategy<Value = FrontendSpec> {
    (
        0..3usize,
        backend_set(),
        proptest::option::weighted(0.3, backend_set()),
        proptest::option::weighted(
            0.3,
            prop_oneof![
                Just(LbAlgorithm::Random),
                Just(LbAlgorithm::Maglev),
                Just(LbAlgorithm::SourceHash),
                Just(LbAlgorithm::RoundRobin),
                Just(LbAlgorithm::LeastConn)
            ],
        ),
        proptest::option::weighted(0.2, 1..100u32),
    )
        .prop_map(
            move |(service, backends, local_set, algorithm, affinity_timeout_s)| FrontendSpec {
                addr,
                service,
                backends,
                local_set,
                algorithm,
                affinity_timeout_s,
            },
        )
}

fn desired_state() -> impl Strategy<Value = DesiredState> {
    proptest::collection::vec(proptest::option::weighted(0.6, any::<()>()), ADDRESSES)
        .prop_flat_map(|present| {
            let specs: Vec<_> = present
                .iter()
                .enumerate()
                .filter(|(_, p)| p.is_some())
                .map(|(addr, _)| frontend_spec(addr))
                .collect();
            specs
        })
        .prop_map(|specs| DesiredState {
            frontends: specs
                .iter()
                .map(|spec| {
                    let frontend = spec.frontend();
                    (frontend.addr, frontend)
                })
                .collect(),
        })
}

fn stop() -> impl Strategy<Value = Stop> {
    prop_oneof![
        3 => Just(Stop::Never),
        1 => (0..40usize).prop_map(Stop::Crash),
        1 => (0..40usize).prop_map(Stop::Refused),
    ]
}

/// One frontend as a lookup sees it in the maps: the reverse-NAT name, the
/// slot-0 attributes and the backend sets (sorted).
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    name: Option<String>,
    flags: u16,
    affinity_timeout_s: u32,
    backends: Vec<BackendAddr>,
    external: Option<Vec<BackendAddr>>,
}

/// What a lookup of each frontend finds. `Err` names the first slot that
/// names nothing: a slot missing below the count, or a backend id absent from
/// the backend map, in either set or the Maglev table.
fn lookups(store: &MemStore) -> Result<BTreeMap<FrontendAddr, Seen>, String> {
    let mut seen = BTreeMap::new();
    for addr in (0..ADDRESSES).map(frontend_addr) {
        let Some(head) = store
            .frontends
            .get(&k(&scoped_key(&addr, scope::INTERNAL, 0)))
        else {
            continue;
        };
        let backends = backend_set_of(store, &addr, scope::INTERNAL, head)?;
        let external = if frontend_flags::has_external_set(head.flags) {
            let external_head = store
                .frontends
                .get(&k(&scoped_key(&addr, scope::EXTERNAL, 0)))
                .ok_or_else(|| format!("{addr}: announces an external set that is not there"))?;
            Some(backend_set_of(
                store,
                &addr,
                scope::EXTERNAL,
                external_head,
            )?)
        } else {
            None
        };
        // The per-node schedulers keep bits 3..=4 random (an older data
        // path picks at random).
        if head.flags & frontend_flags::PICK_MASK != 0
            && head.flags & frontend_flags::ALGO_MASK != frontend_flags::ALGO_RANDOM
        {
            return Err(format!(
                "{addr}: a per-node scheduler with a hashing algorithm"
            ));
        }
        if head.flags & frontend_flags::ALGO_MASK != frontend_flags::ALGO_RANDOM {
            if let Some(table) = store.maglev.get(&head.service_id) {
                // Id 0 fills the table of a frontend without backends.
                if let Some(id) = table
                    .iter()
                    .find(|&&id| id != 0 && !store.backends.contains_key(&(addr.family(), id)))
                {
                    return Err(format!(
                        "{addr}: the Maglev table names backend id {id}, which is absent"
                    ));
                }
            }
        }
        seen.insert(
            addr,
            Seen {
                name: store
                    .revnat
                    .get(&(addr.family(), head.service_id))
                    .map(revnat_name),
                flags: head.flags,
                affinity_timeout_s: head.affinity_timeout_s,
                backends,
                external,
            },
        );
    }
    Ok(seen)
}

fn backend_set_of(
    store: &MemStore,
    addr: &FrontendAddr,
    scope: u8,
    head: &FrontendSlot,
) -> Result<Vec<BackendAddr>, String> {
    let mut set = Vec::new();
    for slot in 1..=head.backend_count {
        let value = store
            .frontends
            .get(&k(&scoped_key(addr, scope, slot)))
            .ok_or_else(|| {
                format!(
                    "{addr}: scope {scope} slot {slot} of {} is missing",
                    head.backend_count
                )
            })?;
        let backend = store
            .backends
            .get(&(addr.family(), value.backend_id))
            .ok_or_else(|| {
                format!(
                    "{addr}: scope {scope} slot {slot} names absent {} backend {}",
                    addr.family(),
                    value.backend_id
                )
            })?;
        set.push(backend_addr(backend));
    }
    set.sort();
    Ok(set)
}

/// What the lookups must find for `desired`.
fn expected(desired: &DesiredState) -> BTreeMap<FrontendAddr, Seen> {
    desired
        .frontends
        .values()
        .map(|frontend| {
            let (flags, affinity_timeout_s) =
                slot_zero_attributes(frontend, FrontendDefaults::default());
            let sorted = |set: &[BackendAddr]| {
                let mut set = set.to_vec();
                set.sort();
                set
            };
            let seen = Seen {
                name: Some(format!(
                    "{}/{}",
                    frontend.service.namespace, frontend.service.name
                )),
                flags,
                affinity_timeout_s,
                backends: sorted(&frontend.backends),
                external: frontend.external_backends.as_deref().map(sorted),
            };
            (frontend.addr, seen)
        })
        .collect()
}

/// The frontends whose desired value differs between two states.
fn changed(before: &DesiredState, after: &DesiredState) -> BTreeSet<FrontendAddr> {
    let addrs = before.frontends.keys().chain(after.frontends.keys());
    addrs
        .filter(|addr| before.frontends.get(addr) != after.frontends.get(addr))
        .copied()
        .collect()
}

/// Runs one step: a sync towards `desired` that may stop, then, if it
/// stopped, what the agent does next (a new agent adopts the maps, or the
/// same one syncs again), and checks the maps after each part.
fn step(
    syncer: &mut Syncer<MemStore>,
    before: &DesiredState,
    desired: &DesiredState,
    stop: Stop,
) -> Result<(), TestCaseError> {
    let writes = syncer.store().writes;
    syncer.store_mut().stop_after = match stop {
        Stop::Never => None,
        Stop::Crash(after) | Stop::Refused(after) => Some(writes + after),
    };
    syncer.apply_changed(desired, &changed(before, desired));
    if let Err(broken) = lookups(syncer.store()) {
        return Err(TestCaseError::fail(format!("after {stop:?}: {broken}")));
    }
    syncer.store_mut().stop_after = None;
    match stop {
        Stop::Never => {}
        Stop::Crash(_) => {
            let store = std::mem::take(syncer.store_mut());
            *syncer = Syncer::adopt(store, Capacities::default());
            syncer.apply(desired);
        }
        Stop::Refused(_) => {
            syncer.apply_changed(desired, &BTreeSet::new());
        }
    }
    let seen = lookups(syncer.store()).map_err(TestCaseError::fail)?;
    prop_assert_eq!(seen, expected(desired), "after {:?}", stop);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::test_cases(96)))]

    #[test]
    fn maps_hold_the_desired_state_and_a_stopped_sync_leaves_every_slot_live(
        steps in proptest::collection::vec((desired_state(), stop()), 1..12)
    ) {
        let mut syncer = Syncer::adopt(MemStore::default(), Capacities::default());
        let mut before = DesiredState::default();
        for (desired, stop) in steps {
            step(&mut syncer, &before, &desired, stop)?;
            before = desired;
        }
    }
}
