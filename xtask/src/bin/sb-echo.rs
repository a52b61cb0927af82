//! `sb-echo`: the tiny pod server of the demo and the end-to-end tests, plus a
//! client mode that the tests and the demo run from the client namespace.
//!
//! Server: `sb-echo --name NAME --tcp PORT --udp PORT`
//! - TCP: on accept, writes `NAME <peer-ip>:<peer-port>\n`; then, for every line
//!   received, writes the same line again (padded to M bytes for a line
//!   starting `reply=M `), until the client closes.
//! - UDP: answers every datagram with `NAME <peer-ip>:<peer-port>\n`, padded
//!   with spaces to the request's size when the request is longer.
//!
//! Client: `sb-echo client (--tcp ADDR | --udp ADDR) [--count N | --duration-ms MS]
//! [--interval-ms MS] [--timeout-ms MS] [--hold SECS] [--udp-mode MODE]`
//! prints one line per attempt:
//! - `ok <start-unix-ms> <pod-name> <peer-the-pod-saw> <peer-the-client-saw>`
//! - `err <start-unix-ms> <message>`
//!
//! and exits 1 if any attempt failed. `--hold SECS` keeps one TCP connection
//! open, sends a line every 100 ms and fails on the first missing reply.
//! `--udp-mode` picks how UDP attempts use sockets: `fresh` (a new socket per
//! attempt, the default), `shared` (one unconnected socket for every attempt)
//! or `connected` (one connected socket, replaced by a new one after an error,
//! as a stub resolver does; the peer shown is `getpeername`'s).
//! `--udp-size N` sends N-byte datagrams (fragmented above the path MTU) and
//! wants N-byte answers; `--tcp-size N` sends, after the greeting, one line
//! of N bytes and waits for its answer (path-MTU discovery must work for a
//! line longer than the path MTU to arrive). `--tcp-reply-size M` asks for
//! an M-byte answer to that line (or to a short one without `--tcp-size`):
//! the line starts with `reply=M `, and the server answers such a line with
//! its greeting padded with spaces to M bytes (the last one a newline).
//! `--idle-until-stdin` opens one TCP connection, prints `connected NAME
//! POD-SAW CLIENT-SAW`, leaves it idle until a line arrives on standard input
//! and then sends `--count` lines that the same pod must answer.
//! `--keep-until-stdin` with `--udp` opens `--count` connected UDP sockets,
//! one exchange on each (a line each), prints `held N`, keeps them all open
//! until a line arrives on standard input, and then makes one more exchange
//! on each, which must be answered by the pod that answered it first, and
//! whose peer (`getpeername`) must be the same (a line each).
//! `--sport N` sends every attempt from source port N (the socket is bound
//! to the unspecified address of its family, port N, before it sends or connects, with SO_REUSEADDR), so a test
//! can repeat one 5-tuple; a TCP attempt then ends with a reset
//! (SO_LINGER 0) instead of a FIN, which leaves no TIME_WAIT behind and
//! lets the next attempt from N connect to the same address again.
//!
//! The process asks the kernel to kill it when its parent dies, so a crashed
//! test or demo leaves no servers behind.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(name = "sb-echo", about = "switchboard test pod server (and client)")]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Cmd>,
    #[command(flatten)]
    server: ServerArgs,
}

#[derive(Args)]
struct ServerArgs {
    /// Name this pod answers with.
    #[arg(long)]
    name: Option<String>,
    /// TCP port to listen on (all addresses).
    #[arg(long)]
    tcp: Option<u16>,
    /// UDP port to listen on (all addresses).
    #[arg(long)]
    udp: Option<u16>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Connect to a server and print who answered.
    #[command(hide = true)]
    Client(ClientArgs),
    /// Send TCP SYNs with spoofed random sources as fast as possible (a raw
    /// socket; root, in a test namespace only).
    #[command(hide = true)]
    Synflood(SynfloodArgs),
}

#[derive(Args)]
struct SynfloodArgs {
    /// The address SYNs go to.
    #[arg(long)]
    to: std::net::SocketAddrV4,
    /// The block the spoofed sources are drawn from (default: the
    /// benchmarking range, never a real host's).
    #[arg(long, default_value = "198.18.0.0/15")]
    sources: String,
    /// How long to send.
    #[arg(long, default_value_t = 10_000)]
    duration_ms: u64,
    /// Distinct SYNs prepared (source address and port), sent in turn.
    #[arg(long, default_value_t = 65_536)]
    flows: u32,
    /// Stop once this many SYNs were sent (or `--duration-ms` is up,
    /// whichever comes first).
    #[arg(long)]
    count: Option<u64>,
}

