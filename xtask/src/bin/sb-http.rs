//! `sb-http`: the benchmark's pod server and its UDP and bulk clients
//! (`cargo xtask bench`). Standard library only.
//!
//! Server: `sb-http serve --name NAME [--http PORT] [--udp PORT] [--bulk PORT] [--threads N]
//! [--light PORT]`
//! - HTTP/1.1 on `--http`: answers every request with `200 OK` and the body
//!   `NAME\n`. Keep-alive unless the request says `Connection: close`, in which
//!   case the server closes after the response (so the server side, not the
//!   client, holds TIME_WAIT, as with nginx). `--threads` threads block in
//!   `accept` on the same socket.
//! - The light server on `--light`: as little work per connection as an HTTP
//!   server can do, for the benchmark's light workload. One thread accepts
//!   (the socket has `TCP_DEFER_ACCEPT`, so a connection is handed over
//!   once its request has arrived), reads the request, writes one fixed
//!   `200 OK` with an empty body and `Connection: close`, and closes (the
//!   server side holds TIME_WAIT here too): four system calls, no other
//!   thread woken.
//! - UDP echo on `--udp`: every datagram is sent back as it came.
//! - Bulk sink on `--bulk`: reads and discards until the peer closes.
//!
//! Clients (print one JSON object on stdout):
//! - `sb-http udp --addr IP:PORT --flows N --duration-ms MS`: N threads, each
//!   one socket (one flow) doing request/response in lockstep; rate, p50/p99.
//! - `sb-http bulk --addr IP:PORT --duration-ms MS`: one TCP stream, writes
//!   128 KiB buffers; bytes per second.
//!
//! Every process asks the kernel to kill it when its parent dies.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn main() -> ExitCode {
    die_with_parent();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("serve") => serve(&args[1..]),
        Some("udp") => udp_client(&args[1..]),
        Some("bulk") => bulk_client(&args[1..]),
        _ => Err("usage: sb-http (serve | udp | bulk) [options]".to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sb-http: {e}");
            ExitCode::FAILURE
        }
    }
}

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
    // SAFETY: getppid has no preconditions.
    if unsafe { libc::getppid() } == 1 {
        std::process::exit(1);
    }
}

/// `--key value` pairs.
fn opt(args: &[String], key: &str) -> Option<String> {
    args.iter()
        .position(|a| a == key)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

fn opt_parse<T: std::str::FromStr>(
    args: &[String],
    key: &str,
    default: Option<T>,
) -> Result<T, String> {
    match opt(args, key) {
        Some(v) => v.parse().map_err(|_| format!("bad value for {key}: {v}")),
        None => default.ok_or_else(|| format!("{key} is required")),
    }
}

fn serve(args: &[String]) -> Result<(), String> {
    let name = opt(args, "--name").unwrap_or_else(|| "pod".into());
    let threads: usize = opt_parse(args, "--threads", Some(16))?;
    let mut handles = Vec::new();
    if let Some(port) = opt(args, "--http") {
        let listener = TcpListener::bind(format!("0.0.0.0:{port}"))
            .map_err(|e| format!("bind http {port}: {e}"))?;
        let listener = Arc::new(listener);
        let body = format!("{name}\n");
        for _ in 0..threads {
            let (listener, body) = (listener.clone(), body.clone());
            handles.push(std::thread::spawn(move || loop {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let _ = http_conn(stream, &body);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(1)),
                }
            }));
        }
    }
    if let Some(port) = opt(args, "--light") {
        let listener = TcpListener::bind(format!("0.0.0.0:{port}"))
            .map_err(|e| format!("bind light {port}: {e}"))?;
        defer_accept(&listener).map_err(|e| format!("light {port}: TCP_DEFER_ACCEPT: {e}"))?;
        handles.push(std::thread::spawn(move || loop {
            match listener.accept() {
                Ok((stream, _)) => {
                    let _ = light_conn(stream);
                }
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
        }));
    }
    if let Some(port) = opt(args, "--udp") {
        let socket = UdpSocket::bind(format!("0.0.0.0:{port}"))
            .map_err(|e| format!("bind udp {port}: {e}"))?;
        for _ in 0..threads.min(2) {
            let socket = socket.try_clone().map_err(|e| e.to_string())?;
            handles.push(std::thread::spawn(move || {
                let mut buf = [0u8; 2048];
                loop {
                    if let Ok((n, peer)) = socket.recv_from(&mut buf) {
                        let _ = socket.send_to(&buf[..n], peer);
                    }
                }
            }));
        }
    }
    if let Some(port) = opt(args, "--bulk") {
        let listener = TcpListener::bind(format!("0.0.0.0:{port}"))
            .map_err(|e| format!("bind bulk {port}: {e}"))?;
        handles.push(std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut stream = stream;
                    let mut buf = vec![0u8; 256 * 1024];
                    while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
                });
            }
        }));
    }
    if handles.is_empty() {
        return Err("give --http, --light, --udp and/or --bulk".into());
    }
    eprintln!("sb-http: {name} serving");
    for h in handles {
        let _ = h.join();
    }
    Ok(())
}

