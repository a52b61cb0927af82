//! `switchboard trace`: streams the data path's events from the running
//! agent ([`crate::observe::trace`]) and prints each as it comes, one line
//! for people or one JSON object for scripts, until interrupted (or
//! `--count` events, or `--duration`).
use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use super::{Common, Done, Output};
use crate::observe::trace::{FilterSpec, Record, REQUEST};
use crate::observe::verify::socket_path;

/// What to stream.
#[derive(clap::Args, Clone, Debug)]
pub struct TraceArgs {
    /// Only this Service: `namespace/name` (every port) or
    /// `namespace/name:port`.
    #[arg(long)]
    pub service: Option<String>,
    /// Only flows to this frontend: `IP` or `IP:PORT` (`[IPv6]:PORT`).
    #[arg(long, value_name = "IP[:PORT]")]
    pub frontend: Option<String>,
    /// Only flows from this client: `IP` or a CIDR block.
    #[arg(long, value_name = "IP|CIDR")]
    pub client: Option<String>,
    /// Only flows given this backend: `IP` or `IP:PORT`.
    #[arg(long, value_name = "IP[:PORT]")]
    pub backend: Option<String>,
    /// Only `tcp` or `udp`.
    #[arg(long)]
    pub protocol: Option<String>,
    /// Only these event types (comma-separated): `drop` (with its reason:
    /// no backend, rejected, connection tracking full, SNAT ports
    /// exhausted, malformed, unknown fragment, no route, ...), `new-flow`
    /// (client, frontend, backend, layer, algorithm), `revnat-miss` (a
    /// packet to a source-NAT port whose flow is not tracked). Default: all.
    #[arg(long = "type", value_delimiter = ',', value_name = "TYPE")]
    pub types: Vec<String>,
    /// Stop after this many events.
    #[arg(long)]
    pub count: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long, value_name = "SECONDS")]
    pub duration: Option<f64>,
}

impl TraceArgs {
    fn spec(&self) -> FilterSpec {
        FilterSpec {
            types: self.types.clone(),
            service: self.service.clone(),
            frontend: self.frontend.clone(),
            client: self.client.clone(),
            backend: self.backend.clone(),
            protocol: self.protocol.clone(),
        }
    }
}

pub fn run(common: &Common, args: &TraceArgs) -> anyhow::Result<Done> {
    // Refused here already, with the same words the agent would use.
    crate::observe::trace::Filter::try_from(&args.spec()).map_err(anyhow::Error::msg)?;
    let path = socket_path(&common.pin_root);
    let mut stream = UnixStream::connect(&path).with_context(|| {
        format!(
            "no agent answers on {} (is one running for this --pin-root?)",
            path.display()
        )
    })?;
    let request = serde_json::to_string(&args.spec())?;
    stream
        .write_all(format!("{REQUEST} {request}\n").as_bytes())
        .context("sending the request")?;
    let deadline = args
        .duration
        .map(|s| Instant::now() + Duration::from_secs_f64(s.max(0.0)));
    let mut reader = BufReader::new(stream.try_clone()?);
    let (mut events, mut line) = (0u64, String::new());
    let mut out = std::io::stdout().lock();
    while args.count.is_none_or(|n| events < n) {
        if let Some(deadline) = deadline {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                break;
            };
            stream.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
        }
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) => bail!("the agent closed the stream"),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                break
            }
            Err(e) => return Err(e).context("reading the stream"),
        }
        let record: Record = serde_json::from_str(line.trim_end())
            .with_context(|| format!("a line the agent sent: {line:?}"))?;
        let text = match (&record, common.output) {
            (Record::Error { error }, _) => bail!("the agent refused: {error}"),
            (Record::Event(_), Output::Json) | (Record::Lost { .. }, Output::Json) => line.clone(),
            (Record::Event(event), Output::Table) => format!("{}\n", event.render()),
            (Record::Lost { kernel, reader }, Output::Table) => format!(
                "# lost {} events (ring buffer full: {kernel}, this reader too slow: {reader})\n",
                kernel + reader
            ),
        };
        if matches!(record, Record::Event(_)) {
            events += 1;
        }
        match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => break,
            other => other?,
        }
    }
    Ok(Done::ok(String::new()))
}