#[derive(Args)]
struct ClientArgs {
    /// TCP address to connect to (new connection per attempt).
    #[arg(long, conflicts_with = "udp")]
    tcp: Option<SocketAddr>,
    /// UDP address to send to (new socket, so new source port, per attempt).
    #[arg(long)]
    udp: Option<SocketAddr>,
    /// Number of attempts.
    #[arg(long, default_value_t = 1)]
    count: u32,
    /// Instead of --count: keep making attempts until this many milliseconds
    /// have passed.
    #[arg(long)]
    duration_ms: Option<u64>,
    /// Pause between attempts, in milliseconds.
    #[arg(long, default_value_t = 0)]
    interval_ms: u64,
    /// Connect and read timeout per attempt, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    timeout_ms: u64,
    /// Keep one TCP connection for this many seconds, sending a line every 100 ms.
    #[arg(long, requires = "tcp")]
    hold: Option<f64>,
    /// Open one TCP connection, print `connected NAME PEER-POD-SAW
    /// PEER-CLIENT-SAW` once greeted, and leave it idle until a line arrives
    /// on standard input; then send `--count` lines, each of which must be
    /// answered by the same pod, and print the usual `ok`/`err` line.
    #[arg(long, requires = "tcp", conflicts_with = "hold")]
    idle_until_stdin: bool,
    /// Open `--count` connected UDP sockets, one exchange each, print
    /// `held N`, and keep them open until a line arrives on standard input;
    /// then one more exchange on each, answered by the same pod and from
    /// the same peer.
    #[arg(long, requires = "udp", conflicts_with_all = ["duration_ms", "sport"])]
    keep_until_stdin: bool,
    /// How UDP attempts use sockets.
    #[arg(long, value_enum, default_value_t = UdpMode::Fresh)]
    udp_mode: UdpMode,
    /// UDP: size of each datagram sent; the answer must be as long.
    #[arg(long, requires = "udp")]
    udp_size: Option<usize>,
    /// TCP: after the greeting, send one line of this many bytes and wait
    /// for its answer.
    #[arg(long, requires = "tcp")]
    tcp_size: Option<usize>,
    /// TCP: ask the server to answer the line with this many bytes (the
    /// greeting padded with spaces).
    #[arg(long, requires = "tcp")]
    tcp_reply_size: Option<usize>,
    /// Source port of every attempt (bind before sending or connecting);
    /// TCP attempts then close with a reset, leaving no TIME_WAIT.
    #[arg(long)]
    sport: Option<u16>,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum UdpMode {
    /// A new unconnected socket per attempt.
    Fresh,
    /// One unconnected socket for every attempt.
    Shared,
    /// One connected socket, replaced after an error.
    Connected,
}

fn main() -> ExitCode {
    die_with_parent();
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Cmd::Client(args)) => client(args),
        Some(Cmd::Synflood(args)) => synflood(&args).map(|()| true),
        None => server(cli.server).map(|()| true),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("sb-echo: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Ask for SIGKILL when the parent exits (tests and the demo kill us anyway;
/// this covers a parent that crashed or was killed).
fn die_with_parent() {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number; no pointers.
    unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        );
    }
    // If the parent already died before prctl, we were reparented to init.
    // SAFETY: getppid has no preconditions.
    if unsafe { libc::getppid() } == 1 {
        std::process::exit(1);
    }
}

