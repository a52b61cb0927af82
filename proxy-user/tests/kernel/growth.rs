//! The maps' memory against the kernel (root): which maps the object
//! allocates per entry, and the count of an LRU flow table's entries the
//! agent's occupancy check makes (`proxy-user/src/dataplane/pins/growth.rs`),
//! with what it costs.
use std::time::Instant;

use aya::maps::{HashMap, IterableMap as _, MapData};
use proxy_common::{names, proto, sock_dir, SockEntry, SockKey};
use proxy_user::dataplane::{load::object, maps::batch, pins::growth};

use crate::support::{capacities, require_root};

/// `BPF_F_NO_PREALLOC`.
const NO_PREALLOC: u32 = 1;

/// The flags of map `name` of the loaded object.
fn flags(ebpf: &aya::Ebpf, name: &str) -> u32 {
    let map = ebpf
        .map(name)
        .unwrap_or_else(|| panic!("{name} is in the object"));
    let data: &MapData = match map {
        aya::maps::Map::HashMap(data) | aya::maps::Map::LruHashMap(data) => data,
        _ => panic!("{name} is a hash map"),
    };
    data.info().expect("map info").map_flags()
}

/// The maps the agent expects to find allocated per entry
/// ([`object::PER_ENTRY`]) are so in the object, and so is least-connection's
/// socket map; the flow tables that grow are LRU maps, preallocated.
#[test]
fn the_hash_maps_that_are_no_lru_are_allocated_per_entry() {
    require_root();
    let ebpf = object::load_unpinned(proxy_object::SWITCHBOARD, &capacities(1024)).expect("load");
    for name in object::PER_ENTRY.iter().chain(&[names::OPEN_SOCKETS]) {
        assert_eq!(flags(&ebpf, name) & NO_PREALLOC, NO_PREALLOC, "{name}");
    }
    for table in growth::TABLES {
        assert!(
            matches!(ebpf.map(table.map), Some(aya::maps::Map::LruHashMap(_))),
            "{} is an LRU table",
            table.map
        );
        assert_eq!(flags(&ebpf, table.map) & NO_PREALLOC, 0, "{}", table.map);
    }
}

/// The occupancy check counts every entry of an LRU table, in batches; at
/// 131072 entries (half of a 262144-entry table, the most a table below
/// the default maximum holds before it grows) the count takes a few
/// milliseconds (printed).
#[test]
fn an_lru_tables_entries_are_counted_in_batches() {
    require_root();
    let size = 262_144;
    let mut ebpf =
        object::load_unpinned(proxy_object::SWITCHBOARD, &capacities(size)).expect("load");
    let mut sockets: HashMap<MapData, SockKey, SockEntry> =
        HashMap::try_from(ebpf.take_map(names::SOCKETS).expect("the socket map"))
            .expect("a hash map");
    let held = size / 2;
    for cookie in 0..u64::from(held) {
        let key = SockKey {
            cookie,
            addr_be: 0x0a60_000a_u32.to_be(),
            port_be: 53u16.to_be(),
            proto: proto::UDP,
            dir: sock_dir::REVERSE,
        };
        sockets
            .insert(key, SockEntry::default(), 0)
            .expect("insert");
    }
    let started = Instant::now();
    let counted = batch::count(sockets.map()).expect("count");
    let took = started.elapsed();
    eprintln!("counted {counted} entries of a {size}-entry LRU table in {took:?}");
    assert_eq!(counted, held as usize);
    assert!(
        growth::due(size, counted as u64, size * 2),
        "half full: due to grow"
    );
}
