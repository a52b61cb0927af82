//! The harness every kernel fixture test shares: the eBPF object loaded with
//! its maps programmed ([`Loaded`]), frames fed to its tc and XDP programs
//! through BPF_PROG_TEST_RUN ([`Hook`]), tables of (name, hook, input frame,
//! expected verdict, expected output frame) run through them ([`Case`],
//! [`Loaded::run_table`]), the counters and conntrack entries read back, and
//! the private network namespaces and node the uplink fixtures need, for
//! either address family ([`netns`]), and what a fixture written once for
//! both families asks of a family ([`family`]).
pub mod family;
pub mod netns;
pub mod v6;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use aya::{
    maps::{HashMap, MapData},
    programs::{ProgramError, SchedClassifier, TestRun, TestRunOptions, TestRunResult, Xdp},
    Ebpf,
};
use proxy_common::{addr6_be, names, programs, CtEntry, CtKey, Uplink6};
use proxy_testkit::Frame;
use proxy_user::{
    dataplane::load::ip_summed::Access,
    dataplane::load::object,
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
        ..Capacities::default()
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
        port: "".into(),
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
    test_run_with(program, frame, ctx, None)
}

/// [`test_run`], the context as the program left it written to `ctx_out`.
fn test_run_with<P>(
    program: &P,
    frame: &[u8],
    ctx: Option<&[u8]>,
    ctx_out: Option<&mut [u8]>,
) -> Result<(u32, Vec<u8>), ProgramError>
where
    P: for<'a> TestRun<Opts<'a> = TestRunOptions<'a>, Result = TestRunResult>,
{
    let mut out = vec![0u8; OUT_LEN];
    let result = program.test_run(TestRunOptions {
        data_in: Some(frame),
        data_out: Some(&mut out),
        ctx_in: ctx,
        ctx_out,
        ..TestRunOptions::default()
    })?;
    out.truncate(result.data_size_out as usize);
    Ok((result.return_value, out))
}

/// Program `name` of an object from [`load`] as its aya type, verified
/// and loaded into the kernel at its first use: a fixture pays the
/// verifier only for the programs it runs.
pub fn loaded_program<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> &'a mut T
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    object::load_unpinned_program(ebpf, name)
        .unwrap_or_else(|e| panic!("loading {name}: {:?}", anyhow::Error::from(e)));
    ebpf.program_mut(name)
        .unwrap_or_else(|| panic!("{name} missing"))
        .try_into()
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The eBPF object loaded unpinned with room for `caps`, and its maps taken
/// out of it (empty); its programs go in at their first use
/// ([`loaded_program`]).
pub fn load(caps: &Capacities) -> (Ebpf, PinnedMaps) {
    load_as(caps, &Access::detect())
}

/// [`load`] with the checksum state read as `access` says (no fallback).
pub fn load_as(caps: &Capacities, access: &Access) -> (Ebpf, PinnedMaps) {
    require_root();
    let mut ebpf = object::load_unpinned_maps_as(proxy_object::SWITCHBOARD, caps, access)
        .unwrap_or_else(|e| {
            panic!(
                "load eBPF object ({access:?}): {:?}",
                anyhow::Error::from(e)
            )
        });
    let maps = PinnedMaps::take(&mut ebpf).expect("maps");
    (ebpf, maps)
}

/// Where a fixture's frame goes in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    /// A tc program, with no __sk_buff context.
    Tc(&'static str),
    /// The XDP uplink program, with no context.
    Xdp,
    /// A tc program on the uplink [`Loaded::set_uplink`] named (its device
    /// and ingress interface).
    UplinkTc(&'static str),
    /// The XDP uplink program, the frame arriving on that uplink.
    UplinkXdp,
}

impl From<&'static str> for Hook {
    fn from(program: &'static str) -> Self {
        Hook::Tc(program)
    }
}

/// The two programs a frame from outside meets on the uplink: XDP, or (where
/// XDP is off or leaves it) its tc twin `sb_from_uplink`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Uplink {
    Xdp,
    Tc,
}

impl Uplink {
    pub const BOTH: [Uplink; 2] = [Uplink::Xdp, Uplink::Tc];

    /// The verdict of a packet that is not ours.
    pub fn untouched(self) -> u32 {
        match self {
            Uplink::Xdp => XDP_PASS,
            Uplink::Tc => TC_ACT_UNSPEC,
        }
    }