fn server(args: ServerArgs) -> Result<()> {
    let Some(name) = args.name else {
        bail!("--name is required in server mode (or use `sb-echo client ...`)");
    };
    if args.tcp.is_none() && args.udp.is_none() {
        bail!("give --tcp PORT and/or --udp PORT");
    }
    let mut threads = Vec::new();
    // One socket per family: the IPv6 one is IPv6-only, so an IPv4 client
    // is seen with its plain IPv4 address, never as `::ffff:a.b.c.d`.
    for family in [Family::V4, Family::V6] {
        if let Some(port) = args.udp {
            let socket = bind_server(family, port, socket2::Type::DGRAM)?;
            let name = name.clone();
            threads.push(std::thread::spawn(move || udp_server(socket.into(), &name)));
        }
        if let Some(port) = args.tcp {
            let socket = bind_server(family, port, socket2::Type::STREAM)?;
            socket
                .listen(1024)
                .with_context(|| format!("listen tcp {port}"))?;
            let name = name.clone();
            threads.push(std::thread::spawn(move || tcp_server(socket.into(), name)));
        }
    }
    eprintln!(
        "sb-echo: {name} listening (tcp {:?}, udp {:?})",
        args.tcp, args.udp
    );
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}

#[derive(Clone, Copy)]
enum Family {
    V4,
    V6,
}

/// The unspecified address of `family`, port `port`.
fn any_addr(family: Family, port: u16) -> SocketAddr {
    match family {
        Family::V4 => SocketAddr::from(([0, 0, 0, 0], port)),
        Family::V6 => SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port)),
    }
}

/// The unspecified address of `target`'s family, port `port`: where a client
/// binds before it sends or connects.
fn any_like(target: SocketAddr, port: u16) -> SocketAddr {
    any_addr(
        if target.is_ipv6() {
            Family::V6
        } else {
            Family::V4
        },
        port,
    )
}

/// A server socket on every address of `family` (IPv6: IPv6 only).
fn bind_server(family: Family, port: u16, ty: socket2::Type) -> Result<socket2::Socket> {
    use socket2::{Domain, SockAddr, Socket};
    let local = any_addr(family, port);
    let socket = Socket::new(Domain::for_address(local), ty, None).context("socket")?;
    if matches!(family, Family::V6) {
        socket.set_only_v6(true).context("IPV6_V6ONLY")?;
    }
    socket.set_reuse_address(true).context("SO_REUSEADDR")?;
    socket
        .bind(&SockAddr::from(local))
        .with_context(|| format!("bind {local}"))?;
    Ok(socket)
}

