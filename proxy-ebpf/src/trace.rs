//! The live trace (`switchboard trace`): events written to a ring buffer
//! at the points where a program decides something about a flow, while
//! the agent has the event's kind switched on (`proxy_common::trace`).
//!
//! Cost: a call site sits only where a new flow is given a backend or a
//! packet of ours is dropped, rejected or passed untranslated, never on an
//! established flow's packet. There, with tracing off, it is one load of
//! the switch (a global, [`SB_TRACE_ON`], read as a direct value: no map
//! lookup), the test of the kind's bit and one branch, taken the same way
//! on every packet while the switch is off (`bpftool prog dump xlated` of
//! `sb_from_pod` on 6.18: `r1 = map[id:N][0]+0; r1 = *(u64 *)(r1 +0);
//! r1 &= 1; if r1 == 0x0 goto`). An array map lookup there cost about ten
//! instructions and three branches (the inlined lookup's index bound, the
//! null test of its result, the bit). The event itself is built only
//! behind the branch, straight into the ring buffer's reservation. A full ring buffer loses the event and
//! counts it (`SB_TRACE_LOST_V1`), never waits.
//!
//! One body serves both families: [`TraceAddr`] widens an address to the
//! event's 16 bytes.
use aya_ebpf::{
    btf_maps::{PerCpuArray, RingBuf},
    helpers::bpf_ktime_get_ns,
    macros::btf_map,
};
use proxy_common::{
    stat,
    trace::{kind, reason, verdict, RING_BYTES},
    Addr6Be, BackendOf, FrontendSlot, TraceEvent,
};

use crate::packet::FlowOf;

pub(crate) use proxy_common::trace::layer;

#[btf_map]
pub static SB_TRACE_V1: RingBuf<TraceEvent, { RING_BYTES as usize }> = RingBuf::new();
/// The switch (`proxy_common::names::TRACE_ON`): a global in a data
/// section of its own, which the loader makes a one-entry array map. A
/// program reads it as a direct value (one load, no lookup), so a call
/// site with tracing off costs that load and one branch.
#[unsafe(no_mangle)]
#[unsafe(link_section = ".data.sb_trace_on")]
static mut SB_TRACE_ON: u64 = 0;
#[btf_map]
pub static SB_TRACE_LOST_V1: PerCpuArray<u64, 1> = PerCpuArray::new();

/// An address of either family, as the event carries it.
pub(crate) trait TraceAddr: Copy {
    const FAMILY: u8;
    /// Writes the address to the event's 16 bytes (IPv4: the first word,
    /// the rest zero).
    fn put(&self, out: &mut [u32; 4]);
}

impl TraceAddr for u32 {
    const FAMILY: u8 = 4;
    #[inline(always)]
    fn put(&self, out: &mut [u32; 4]) {
        *out = [*self, 0, 0, 0];
    }
}

impl TraceAddr for Addr6Be {
    const FAMILY: u8 = 6;
    #[inline(always)]
    fn put(&self, out: &mut [u32; 4]) {
        out[0] = self[0];
        out[1] = self[1];
        out[2] = self[2];
        out[3] = self[3];
    }
}

/// Whether events of `kind` are switched on: what a call site costs when
/// they are not (see the module's documentation).
#[inline(always)]
fn on(kind: u8) -> bool {
    // SAFETY: a global of the program's object, always there; only the
    // agent writes it (through its map), a whole aligned word at a time.
    // Volatile: the compiler must not assume its initial value.
    let mask = unsafe { core::ptr::read_volatile(&raw const SB_TRACE_ON) };
    mask & (1u64 << kind) != 0
}

/// Emits an event of `kind` when it is switched on: `fill` writes it in
/// place, after every field was zeroed and the kind and time set.
#[inline(always)]
fn emit(kind: u8, fill: impl FnOnce(&mut TraceEvent)) {
    if !on(kind) {
        return;
    }
    let Some(mut entry) = SB_TRACE_V1.reserve(0) else {
        lost();
        return;
    };
    // SAFETY: the reservation is `size_of::<TraceEvent>()` bytes, 8-byte
    // aligned, ours until submitted; every field is written before it is
    // read (`clear`), and the type is valid for any bit pattern.
    let event = unsafe { &mut *entry.as_mut_ptr() };
    clear(event);
    event.kind = kind;
    // SAFETY: a helper without preconditions.
    event.ts_ns = unsafe { bpf_ktime_get_ns() };
    fill(event);
    entry.submit(0);
}

/// Counts an event the ring buffer had no room for.
#[inline(always)]
fn lost() {
    if let Some(counter) = SB_TRACE_LOST_V1.get_ptr_mut(0) {
        // SAFETY: this CPU's slot of a per-CPU array, valid for the program
        // run; nothing else writes it while we run here.
        unsafe { *counter += 1 };
    }
}

/// Zeroes the whole event (padding included: the reservation holds what
/// the ring buffer held before), one volatile 8-byte store per word: LLVM
/// would merge plain stores of zero into a `memset` call, a byte loop on
/// BPF.
#[inline(always)]
fn clear(e: &mut TraceEvent) {
    const WORDS: usize = core::mem::size_of::<TraceEvent>() / 8;
    let words = core::ptr::from_mut(e).cast::<u64>();
    for i in 0..WORDS {
        // SAFETY: `TraceEvent` is 80 bytes (asserted in proxy-common),
        // 8-byte aligned (it holds a `u64`): word `i < 10` lies inside it.
        unsafe { core::ptr::write_volatile(words.add(i), 0) };
    }
}

