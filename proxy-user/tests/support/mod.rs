//! The harness the kernel fixture tests share: the eBPF object loaded with
//! its maps programmed, frames fed to its tc and XDP programs through
//! BPF_PROG_TEST_RUN, and the counters and conntrack entries read back.
// Every test file is a crate of its own that compiles this module and uses a
// part of it; the rest would be reported as dead code in each.
#![allow(dead_code)]

pub mod v6;

use std::net::{IpAddr, Ipv4Addr};

use aya::{
    programs::{ProgramError, SchedClassifier, TestRun, TestRunOptions, TestRunResult, Xdp},
    Ebpf,
};
use proxy_common::{programs, CtEntry, CtKey};
use proxy_user::{
    dataplane::ebpf,
    dataplane::maps::PinnedMaps,
    model::{
        BackendAddr, DesiredState, Frontend, FrontendAddr, FrontendKind, Protocol, ServicePortName,
    },
    sync::store::Capacities,
    sync::Syncer,
};

pub const TC_ACT_OK: u32 = 0;
pub const TC_ACT_SHOT: u32 = 2;
/// TC_ACT_REDIRECT: the program redirected the packet (`bpf_redirect*`).
pub const TC_ACT_REDIRECT: u32 = 7;
/// TC_ACT_UNSPEC (-1): "not ours, let the next program decide".
pub const TC_ACT_UNSPEC: u32 = u32::MAX;
pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const XDP_TX: u32 = 3;
pub const XDP_REDIRECT: u32 = 4;

/// Room for the largest frame a fixture gets back.
const OUT_LEN: usize = 4096;

pub fn require_root() {
    assert!(
        // SAFETY: geteuid has no preconditions and cannot fail.
        unsafe { libc::geteuid() } == 0,
        "kernel fixture tests load eBPF programs (some also create network namespaces): \
         run them as root (`cargo xtask test`)"
    );
}

/// Moves the calling thread to CPU `cpu` (BPF_PROG_TEST_RUN runs on the
/// caller's CPU). Fails when the machine has no such CPU: a test that needs
/// two CPUs never passes on one.
pub fn run_on_cpu(cpu: usize) {
    // Not available_parallelism: it counts the CPUs this thread may use,
    // which an earlier call narrowed.
    // SAFETY: sysconf has no preconditions.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    assert!(
        (cpu as libc::c_long) < cpus,
        "this test needs CPU {cpu}; the machine has {cpus} online"
    );
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside
    // it; sched_setaffinity(0, ..) affects the calling thread only.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        let rc = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        assert_eq!(
            rc,
            0,
            "sched_setaffinity: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Room for 1024 frontends and backends, 64 service ports and `conntrack`
/// connection-tracking entries.
pub fn capacities(conntrack: u32) -> Capacities {
    Capacities {
        frontends: 1024,
        backends: 1024,
        conntrack,
        services: 64,
    }
}

/// A frontend of kind `kind` of the Service `test/name`, balancing over
/// `backends` (addresses of either family, `Ipv4Addr` or `Ipv6Addr`).
pub fn frontend<A: Into<IpAddr> + Copy>(
    kind: FrontendKind,
    ip: A,
    port: u16,
    protocol: Protocol,
    name: &str,
    backends: &[(A, u16)],
) -> Frontend {
    let service = ServicePortName {
        namespace: "test".into(),
        name: name.into(),
        port: String::new(),
    };
    let backends = backends
        .iter()
        .map(|&(ip, port)| BackendAddr {
            ip: ip.into(),
            port,
        })
        .collect();
    Frontend {
        kind,
        ..Frontend::cluster_ip(
            FrontendAddr {
                ip: ip.into(),
                port,
                protocol,
            },
            service,
            backends,
        )
    }
}

/// A ClusterIP frontend: [`frontend`] of kind `ClusterIp`.
pub fn cluster_ip<A: Into<IpAddr> + Copy>(
    ip: A,
    port: u16,
    protocol: Protocol,
    name: &str,
    backends: &[(A, u16)],
) -> Frontend {
    frontend(FrontendKind::ClusterIp, ip, port, protocol, name, backends)
}

/// The head of struct __sk_buff up to `ifindex` (the kernel zero-fills the
/// rest): `ingress_ifindex` at byte 36, `ifindex` at byte 40.
pub fn skb_ctx(ingress_ifindex: u32, ifindex: u32) -> Vec<u8> {
    let mut ctx = vec![0u8; 44];
    ctx[36..40].copy_from_slice(&ingress_ifindex.to_ne_bytes());
    ctx[40..44].copy_from_slice(&ifindex.to_ne_bytes());
    ctx
}