fn udp_server(socket: UdpSocket, name: &str) {
    let mut buf = vec![0u8; 65536];
    loop {
        match socket.recv_from(&mut buf) {
            Ok((n, peer)) => {
                let mut reply = format!("{name} {peer}\n").into_bytes();
                if n > reply.len() {
                    reply.resize(n, b' ');
                }
                if let Err(e) = socket.send_to(&reply, peer) {
                    eprintln!("sb-echo: udp send to {peer}: {e}");
                }
            }
            Err(e) => {
                eprintln!("sb-echo: udp recv: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

fn tcp_server(listener: TcpListener, name: String) {
    for conn in listener.incoming() {
        match conn {
            Ok(stream) => {
                let name = name.clone();
                std::thread::spawn(move || {
                    let _ = tcp_conn(stream, &name);
                });
            }
            Err(e) => {
                eprintln!("sb-echo: accept: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

fn tcp_conn(stream: TcpStream, name: &str) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let peer = stream.peer_addr()?;
    let line = format!("{name} {peer}\n");
    let mut writer = stream.try_clone()?;
    writer.write_all(line.as_bytes())?;
    let mut reader = BufReader::new(stream);
    let mut buf = String::new();
    loop {
        buf.clear();
        if reader.read_line(&mut buf)? == 0 {
            return Ok(());
        }
        writer.write_all(&answer_to(&buf, &line))?;
    }
}

/// The answer to `request`: `greeting`, padded with spaces to M bytes
/// (ending in a newline) when the request starts with `reply=M `.
fn answer_to(request: &str, greeting: &str) -> Vec<u8> {
    let wanted = request
        .strip_prefix("reply=")
        .and_then(|rest| rest.split(' ').next())
        .and_then(|m| m.parse::<usize>().ok());
    let mut answer = greeting.as_bytes().to_vec();
    if let Some(m) = wanted.filter(|&m| m > answer.len()) {
        answer.pop();
        answer.resize(m - 1, b' ');
        answer.push(b'\n');
    }
    answer
}

/// `--tcp-size` and `--tcp-reply-size`.
#[derive(Clone, Copy)]
struct LineSizes {
    request: Option<usize>,
    reply: Option<usize>,
}

/// The line `tcp_once` sends after the greeting, if any: `request` bytes
/// (at least the `reply=M ` prefix and a newline), `x`s after the prefix.
fn request_line(sizes: LineSizes) -> Option<Vec<u8>> {
    if sizes.request.is_none() && sizes.reply.is_none() {
        return None;
    }
    let mut line = match sizes.reply {
        Some(m) => format!("reply={m} ").into_bytes(),
        None => Vec::new(),
    };
    let size = sizes.request.unwrap_or(0).max(line.len() + 1);
    line.resize(size - 1, b'x');
    line.push(b'\n');
    Some(line)
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

/// Parses `NAME ADDR\n` as sent by the server.
fn parse_reply(line: &str) -> Result<(String, String)> {
    let mut parts = line.split_whitespace();
    match (parts.next(), parts.next(), parts.next()) {
        (Some(name), Some(addr), None) => Ok((name.to_string(), addr.to_string())),
        _ => bail!("unexpected reply {line:?}"),
    }
}

fn client(args: ClientArgs) -> Result<bool> {
    let timeout = Duration::from_millis(args.timeout_ms.max(1));
    if let (Some(addr), Some(secs)) = (args.tcp, args.hold) {
        return Ok(hold(addr, Duration::from_secs_f64(secs), timeout));
    }
    if let (Some(addr), true) = (args.tcp, args.idle_until_stdin) {
        return Ok(idle(addr, args.count, timeout));
    }
    if let (Some(addr), true) = (args.udp, args.keep_until_stdin) {
        return keep(addr, args.count, timeout);
    }
    let mut all_ok = true;
    let stdout = std::io::stdout();
    let began = Instant::now();
    let mut udp = UdpClient::new(args.udp_mode, args.udp_size, args.sport);
    let mut i = 0u64;
    loop {
        let more = match args.duration_ms {
            Some(ms) => began.elapsed() < Duration::from_millis(ms),
            None => i < u64::from(args.count),
        };
        if !more {
            break;
        }
        i += 1;
        if i > 1 && args.interval_ms > 0 {
            std::thread::sleep(Duration::from_millis(args.interval_ms));
        }
        let start = now_ms();
        let result = match (args.tcp, args.udp) {
            (Some(addr), _) => {
                let sizes = LineSizes {
                    request: args.tcp_size,
                    reply: args.tcp_reply_size,
                };
                tcp_once(addr, timeout, sizes, args.sport)
            }
            (None, Some(addr)) => udp.once(addr, timeout),
            (None, None) => bail!("give --tcp ADDR or --udp ADDR"),
        };
        let mut out = stdout.lock();
        match result {
            Ok((name, pod_saw, client_saw)) => {
                writeln!(out, "ok {start} {name} {pod_saw} {client_saw}")?
            }
            Err(e) => {
                all_ok = false;
                writeln!(out, "err {start} {e:#}")?
            }
        }
        out.flush()?;
    }
    Ok(all_ok)
}

fn tcp_once(
    addr: SocketAddr,
    timeout: Duration,
    sizes: LineSizes,
    sport: Option<u16>,
) -> Result<(String, String, SocketAddr)> {
    let stream = match sport {
        Some(port) => tcp_connect_from(port, addr, timeout)?,
        None => TcpStream::connect_timeout(&addr, timeout).context("connect")?,
    };
    stream.set_read_timeout(Some(timeout))?;
    let client_saw = stream.peer_addr()?;
    let mut line = String::new();
    let mut reader = BufReader::new(&stream);
    reader.read_line(&mut line).context("read greeting")?;
    let (name, pod_saw) = parse_reply(&line)?;
    if let Some(request) = request_line(sizes) {
        (&stream)
            .write_all(&request)
            .context("send the long line")?;
        let mut answer = String::new();
        reader
            .read_line(&mut answer)
            .with_context(|| format!("no answer to a line of {} bytes", request.len()))?;
        let want_len = sizes.reply.unwrap_or(0).max(line.len());
        if answer.len() != want_len || answer.trim_end() != line.trim_end() {
            bail!(
                "answer of {} bytes ({:?}...) differs from greeting {line:?} padded to {want_len}",
                answer.len(),
                answer.chars().take(80).collect::<String>()
            );
        }
    }
    Ok((name, pod_saw, client_saw))
}

/// `--sport`: a TCP connection from 0.0.0.0:`port` (SO_REUSEADDR) that
/// closes with a reset (SO_LINGER 0), so no TIME_WAIT blocks the next one.
fn tcp_connect_from(port: u16, addr: SocketAddr, timeout: Duration) -> Result<TcpStream> {
    use socket2::{Domain, Protocol, SockAddr, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
        .context("socket")?;
    socket.set_reuse_address(true).context("SO_REUSEADDR")?;
    socket
        .set_linger(Some(Duration::ZERO))
        .context("SO_LINGER")?;
    let local = any_like(addr, port);
    socket
        .bind(&SockAddr::from(local))
        .with_context(|| format!("bind {local}"))?;
    socket
        .connect_timeout(&SockAddr::from(addr), timeout)
        .context("connect")?;
    Ok(socket.into())
}

/// UDP attempts, with the socket kept between them as `--udp-mode` says.
struct UdpClient {
    mode: UdpMode,
    socket: Option<UdpSocket>,
    /// `--sport`: the port to bind (else any).
    sport: Option<u16>,
    /// `--udp-size`: the datagram to send, padded.
    request: Vec<u8>,
}

impl UdpClient {
    fn new(mode: UdpMode, size: Option<usize>, sport: Option<u16>) -> Self {
        let mut request = b"hello\n".to_vec();
        if let Some(size) = size {
            request.resize(size, b'x');
        }
        Self {
            mode,
            socket: None,
            sport,
            request,
        }
    }

    fn once(
        &mut self,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<(String, String, SocketAddr)> {
        let result = self.exchange(addr, timeout);
        if result.is_err() || self.mode == UdpMode::Fresh {
            // A resolver opens a new socket after an error.
            self.socket = None;
        }
        result
    }

    fn exchange(
        &mut self,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<(String, String, SocketAddr)> {
        if self.socket.is_none() {
            let local = any_like(addr, self.sport.unwrap_or(0));
            let socket = UdpSocket::bind(local).with_context(|| format!("bind {local}"))?;
            socket.set_read_timeout(Some(timeout))?;
            if self.mode == UdpMode::Connected {
                socket.connect(addr).context("connect")?;
            }
            self.socket = Some(socket);
        }
        let socket = self.socket.as_ref().context("no socket")?;
        let mut buf = vec![0u8; 65536];
        let (n, client_saw) = if self.mode == UdpMode::Connected {
            socket.send(&self.request).context("send")?;
            let n = socket.recv(&mut buf).context("recv")?;
            (n, socket.peer_addr().context("getpeername")?)
        } else {
            socket.send_to(&self.request, addr).context("send")?;
            socket.recv_from(&mut buf).context("recv")?
        };
        if self.request.len() > 64 && n != self.request.len() {
            bail!("answer of {n} bytes to a request of {}", self.request.len());
        }
        let (name, pod_saw) = parse_reply(&String::from_utf8_lossy(&buf[..n]))?;
        Ok((name, pod_saw, client_saw))
    }
}

/// A TCP connection to a pod that greets it with its name and then answers
/// every `ping` line with the same greeting.
struct Greeted {
    writer: TcpStream,
    reader: BufReader<TcpStream>,
    greeting: String,
    name: String,
    pod_saw: String,
    client_saw: SocketAddr,
}

impl Greeted {
    fn connect(addr: SocketAddr, timeout: Duration) -> Result<Self> {
        let stream = TcpStream::connect_timeout(&addr, timeout).context("connect")?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        let client_saw = stream.peer_addr()?;
        let writer = stream.try_clone()?;
        let mut reader = BufReader::new(stream);
        let mut greeting = String::new();
        reader.read_line(&mut greeting).context("read greeting")?;
        let (name, pod_saw) = parse_reply(&greeting)?;
        Ok(Self {
            writer,
            reader,
            greeting,
            name,
            pod_saw,
            client_saw,
        })
    }

    /// One `ping`, whose answer must be the greeting (the same pod);
    /// `replies` so far name the failure.
    fn ping(&mut self, replies: u32) -> Result<()> {
        self.writer
            .write_all(b"ping\n")
            .with_context(|| format!("send after {replies} replies"))?;
        let mut line = String::new();
        let n = self
            .reader
            .read_line(&mut line)
            .with_context(|| format!("reply missing after {replies} replies"))?;
        if n == 0 {
            bail!("connection closed after {replies} replies");
        }
        if line != self.greeting {
            bail!("reply {line:?} differs from greeting {:?}", self.greeting);
        }
        Ok(())
    }
}

/// Prints how a long-lived connection went (`ok ...` or `err ...`).
fn report(start: u128, result: Result<Greeted>, replies: u32) -> bool {
    match result {
        Ok(c) => {
            println!(
                "ok {start} {} {} {} replies={replies}",
                c.name, c.pod_saw, c.client_saw
            );
            true
        }
        Err(e) => {
            println!("err {start} {e:#} (replies={replies})");
            false
        }
    }
}

/// One TCP connection left idle until standard input says go, then `count`
/// lines, each answered with the greeting (so by the same pod).
fn idle(addr: SocketAddr, count: u32, timeout: Duration) -> bool {
    let start = now_ms();
    let mut replies = 0u32;
    let result = (|| -> Result<Greeted> {
        let mut conn = Greeted::connect(addr, timeout)?;
        println!(
            "connected {} {} {}",
            conn.name, conn.pod_saw, conn.client_saw
        );
        std::io::stdout().flush()?;
        let mut go = String::new();
        std::io::stdin()
            .read_line(&mut go)
            .context("wait on standard input")?;
        for _ in 0..count {
            conn.ping(replies)?;
            replies += 1;
        }
        Ok(conn)
    })();
    report(start, result, replies)
}

/// `--keep-until-stdin`: `count` connected UDP sockets kept open; each
/// exchanges once, then once more after a line on standard input, which
/// the same pod must answer from the same peer. Prints a line per
/// exchange; whether all went well.
fn keep(addr: SocketAddr, count: u32, timeout: Duration) -> Result<bool> {
    raise_open_files(u64::from(count) + 64);
    let mut all_ok = true;
    let mut out = std::io::stdout().lock();
    let mut kept = Vec::new();
    for _ in 0..count {
        let start = now_ms();
        let mut udp = UdpClient::new(UdpMode::Connected, None, None);
        match udp.exchange(addr, timeout) {
            Ok((name, pod_saw, client_saw)) => {
                writeln!(out, "ok {start} {name} {pod_saw} {client_saw}")?;
                kept.push((udp, name, client_saw));
            }
            Err(e) => {
                all_ok = false;
                writeln!(out, "err {start} {e:#}")?;
            }
        }
    }
    writeln!(out, "held {}", kept.len())?;
    out.flush()?;
    let mut go = String::new();
    std::io::stdin()
        .read_line(&mut go)
        .context("wait on standard input")?;
    for (mut udp, first, peer) in kept {
        let start = now_ms();
        match udp.exchange(addr, timeout) {
            Ok((name, pod_saw, client_saw)) if name == first && client_saw == peer => {
                writeln!(out, "ok {start} {name} {pod_saw} {client_saw}")?
            }
            Ok((name, _, client_saw)) => {
                all_ok = false;
                writeln!(
                    out,
                    "err {start} answered by {name} from {client_saw}, first by {first} from {peer}"
                )?
            }
            Err(e) => {
                all_ok = false;
                writeln!(out, "err {start} {e:#}")?
            }
        }
    }
    out.flush()?;
    Ok(all_ok)
}

/// Raises the soft limit of open files to `want` (within the hard limit).
fn raise_open_files(want: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid rlimit for the kernel to fill, then read.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < want {
            limit.rlim_cur = want.min(limit.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// One long-lived TCP connection: a line every 100 ms, each must be answered.
fn hold(addr: SocketAddr, duration: Duration, timeout: Duration) -> bool {
    let start = now_ms();
    let mut replies = 0u32;
    let result = (|| -> Result<Greeted> {
        let mut conn = Greeted::connect(addr, timeout)?;
        let began = Instant::now();
        while began.elapsed() < duration {
            std::thread::sleep(Duration::from_millis(100));
            conn.ping(replies)?;
            replies += 1;
        }
        Ok(conn)
    })();
    report(start, result, replies)
}

/// `a.b.c.d/len` as (first address, number of addresses).
fn parse_block(block: &str) -> Result<(u32, u32)> {
    let (addr, len) = block
        .split_once('/')
        .ok_or_else(|| anyhow::anyhow!("{block:?} is not a.b.c.d/len"))?;
    let addr: std::net::Ipv4Addr = addr
        .parse()
        .with_context(|| format!("{block:?}: address"))?;
    let len: u32 = len.parse().with_context(|| format!("{block:?}: length"))?;
    anyhow::ensure!((8..=32).contains(&len), "{block:?}: length must be 8..=32");
    let size = 1u32 << (32 - len);
    Ok((u32::from(addr) & !(size - 1), size))
}

/// The ones'-complement sum of `data` (as 16-bit big-endian words).
fn csum_add(mut sum: u32, data: &[u8]) -> u32 {
    for chunk in data.chunks(2) {
        let word = u16::from_be_bytes([chunk[0], *chunk.get(1).unwrap_or(&0)]);
        sum += u32::from(word);
    }
    sum
}

fn csum_fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An IPv4 packet holding a TCP SYN from `src:sport` to `to`, checksums set.
fn syn_packet(src: std::net::Ipv4Addr, sport: u16, to: std::net::SocketAddrV4) -> Vec<u8> {
    let mut p = vec![0u8; 40];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&40u16.to_be_bytes());
    p[8] = 64;
    p[9] = 6;
    p[12..16].copy_from_slice(&src.octets());
    p[16..20].copy_from_slice(&to.ip().octets());
    let ip_csum = csum_fold(csum_add(0, &p[..20]));
    p[10..12].copy_from_slice(&ip_csum.to_be_bytes());
    let t = 20;
    p[t..t + 2].copy_from_slice(&sport.to_be_bytes());
    p[t + 2..t + 4].copy_from_slice(&to.port().to_be_bytes());
    p[t + 4..t + 8].copy_from_slice(&u32::from(sport).wrapping_mul(2_654_435_761).to_be_bytes());
    p[t + 12] = 5 << 4;
    p[t + 13] = 0x02;
    p[t + 14..t + 16].copy_from_slice(&64_240u16.to_be_bytes());
    let mut pseudo = Vec::with_capacity(12);
    pseudo.extend_from_slice(&src.octets());
    pseudo.extend_from_slice(&to.ip().octets());
    pseudo.extend_from_slice(&[0, 6, 0, 20]);
    let tcp_csum = csum_fold(csum_add(csum_add(0, &pseudo), &p[t..]));
    p[t + 16..t + 18].copy_from_slice(&tcp_csum.to_be_bytes());
    p
}

/// Sends SYNs from random sources of `--sources` to `--to` until the time is
/// up (or `--count` were sent), through a raw IPv4 socket; prints `sent N in
/// S s`.
fn synflood(args: &SynfloodArgs) -> Result<()> {
    let (base, size) = parse_block(&args.sources)?;
    // xorshift, seeded from the clock: no two runs alike, no dependency.
    let mut state = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0x9e37_79b9)
        | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let packets: Vec<Vec<u8>> = (0..args.flows.max(1))
        .map(|_| {
            let r = next();
            let src = std::net::Ipv4Addr::from(base + (r as u32) % size);
            let sport = 1024 + ((r >> 32) as u16 % 60_000);
            syn_packet(src, sport, args.to)
        })
        .collect();
    // SAFETY: socket(2) with constant arguments; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
    anyhow::ensure!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
    let dst = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(args.to.ip().octets()),
        },
        sin_zero: [0; 8],
    };
    let started = std::time::Instant::now();
    let until = started + Duration::from_millis(args.duration_ms);
    let mut sent: u64 = 0;
    let mut tries: u64 = 0;
    'send: loop {
        for packet in &packets {
            // SAFETY: `packet` and `dst` outlive the call, lengths are theirs.
            let rc = unsafe {
                libc::sendto(
                    fd,
                    packet.as_ptr().cast(),
                    packet.len(),
                    0,
                    (&dst as *const libc::sockaddr_in).cast(),
                    std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                )
            };
            if rc >= 0 {
                sent += 1;
                if args.count.is_some_and(|count| sent >= count) {
                    break 'send;
                }
            }
            tries += 1;
            if tries.is_multiple_of(256) && std::time::Instant::now() >= until {
                break 'send;
            }
        }
    }
    // SAFETY: closes the socket opened above, once.
    unsafe { libc::close(fd) };
    println!("sent {sent} in {:.2} s", started.elapsed().as_secs_f64());
    Ok(())
}