    /// Whether this program tracks a packet that arrives with the
    /// direct-server-return option: tc always; XDP where the kernel lets it
    /// mark the packets it tracked (else it leaves them all to tc).
    pub fn tracks_dsr_arrivals(self) -> bool {
        match self {
            Uplink::Xdp => proxy_user::dataplane::load::object::xdp_metadata_supported(),
            Uplink::Tc => true,
        }
    }

    /// The verdict of a packet rewritten for a backend on this node.
    pub fn delivered(self) -> u32 {
        match self {
            Uplink::Xdp => XDP_PASS,
            Uplink::Tc => TC_ACT_OK,
        }
    }

    pub fn dropped(self) -> u32 {
        match self {
            Uplink::Xdp => XDP_DROP,
            Uplink::Tc => TC_ACT_SHOT,
        }
    }
}

impl From<Uplink> for Hook {
    fn from(prog: Uplink) -> Self {
        match prog {
            Uplink::Xdp => Hook::UplinkXdp,
            Uplink::Tc => Hook::UplinkTc(programs::TC_FROM_UPLINK),
        }
    }
}

/// One packet fixture: `input` fed to `hook` must give `verdict` and leave
/// exactly `output` (checksums included).
#[derive(Clone, Debug)]
pub struct Case {
    pub name: String,
    pub hook: Hook,
    pub input: Vec<u8>,
    pub verdict: u32,
    pub output: Vec<u8>,
}

/// A frame in hex, for a failure message.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `frame` cut to its first `len` bytes.
pub fn truncated(mut frame: Vec<u8>, len: usize) -> Vec<u8> {
    frame.truncate(len);
    frame
}

/// The frame of `spec` (of either family's builder) changed by `f`.
pub fn rewritten<P: Frame>(spec: &P, f: impl FnOnce(&mut P)) -> Vec<u8> {
    with(spec, f).build()
}

/// An IPv4 address as the maps hold it (network byte order in a u32).
pub fn be32(ip: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(ip.octets())
}

/// A copy of the packet `spec` (of either family's builder) changed by `f`.
pub fn with<P: Clone>(spec: &P, f: impl FnOnce(&mut P)) -> P {
    let mut out = spec.clone();
    f(&mut out);
    out
}

/// The eBPF object, loaded unpinned, with its maps owned by a syncer (and
/// second handles on the IPv6 maps, which the IPv6 fixtures write directly).
pub struct Loaded {
    pub ebpf: Ebpf,
    pub syncer: Syncer<PinnedMaps>,
    pub maps6: v6::Maps6,
    /// The uplink [`Loaded::set_uplink`] made, for the uplink hooks.
    uplink: Option<u32>,
    uplinks6: Option<HashMap<MapData, u32, Uplink6>>,
}

impl Loaded {
    /// Loads the object with `caps` and programs `frontends` into its maps;
    /// every frontend must be written.
    pub fn new(caps: Capacities, frontends: Vec<Frontend>) -> Self {
        Self::new_as(caps, frontends, &Access::detect())
    }

    /// [`Loaded::new`] with the checksum state read as `access` says.
    pub fn new_as(caps: Capacities, frontends: Vec<Frontend>, access: &Access) -> Self {
        let (ebpf, maps) = load_as(&caps, access);
        let syncer = Syncer::adopt(maps, caps);
        let maps6 = v6::Maps6::take(syncer.store());
        let mut loaded = Self {
            ebpf,
            syncer,
            maps6,
            uplink: None,
            uplinks6: None,
        };
        let report = loaded.program(frontends);
        assert!(report.failed.is_empty(), "{report:?}");
        loaded
    }

    /// Makes the maps hold exactly `frontends`, as the agent would.
    pub fn program(&mut self, frontends: Vec<Frontend>) -> proxy_user::sync::SyncReport {
        self.syncer.apply(&DesiredState {
            frontends: frontends.into_iter().map(|f| (f.addr, f)).collect(),
        })
    }

    /// Loads the programs (in the calling thread's namespace) with room for
    /// every SNAT port of one backend (33512) and then some, programs
    /// `frontends` and makes `node`'s `up0` the uplink, with IPv4 address
    /// `addr`.
    pub fn on_uplink(
        node: &proxy_testkit::node::Node,
        addr: Ipv4Addr,
        frontends: Vec<Frontend>,
    ) -> Self {
        let mut loaded = Self::new(capacities(65536), frontends);
        loaded.set_uplink(node.uplink, addr);
        loaded
    }