/// struct xdp_md for a frame of `frame_len` bytes: data, data_end,
/// data_meta, ingress_ifindex, rx_queue_index, egress_ifindex.
pub fn xdp_ctx(frame_len: usize, ingress_ifindex: u32) -> Vec<u8> {
    let data_end = u32::try_from(frame_len).expect("a frame shorter than 4 GiB");
    [0, data_end, 0, ingress_ifindex, 0, 0]
        .iter()
        .flat_map(|word: &u32| word.to_ne_bytes())
        .collect()
}

/// One BPF_PROG_TEST_RUN of `program` on `frame` with context `ctx`: the
/// verdict and the frame as the program left it.
fn test_run<P>(
    program: &P,
    frame: &[u8],
    ctx: Option<&[u8]>,
) -> Result<(u32, Vec<u8>), ProgramError>
where
    P: for<'a> TestRun<Opts<'a> = TestRunOptions<'a>, Result = TestRunResult>,
{
    let mut out = vec![0u8; OUT_LEN];
    let result = program.test_run(TestRunOptions {
        data_in: Some(frame),
        data_out: Some(&mut out),
        ctx_in: ctx,
        ..TestRunOptions::default()
    })?;
    out.truncate(result.data_size_out as usize);
    Ok((result.return_value, out))
}

/// The eBPF object loaded unpinned with room for `caps`, and its maps taken
/// out of it (empty).
pub fn load(caps: &Capacities) -> (Ebpf, PinnedMaps) {
    require_root();
    let mut ebpf = ebpf::load_unpinned(caps).expect("load eBPF object");
    let maps = PinnedMaps::take(&mut ebpf).expect("maps");
    (ebpf, maps)
}

/// The eBPF object, loaded unpinned, with its maps owned by a syncer.
pub struct Loaded {
    pub ebpf: Ebpf,
    pub syncer: Syncer<PinnedMaps>,
}

impl Loaded {
    /// Loads the object with `caps` and programs `frontends` into its maps;
    /// every frontend must be written.
    pub fn new(caps: Capacities, frontends: Vec<Frontend>) -> Self {
        let (ebpf, maps) = load(&caps);
        let mut syncer = Syncer::adopt(maps, caps);
        let desired = DesiredState {
            frontends: frontends.into_iter().map(|f| (f.addr, f)).collect(),
        };
        let report = syncer.apply(&desired);
        assert!(report.failed.is_empty(), "{report:?}");
        Self { ebpf, syncer }
    }

    /// Makes `ifindex` the node's uplink, with address `node`.
    pub fn set_uplink(&mut self, ifindex: u32, node: Ipv4Addr) {
        self.syncer
            .store_mut()
            .set_uplinks(&[(ifindex, node)])
            .expect("write the uplink map");
    }

    /// The verdict of tc program `program` on `frame`, and the frame as it
    /// left it; `ctx` is the __sk_buff given to it ([`skb_ctx`]), if any.
    pub fn tc(&mut self, program: &str, frame: &[u8], ctx: Option<&[u8]>) -> (u32, Vec<u8>) {
        self.try_tc(program, frame, ctx).expect("BPF_PROG_TEST_RUN")
    }

    /// [`Loaded::tc`], with the test run's failure returned.
    pub fn try_tc(
        &mut self,
        program: &str,
        frame: &[u8],
        ctx: Option<&[u8]>,
    ) -> Result<(u32, Vec<u8>), ProgramError> {
        let tc: &mut SchedClassifier = self
            .ebpf
            .program_mut(program)
            .expect("program present")
            .try_into()
            .expect("tc program");
        test_run(tc, frame, ctx)
    }

    /// The verdict of the XDP uplink program on `frame`, and the frame as it
    /// left it; with `ingress_ifindex`, as if it arrived on that interface
    /// (an [`xdp_ctx`]), else with no context at all.
    pub fn xdp(&mut self, frame: &[u8], ingress_ifindex: Option<u32>) -> (u32, Vec<u8>) {
        self.try_xdp(frame, ingress_ifindex)
            .expect("BPF_PROG_TEST_RUN")
    }

    /// [`Loaded::xdp`], with the test run's failure returned.
    pub fn try_xdp(
        &mut self,
        frame: &[u8],
        ingress_ifindex: Option<u32>,
    ) -> Result<(u32, Vec<u8>), ProgramError> {
        let ctx = ingress_ifindex.map(|ifindex| xdp_ctx(frame.len(), ifindex));
        let xdp: &mut Xdp = self
            .ebpf
            .program_mut(programs::XDP_UPLINK)
            .expect("program present")
            .try_into()
            .expect("XDP program");
        test_run(xdp, frame, ctx.as_deref())
    }

    /// The global counter `name`, summed over CPUs.
    pub fn stat(&self, name: &str) -> u64 {
        self.syncer
            .store()
            .global_stats()
            .into_iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v)
            .expect("known counter")
    }

    /// The conntrack entry under `key`, if there is one.
    pub fn ct(&self, key: &CtKey) -> Option<CtEntry> {
        self.syncer.store().conntrack.get(key, 0).ok()
    }
}