/// Serves requests on one connection until the client closes or asks to close.
fn http_conn(mut stream: TcpStream, body: &str) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut buf = [0u8; 4096];
    let mut have = 0usize;
    loop {
        // Read until the end of the request headers.
        let end = loop {
            if let Some(pos) = find(&buf[..have], b"\r\n\r\n") {
                break pos + 4;
            }
            if have == buf.len() {
                return Ok(()); // request too large for a benchmark: drop it
            }
            let n = stream.read(&mut buf[have..])?;
            if n == 0 {
                return Ok(());
            }
            have += n;
        };
        let close = contains_ignore_case(&buf[..end], b"connection: close");
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n{}\r\n{}",
            body.len(),
            if close { "Connection: close\r\n" } else { "" },
            body
        );
        stream.write_all(response.as_bytes())?;
        if close {
            return Ok(()); // dropping the stream closes it: server side closes first
        }
        buf.copy_within(end..have, 0);
        have -= end;
    }
}

/// The light server's one answer.
const LIGHT_RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";

/// Hands a connection to `accept` only once data has arrived on it (up to 1 s
/// after the handshake), so the light server's read does not wait.
fn defer_accept(listener: &TcpListener) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let secs: libc::c_int = 1;
    // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from a live c_int
    // on a socket this process owns.
    let rc = unsafe {
        libc::setsockopt(
            listener.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&secs as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// One connection of the light server: reads the request (to its blank
/// line, so no unread byte turns the close into a reset), answers, closes.
fn light_conn(mut stream: TcpStream) -> std::io::Result<()> {
    let mut buf = [0u8; 1024];
    let mut have = 0usize;
    while find(&buf[..have], b"\r\n\r\n").is_none() && have < buf.len() {
        let n = stream.read(&mut buf[have..])?;
        if n == 0 {
            return Ok(());
        }
        have += n;
    }
    stream.write_all(LIGHT_RESPONSE)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn contains_ignore_case(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle))
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    f64::from(sorted[idx.min(sorted.len() - 1)])
}

fn udp_client(args: &[String]) -> Result<(), String> {
    let addr: SocketAddr = opt_parse(args, "--addr", None)?;
    let flows: usize = opt_parse(args, "--flows", Some(8))?;
    let duration = Duration::from_millis(opt_parse(args, "--duration-ms", Some(3000))?);
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for _ in 0..flows {
        let stop = stop.clone();
        handles.push(std::thread::spawn(
            move || -> Result<(Vec<u32>, u64), String> {
                let socket = UdpSocket::bind("0.0.0.0:0").map_err(|e| e.to_string())?;
                socket.connect(addr).map_err(|e| e.to_string())?;
                socket
                    .set_read_timeout(Some(Duration::from_millis(200)))
                    .map_err(|e| e.to_string())?;
                let payload = [0x5au8; 32];
                let mut buf = [0u8; 2048];
                let mut lat = Vec::with_capacity(1 << 16);
                let mut timeouts = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    socket.send(&payload).map_err(|e| e.to_string())?;
                    match socket.recv(&mut buf) {
                        Ok(_) => lat.push(t.elapsed().as_micros().min(u128::from(u32::MAX)) as u32),
                        Err(_) => timeouts += 1,
                    }
                }
                Ok((lat, timeouts))
            },
        ));
    }
    let started = Instant::now();
    std::thread::sleep(duration);
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    let mut timeouts = 0;
    for h in handles {
        let (lat, t) = h
            .join()
            .map_err(|_| "client thread panicked".to_string())??;
        all.extend(lat);
        timeouts += t;
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort_unstable();
    println!(
        "{{\"requests\":{},\"timeouts\":{},\"seconds\":{:.3},\"rate\":{:.1},\"p50_us\":{},\"p99_us\":{}}}",
        all.len(),
        timeouts,
        elapsed,
        all.len() as f64 / elapsed,
        percentile(&all, 0.50),
        percentile(&all, 0.99)
    );
    Ok(())
}

fn bulk_client(args: &[String]) -> Result<(), String> {
    let addr: SocketAddr = opt_parse(args, "--addr", None)?;
    let duration = Duration::from_millis(opt_parse(args, "--duration-ms", Some(3000))?);
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let buf = vec![0x42u8; 128 * 1024];
    let started = Instant::now();
    let mut bytes = 0u64;
    while started.elapsed() < duration {
        stream.write_all(&buf).map_err(|e| format!("write: {e}"))?;
        bytes += buf.len() as u64;
    }
    stream
        .shutdown(std::net::Shutdown::Write)
        .map_err(|e| e.to_string())?;
    // Wait for the server to finish reading (it closes on EOF).
    let mut sink = [0u8; 64];
    let _ = stream.read(&mut sink);
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "{{\"bytes\":{bytes},\"seconds\":{elapsed:.3},\"gbit_s\":{:.3}}}",
        bytes as f64 * 8.0 / elapsed / 1e9
    );
    Ok(())
}