/// Writes a packet's client (source) and frontend (destination).
#[inline(always)]
fn put_flow<A: TraceAddr>(e: &mut TraceEvent, flow: &FlowOf<A>) {
    e.family = A::FAMILY;
    e.proto = flow.proto;
    flow.saddr_be.put(&mut e.client_addr_be);
    e.client_port_be = flow.sport_be;
    flow.daddr_be.put(&mut e.frontend_addr_be);
    e.frontend_port_be = flow.dport_be;
}

/// A new flow of `flow` to frontend `svc`, given `backend`: the tc and
/// XDP layers.
#[inline(always)]
pub(crate) fn new_flow<A: TraceAddr>(
    layer: u8,
    flow: &FlowOf<A>,
    backend: &BackendOf<A>,
    svc: &FrontendSlot,
) {
    emit(kind::NEW_FLOW, |e| {
        e.layer = layer;
        put_flow(e, flow);
        backend.addr_be.put(&mut e.backend_addr_be);
        e.backend_port_be = backend.port_be;
        e.service_id = svc.service_id;
        e.frontend_flags = svc.flags;
    });
}

/// A packet of `flow` that was not translated: `reason` is a global
/// counter's index (`stat`) or a [`reason`] of the trace's own, `verdict`
/// what happened to it, `service_id` its Service's (0 when not known yet).
#[inline(always)]
fn untranslated<A: TraceAddr>(
    layer: u8,
    reason: u32,
    verdict: u8,
    flow: &FlowOf<A>,
    service_id: u32,
) {
    emit(kind::DROP, |e| {
        e.layer = layer;
        e.reason = reason as u8;
        e.verdict = verdict;
        put_flow(e, flow);
        e.service_id = service_id;
    });
}

/// A packet of `flow` dropped, counted by global counter `reason`.
#[inline(always)]
pub(crate) fn dropped<A: TraceAddr>(layer: u8, reason: u32, flow: &FlowOf<A>, service_id: u32) {
    untranslated(layer, reason, verdict::DROPPED, flow, service_id);
}

/// A packet of `flow` passed on untranslated, counted by `reason`.
#[inline(always)]
pub(crate) fn passed<A: TraceAddr>(layer: u8, reason: u32, flow: &FlowOf<A>) {
    untranslated(layer, reason, verdict::PASSED, flow, 0);
}

/// A packet to frontend `service_id`, which has no endpoint, answered
/// (kube-proxy's REJECT).
#[inline(always)]
pub(crate) fn rejected<A: TraceAddr>(layer: u8, flow: &FlowOf<A>, service_id: u32) {
    untranslated(layer, stat::REJECTED, verdict::ANSWERED, flow, service_id);
}

/// A packet to frontend `svc`, which has no backend: answered when the
/// frontend rejects (`rejects`, [`crate::reject`]'s decision), else
/// dropped.
#[inline(always)]
pub(crate) fn no_backend<A: TraceAddr>(
    layer: u8,
    flow: &FlowOf<A>,
    svc: &FrontendSlot,
    rejects: bool,
) {
    match rejects {
        true => rejected(layer, flow, svc.service_id),
        false => dropped(layer, stat::DROP_NO_BACKEND, flow, svc.service_id),
    }
}

/// A packet whose source `loadBalancerSourceRanges` does not allow.
#[inline(always)]
pub(crate) fn denied<A: TraceAddr>(layer: u8, flow: &FlowOf<A>, service_id: u32) {
    dropped(layer, u32::from(reason::SOURCE_DENIED), flow, service_id);
}

/// A packet that could not be read (`malformed`): no address is known.
#[inline(always)]
pub(crate) fn malformed(layer: u8) {
    emit(kind::DROP, |e| {
        e.layer = layer;
        e.reason = stat::MALFORMED as u8;
        e.verdict = verdict::PASSED;
    });
}

/// A packet to a port of a reverse translation (the uplink's source-NAT
/// range) whose flow is not tracked.
#[inline(always)]
pub(crate) fn revnat_miss<A: TraceAddr>(layer: u8, flow: &FlowOf<A>) {
    emit(kind::REVNAT_MISS, |e| {
        e.layer = layer;
        put_flow(e, flow);
    });
}

/// A socket-layer call: a socket of protocol `proto` to
/// `frontend:frontend_port_be` of `svc`, given a backend (`Ok`: a new
/// flow) or refused (`Err(reason)`, a global counter's index: the caller
/// sees `ECONNREFUSED`). The socket's own address is not known yet.
#[inline(always)]
pub(crate) fn socket<A: TraceAddr>(
    proto: u8,
    frontend: (&A, u16),
    svc: &FrontendSlot,
    backend: Result<(&A, u16), u32>,
) {
    let kind = match backend {
        Ok(_) => kind::NEW_FLOW,
        Err(_) => kind::DROP,
    };
    emit(kind, |e| {
        e.layer = layer::SOCKET;
        e.family = A::FAMILY;
        e.proto = proto;
        frontend.0.put(&mut e.frontend_addr_be);
        e.frontend_port_be = frontend.1;
        e.service_id = svc.service_id;
        e.frontend_flags = svc.flags;
        match backend {
            Ok((addr, port_be)) => {
                addr.put(&mut e.backend_addr_be);
                e.backend_port_be = port_be;
            }
            Err(why) => {
                e.reason = why as u8;
                e.verdict = verdict::ANSWERED;
            }
        }
    });
}