    /// Makes `ifindex` the node's uplink, with address `node`; the uplink
    /// hooks then feed frames as if they arrived on it.
    pub fn set_uplink(&mut self, ifindex: u32, node: Ipv4Addr) {
        self.set_uplink_flags(ifindex, node, 0);
    }

    /// [`Loaded::set_uplink`] with the uplink map's `flags`
    /// (`uplink_flags`).
    pub fn set_uplink_flags(&mut self, ifindex: u32, node: Ipv4Addr, flags: u8) {
        self.syncer
            .store_mut()
            .set_uplinks(&[(ifindex, proxy_common::Uplink::new(be32(node), flags))])
            .expect("write the uplink map");
        self.uplink = Some(ifindex);
    }

    /// Gives the uplink `ifindex` the IPv6 address `addr` (`None`: it has
    /// none), writing the IPv6 uplink map directly.
    pub fn set_uplink6(&mut self, ifindex: u32, addr: Option<Ipv6Addr>) {
        let ebpf = &mut self.ebpf;
        let uplinks6 = self.uplinks6.get_or_insert_with(|| {
            HashMap::try_from(ebpf.take_map(names::UPLINKS6).expect("the IPv6 uplink map"))
                .expect("IPv6 uplink map")
        });
        let addr_be = addr.map(|a| addr6_be(a.octets())).unwrap_or([0; 4]);
        uplinks6
            .insert(ifindex, Uplink6 { addr_be }, 0)
            .expect("write the IPv6 uplink");
    }

    /// The IPv6 uplink map's entry for `ifindex`.
    pub fn uplink6_entry(&self, ifindex: u32) -> Option<Uplink6> {
        self.uplinks6.as_ref()?.get(&ifindex, 0).ok()
    }

    fn uplink(&self) -> u32 {
        self.uplink
            .expect("an uplink hook without an uplink: call set_uplink first")
    }

    /// The verdict of the program at `hook` on `frame`, and the frame as it
    /// left it.
    pub fn run(&mut self, hook: impl Into<Hook>, frame: &[u8]) -> (u32, Vec<u8>) {
        self.try_run(hook, frame).expect("BPF_PROG_TEST_RUN")
    }

    /// [`Loaded::run`], with the test run's failure returned.
    pub fn try_run(
        &mut self,
        hook: impl Into<Hook>,
        frame: &[u8],
    ) -> Result<(u32, Vec<u8>), ProgramError> {
        match hook.into() {
            Hook::Tc(program) => self.try_tc(program, frame, None),
            Hook::Xdp => self.try_xdp(frame, None),
            Hook::UplinkTc(program) => {
                let uplink = self.uplink();
                self.try_tc(program, frame, Some(&skb_ctx(uplink, uplink)))
            }
            Hook::UplinkXdp => {
                let uplink = self.uplink();
                self.try_xdp(frame, Some(uplink))
            }
        }
    }

    /// A packet the uplink sends (tc egress: `sb_to_pod`, which reverses a
    /// local backend's replies).
    pub fn run_egress(&mut self, frame: &[u8]) -> (u32, Vec<u8>) {
        self.run(Hook::UplinkTc(programs::TC_TO_UPLINK), frame)
    }

    /// A packet a pod of this node sends (`sb_from_pod`, no context needed).
    pub fn run_from_pod(&mut self, frame: &[u8]) -> (u32, Vec<u8>) {
        self.run(programs::TC_FROM_POD, frame)
    }

    /// Runs `cases` in order, each through its hook, and fails listing every
    /// case whose verdict or output differs, or whose output fails
    /// `checksums_hold(case, verdict, output)`.
    pub fn run_table(
        &mut self,
        cases: &[Case],
        checksums_hold: impl Fn(&Case, u32, &[u8]) -> bool,
    ) {
        let mut failures = Vec::new();
        for case in cases {
            let (verdict, output) = self.run(case.hook, &case.input);
            if verdict != case.verdict || output != case.output {
                let differs = (0..output.len().max(case.output.len()))
                    .find(|&i| output.get(i) != case.output.get(i));
                failures.push(format!(
                    "{:?}: {}: verdict {verdict:#x} (want {:#x}); output {}\n  got  {}\n  want {}",
                    case.hook,
                    case.name,
                    case.verdict,
                    match differs {
                        None => "as expected".to_owned(),
                        Some(at) => format!("differs at byte {at}"),
                    },
                    hex(&output),
                    hex(&case.output),
                ));
            }
            if !checksums_hold(case, verdict, &output) {
                failures.push(format!("{:?}: {}: checksums invalid", case.hook, case.name));
            }
        }
        assert!(
            failures.is_empty(),
            "failing fixtures:\n{}",
            failures.join("\n")
        );
    }

