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
    /// `switchboard.io/weights`: a weight per backend index (0: drained).
    weights: Option<Vec<u16>>,
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
        if let Some(weights) = &self.weights {
            let used: BTreeSet<usize> = self
                .backends
                .iter()
                .chain(self.local_set.iter().flatten())
                .copied()
                .collect();
            frontend.weights = used
                .into_iter()
                .filter(|i| weights[*i] != 1)
                .map(|i| (backend(i), weights[i]))
                .collect();
        }
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
        proptest::option::weighted(
            0.4,
            proptest::collection::vec(
                prop_oneof![1 => Just(0u16), 3 => 1..4u16, 1 => Just(6u16)],
                BACKENDS,
            ),
        ),
    )
        .prop_map(
            move |(service, backends, local_set, algorithm, affinity_timeout_s, weights)| {
                FrontendSpec {
                    addr,
                    service,
                    backends,
                    local_set,
                    algorithm,
                    affinity_timeout_s,
                    weights,
                }
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
/// slot-0 attributes and the backend sets.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    name: Option<String>,
    flags: u16,
    affinity_timeout_s: u32,
    backends: SetSeen,
    external: Option<SetSeen>,
    maglev_skips_drained: bool,
}

/// One backend set: how many of the slots new flows pick from name each
/// backend (sorted by backend), and the drained backends (slots past the
/// count, sorted), with whether slot 0 marks the set weighted.
#[derive(Debug, Default, PartialEq, Eq)]
struct SetSeen {
    picks: Vec<(BackendAddr, usize)>,
    drained: Vec<BackendAddr>,
    weighted: bool,
    /// The share each weighted slot records for its backend
    /// (least-connection reads it). A sync that stopped half-way may leave
    /// it behind for a moment, so it is compared only after a full sync.
    shares: Vec<(BackendAddr, u16)>,
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
        // A drained backend has no entry in the Maglev table (a sync
        // stopped half-way may leave one for a moment: compared only after
        // a full sync).
        let hashed = external.as_ref().unwrap_or(&backends);
        let maglev_skips_drained = head.flags & frontend_flags::ALGO_MASK
            == frontend_flags::ALGO_RANDOM
            || store.maglev.get(&head.service_id).is_none_or(|table| {
                !table.iter().any(|id| {
                    store
                        .backends
                        .get(&(addr.family(), *id))
                        .is_some_and(|b| hashed.drained.contains(&backend_addr(b)))
                })
            });
        seen.insert(
            addr,
            Seen {
                name: store
                    .revnat
                    .get(&(addr.family(), head.service_id))
                    .map(revnat_name),
                flags: head.flags & !frontend_flags::WEIGHTED,
                affinity_timeout_s: head.affinity_timeout_s,
                backends,
                external,
                maglev_skips_drained,
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
) -> Result<SetSeen, String> {
    let weighted = head.flags & frontend_flags::WEIGHTED != 0;
    let mut picks: BTreeMap<BackendAddr, usize> = BTreeMap::new();
    let mut shares: BTreeMap<BackendAddr, u16> = BTreeMap::new();
    let mut drained = Vec::new();
    let mut slot = head.backend_count;
    while weighted && slot < u16::MAX {
        slot += 1;
        let Some(value) = store
            .frontends
            .get(&k(&scoped_key(addr, scope, slot)))
            .filter(|v| v.backend_count == 0)
        else {
            break;
        };
        let backend = store
            .backends
            .get(&(addr.family(), value.backend_id))
            .ok_or_else(|| format!("{addr}: drained slot {slot} names an absent backend"))?;
        drained.push(backend_addr(backend));
    }
    drained.sort();
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
        let backend = backend_addr(backend);
        *picks.entry(backend).or_default() += 1;
        if weighted {
            shares.insert(backend, value.backend_count);
        }
    }
    Ok(SetSeen {
        picks: picks.into_iter().collect(),
        drained,
        weighted,
        shares: shares.into_iter().collect(),
    })
}

/// What a set of `frontend` must look like: each backend in `w ÷ gcd`
/// slots (the weights drawn are small, so never scaled), weight 0
/// drained; with every weight equal and none 0, one slot each, unmarked.
fn expected_set(frontend: &Frontend, set: &[BackendAddr]) -> SetSeen {
    let once = frontend.algorithm == Some(LbAlgorithm::LeastConn);
    let weights: Vec<(BackendAddr, u16)> =
        set.iter().map(|b| (*b, frontend.weight_of(b))).collect();
    let live: Vec<u16> = weights.iter().map(|w| w.1).filter(|w| *w > 0).collect();
    let gcd = |mut a: u16, mut b: u16| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    let divisor = live.iter().copied().fold(0, gcd).max(1);
    let weighted = live.len() < weights.len() || live.windows(2).any(|w| w[0] != w[1]);
    let mut picks: Vec<(BackendAddr, usize)> = weights
        .iter()
        .filter(|w| w.1 > 0)
        .map(|(b, w)| {
            (
                *b,
                if weighted && !once {
                    usize::from(w / divisor)
                } else {
                    1
                },
            )
        })
        .collect();
    picks.sort();
    let mut shares: Vec<(BackendAddr, u16)> = match weighted {
        true => weights
            .iter()
            .filter(|w| w.1 > 0)
            .map(|(b, w)| (*b, w / divisor))
            .collect(),
        false => Vec::new(),
    };
    shares.sort();
    let mut drained: Vec<BackendAddr> = weights.iter().filter(|w| w.1 == 0).map(|w| w.0).collect();
    drained.sort();
    SetSeen {
        picks,
        drained,
        weighted,
        shares,
    }
}

/// What the lookups must find for `desired`.
fn expected(desired: &DesiredState) -> BTreeMap<FrontendAddr, Seen> {
    desired
        .frontends
        .values()
        .map(|frontend| {
            let (flags, affinity_timeout_s) =
                slot_zero_attributes(frontend, FrontendDefaults::default());
            let sorted = |set: &[BackendAddr]| expected_set(frontend, set);
            let seen = Seen {
                name: Some(format!(
                    "{}/{}",
                    frontend.service.namespace, frontend.service.name
                )),
                flags,
                affinity_timeout_s,
                backends: sorted(&frontend.backends),
                external: frontend.external_backends.as_deref().map(sorted),
                maglev_skips_drained: true,
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
    // The drift check mends at most what a refused write left over (an
    // orphan whose delete was refused too), changes no lookup, and then
    // finds the maps exactly as the sync remembers writing them.
    let healed = syncer.heal(desired);
    prop_assert!(
        healed.failed.is_none(),
        "after {:?}: {:?}",
        stop,
        healed.failed
    );
    if !matches!(stop, Stop::Refused(_)) {
        prop_assert!(
            healed.clean,
            "after {:?}, the drift check found {:?}",
            stop,
            healed.findings
        );
    }
    let seen = lookups(syncer.store()).map_err(TestCaseError::fail)?;
    prop_assert_eq!(seen, expected(desired), "after healing, after {:?}", stop);
    let again = syncer.heal(desired);
    prop_assert!(again.clean, "healed twice: {:?}", again.findings);
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