    /// The verdict of tc program `program` on `frame`, and the frame as it
    /// left it; `ctx` is the __sk_buff given to it ([`skb_ctx`]), if any.
    pub fn tc(
        &mut self,
        program: &'static str,
        frame: &[u8],
        ctx: Option<&[u8]>,
    ) -> (u32, Vec<u8>) {
        self.try_tc(program, frame, ctx).expect("BPF_PROG_TEST_RUN")
    }

    /// [`Loaded::tc`], with the test run's failure returned.
    pub fn try_tc(
        &mut self,
        program: &'static str,
        frame: &[u8],
        ctx: Option<&[u8]>,
    ) -> Result<(u32, Vec<u8>), ProgramError> {
        let tc: &mut SchedClassifier = loaded_program(&mut self.ebpf, program);
        test_run(tc, frame, ctx)
    }

    /// The verdict of the XDP uplink program on `frame`, and the frame as it
    /// left it, or the test run's failure; with `ingress_ifindex`, as if it
    /// arrived on that interface (an [`xdp_ctx`]), else with no context at
    /// all.
    pub fn try_xdp(
        &mut self,
        frame: &[u8],
        ingress_ifindex: Option<u32>,
    ) -> Result<(u32, Vec<u8>), ProgramError> {
        let ctx = ingress_ifindex.map(|ifindex| xdp_ctx(frame.len(), ifindex));
        let xdp: &mut Xdp = loaded_program(&mut self.ebpf, programs::XDP_UPLINK);
        let Some(ctx) = ctx else {
            return test_run(xdp, frame, None);
        };
        // The kernel's output starts at the metadata a program put before
        // the frame; the context it gives back says how long that is
        // (`data`, from the start of the metadata).
        let mut ctx_out = [0u8; 24];
        let (verdict, mut out) = test_run_with(xdp, frame, Some(&ctx), Some(&mut ctx_out))?;
        let meta = u32::from_ne_bytes([ctx_out[0], ctx_out[1], ctx_out[2], ctx_out[3]]);
        out.drain(..(meta as usize).min(out.len()));
        Ok((verdict, out))
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

    /// The connection-tracking table's generation (the flow caches').
    pub fn ct_generation(&self) -> u64 {
        self.syncer
            .store()
            .ct_generation()
            .expect("the loaded object's SB_CT_GEN_V1")
    }

    /// How many IPv4 conntrack entries there are.
    pub fn ct_entries(&self) -> usize {
        self.syncer
            .store()
            .conntrack
            .keys()
            .filter_map(Result::ok)
            .count()
    }

    /// The packets, new flows and packets dropped for want of a backend of
    /// the service `id`.
    pub fn service_packets(&self, id: u32) -> (u64, u64, u64) {
        let s = self.syncer.store().service_stats(id);
        (s.packets, s.new_flows, s.drops_no_backend)
    }

    /// The `switchboard services` row of the Service `test/name`.
    pub fn service_row(&self, name: &str) -> proxy_user::dataplane::maps::readback::ServiceRow {
        let rows = proxy_user::dataplane::maps::readback::read_services(self.syncer.store());
        let names: Vec<String> = rows.iter().map(|r| r.service.clone()).collect();
        rows.into_iter()
            .find(|r| r.service == format!("test/{name}"))
            .unwrap_or_else(|| panic!("no service row test/{name} among {names:?}"))
    }
}

/// Whether a frame's checksums hold, in family `A`, where the program
/// changed it.
pub fn rewritten_checksums<A: netns::Family>(case: &Case, _: u32, output: &[u8]) -> bool {
    output == case.input || A::checksums_valid(output, &case.input)
}

/// Whether a translated frame's checksums hold, in family `A`: judged on
/// what the program passed on or sent back (`TC_ACT_OK`, `TC_ACT_REDIRECT`).
pub fn translated_checksums<A: netns::Family>(case: &Case, verdict: u32, output: &[u8]) -> bool {
    !matches!(verdict, TC_ACT_OK | TC_ACT_REDIRECT) || A::checksums_valid(output, &case.input)
}
