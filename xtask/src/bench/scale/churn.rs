//! Churn: the EndpointSlice changes per second an agent with the cluster
//! source keeps up with, the maps never more than
//! [`CHURN_BEHIND_S`](targets::CHURN_BEHIND_S) behind.
//!
//! The bench changes slices through the fake API server at increasing rates
//! ([`ChurnPlan`]), with an HTTP PUT on one kept-alive connection, as a
//! controller writes them; each change replaces one endpoint of one filler
//! Service's slice (round robin, so one slice changes again only after
//! Services ÷ rate seconds) and stamped with
//! `endpoints.kubernetes.io/last-change-trigger-time` = now (RFC 3339, µs),
//! as the EndpointSlice controller stamps its changes. The agent observes
//! `now − trigger` for every slice a sync programmed into
//! `switchboard_network_programming_duration_seconds` (kube-proxy's network
//! programming latency). Between rates, the bench reads that histogram from
//! the agent's /metrics (never during a rate: a scrape walks the maps) and
//! takes the difference: how many changes were observed, how many above the
//! 0.1 s bucket. A rate passes when the bench really issued it (≥ 95 %),
//! every change was observed and none took longer than 100 ms; the run
//! stops at the first rate that fails. At the end, `switchboard services -o
//! json` (the pinned maps) must show every churned Service with the
//! backends of its last change.

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{anyhow, bail, Context as _, Result};
use serde_json::{json, Value};

use super::super::goals::targets::{self, CHURN_BEHIND_S};
use super::super::progress::note;
use super::super::results::{Churn, ChurnRate, FinalCheck};
use super::super::workload;
use crate::sandbox::{self, Sandbox};

const TRIGGER_ANNOTATION: &str = "endpoints.kubernetes.io/last-change-trigger-time";
const HISTOGRAM: &str = "switchboard_network_programming_duration_seconds";
/// The source recording an event → the map writes that applied it.
const EVENT_HISTOGRAM: &str = "switchboard_event_to_map_duration_seconds";
/// The share of the asked rate the bench must reach for the rate to count.
const ACHIEVED_MIN: f64 = 0.95;

pub struct ChurnPlan {
    /// Changes per second, in the order tried.
    pub rates: Vec<u32>,
    /// How long each rate runs.
    pub step: Duration,
}

impl ChurnPlan {
    pub fn new(quick: bool) -> ChurnPlan {
        ChurnPlan {
            rates: vec![100, 250, 500, 1000, 2000, 4000],
            step: Duration::from_secs(if quick { 2 } else { 5 }),
        }
    }

    /// One rate only: the event → map write measurement at
    /// [`EVENT_RATE`](targets::EVENT_RATE) changes per second.
    pub fn event_to_map(quick: bool) -> ChurnPlan {
        ChurnPlan {
            rates: vec![targets::EVENT_RATE],
            step: Duration::from_secs(if quick { 3 } else { 10 }),
        }
    }
}

/// The histogram as /metrics shows it: cumulative counts per upper bound,
/// and the count.
#[derive(Clone, Debug, Default, PartialEq)]
struct Histogram {
    buckets: Vec<(f64, f64)>,
    count: f64,
}

impl Histogram {
    fn parse(text: &str) -> Result<Histogram> {
        Histogram::parse_named(text, HISTOGRAM)
    }

    /// The histogram `name` in `text`.
    fn parse_named(text: &str, name: &str) -> Result<Histogram> {
        let bucket = format!("{name}_bucket{{le=\"");
        let count = format!("{name}_count ");
        let mut h = Histogram::default();
        let mut counted = false;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix(&bucket) {
                let (le, value) = rest
                    .split_once("\"}")
                    .ok_or_else(|| anyhow!("bad bucket line {line:?}"))?;
                let le = match le {
                    "+Inf" => f64::INFINITY,
                    le => le.parse()?,
                };
                let value: f64 = value
                    .split_whitespace()
                    .next()
                    .ok_or_else(|| anyhow!("bad bucket line {line:?}"))?
                    .parse()?;
                h.buckets.push((le, value));
            } else if let Some(v) = line.strip_prefix(&count) {
                h.count = v.trim().parse()?;
                counted = true;
            }
        }
        if !counted || h.buckets.is_empty() {
            bail!("no {name} histogram in /metrics");
        }
        h.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        Ok(h)
    }

    /// What was observed since `before`.
    fn since(&self, before: &Histogram) -> Histogram {
        let old = |le: f64| {
            before
                .buckets
                .iter()
                .find(|(b, _)| *b == le)
                .map_or(0.0, |(_, v)| *v)
        };
        Histogram {
            buckets: self
                .buckets
                .iter()
                .map(|&(le, v)| (le, v - old(le)))
                .collect(),
            count: self.count - before.count,
        }
    }

    /// The cumulative count at bound `le`, which must be a bucket bound.
    fn at(&self, le: f64) -> Result<f64> {
        self.buckets
            .iter()
            .find(|(b, _)| (b - le).abs() < 1e-9)
            .map(|(_, v)| *v)
            .ok_or_else(|| anyhow!("{HISTOGRAM} has no {le} s bucket"))
    }

    /// The smallest bound at or below which a `share` of the observations
    /// fall (`None`: none observed).
    fn bound(&self, share: f64) -> Option<f64> {
        if self.count <= 0.0 {
            return None;
        }
        self.buckets
            .iter()
            .find(|(_, v)| *v >= self.count * share)
            .map(|(le, _)| *le)
    }
}

/// One kept-alive HTTP/1.1 connection to the fake API server.
struct ApiClient {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
    host: String,
}

impl ApiClient {
    /// Connects from inside namespace `ns` (the socket stays there).
    fn connect(ns: &str, addr: SocketAddr) -> Result<ApiClient> {
        let stream = sandbox::in_netns(ns, || ApiClient::dial(addr))?;
        ApiClient::over(stream, addr)
    }

    fn dial(addr: SocketAddr) -> Result<TcpStream> {
        TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .with_context(|| format!("connect to the fake API server at {addr}"))
    }

    fn over(stream: TcpStream, addr: SocketAddr) -> Result<ApiClient> {
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(ApiClient {
            reader: BufReader::new(stream.try_clone()?),
            stream,
            host: addr.to_string(),
        })
    }

    /// `PUT path` with `body` (JSON); fails unless the answer is 2xx.
    fn put(&mut self, path: &str, body: &[u8]) -> Result<()> {
        let mut request = format!(
            "PUT {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            self.host,
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(body);
        self.stream.write_all(&request)?;
        let mut line = String::new();
        self.reader.read_line(&mut line)?;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| anyhow!("PUT {path}: bad status line {line:?}"))?;
        let mut length = None;
        let mut chunked = false;
        loop {
            line.clear();
            self.reader.read_line(&mut line)?;
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            let (name, value) = header.split_once(':').unwrap_or((header, ""));
            if name.eq_ignore_ascii_case("content-length") {
                length = Some(value.trim().parse::<usize>()?);
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                chunked = value.trim().eq_ignore_ascii_case("chunked");
            }
        }
        let mut answer = Vec::new();
        if chunked {
            loop {
                line.clear();
                self.reader.read_line(&mut line)?;
                let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)?;
                let mut chunk = vec![0; size + 2];
                self.reader.read_exact(&mut chunk)?;
                if size == 0 {
                    break;
                }
                answer.extend_from_slice(&chunk[..size]);
            }
        } else {
            let length = length.ok_or_else(|| anyhow!("PUT {path}: answer without a length"))?;
            answer.resize(length, 0);
            self.reader.read_exact(&mut answer)?;
        }
        if !(200..300).contains(&status) {
            bail!("PUT {path}: {status} {}", String::from_utf8_lossy(&answer));
        }
        Ok(())
    }
}

/// The network programming latency and the event → map write histograms.
fn scrape(sb: &Sandbox, metrics: SocketAddr) -> Result<(Histogram, Histogram)> {
    // At 100k Services /metrics carries every frontend's counters: a
    // scrape takes seconds.
    let r = sandbox::http_get(&sb.node_ns(), metrics, "/metrics", Duration::from_secs(120))?;
    if r.status != 200 {
        bail!("/metrics answered {}: {}", r.status, r.body);
    }
    Ok((
        Histogram::parse(&r.body)?,
        Histogram::parse_named(&r.body, EVENT_HISTOGRAM)?,
    ))
}

/// [`scrape`], waiting up to 60 s for /metrics: the agent serves it once its
/// programs took over, which at 100k Services comes a while after the
/// `maps synced` line the start measurement waits for.
fn first_scrape(sb: &Sandbox, metrics: SocketAddr) -> Result<(Histogram, Histogram)> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match scrape(sb, metrics) {
            Ok(found) => return Ok(found),
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(200)),
            Err(e) => return Err(e.context("/metrics did not answer within 60 s")),
        }
    }
}

/// A histogram's buckets as JSON (`[bound, count]`, `"+Inf"` for the last).
fn buckets_json(h: &Histogram) -> Vec<Value> {
    h.buckets
        .iter()
        .map(|(le, v)| {
            json!([
                if le.is_finite() {
                    json!(le)
                } else {
                    json!("+Inf")
                },
                v
            ])
        })
        .collect()
}

/// `t` as RFC 3339 in UTC with microseconds (`2024-05-01T12:00:00.123456Z`).
fn rfc3339_micros(t: SystemTime) -> String {
    crate::util::rfc3339(t, k8s_openapi::chrono::SecondsFormat::Micros)
}

/// The backends `svc` should show with its first endpoint replaced by `first`.
fn expected_backends(svc: &workload::Svc, first: Ipv4Addr) -> Vec<String> {
    let port = svc.ports[0].target;
    let mut v: Vec<String> = std::iter::once(first)
        .chain(svc.endpoints.iter().skip(1).copied())
        .map(|ip| format!("{ip}:{port}"))
        .collect();
    v.sort();
    v
}

/// Runs the rates on the agent in `sb` (synced to `services` from the fake
/// API server at `api`, serving /metrics on `metrics`, both in the node
/// namespace).
pub fn run(
    sb: &mut Sandbox,
    api: &str,
    switchboard: &Path,
    services: &[workload::Svc],
    metrics: &str,
    plan: &ChurnPlan,
) -> Result<Churn> {
    let metrics: SocketAddr = metrics.parse()?;
    let mut api = ApiClient::connect(&sb.node_ns(), api.parse()?)?;
    let fillers: Vec<usize> = services
        .iter()
        .enumerate()
        .filter(|(_, s)| s.name.starts_with("fill-") && !s.endpoints.is_empty())
        .map(|(i, _)| i)
        .collect();
    if fillers.is_empty() {
        bail!("churn: no filler Services to change");
    }
    // Filler index → the first endpoint of its last change.
    let mut last: BTreeMap<usize, Ipv4Addr> = BTreeMap::new();
    let mut cursor = 0usize;
    let mut seq = 0u32;
    let mut rows = Vec::new();
    let mut sustained: Option<u32> = None;
    let mut before = first_scrape(sb, metrics)?;
    for &rate in &plan.rates {
        let changes = (f64::from(rate) * plan.step.as_secs_f64()).round().max(2.0) as u64;
        let period = Duration::from_secs_f64(1.0 / f64::from(rate));
        let mut max_late = Duration::ZERO;
        let begun = Instant::now();
        let mut first_issue = begun;
        let mut last_issue = begun;
        for k in 0..changes {
            let due = begun + period.mul_f64(k as f64);
            let now = Instant::now();
            if now < due {
                std::thread::sleep(due - now);
            } else {
                max_late = max_late.max(now - due);
            }
            let idx = fillers[cursor % fillers.len()];
            cursor += 1;
            seq += 1;
            let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 160, 0, 0)) + seq);
            let mut svc = services[idx].clone();
            svc.endpoints[0] = ip;
            let mut slice = workload::slice_json(&svc);
            let path = format!(
                "/apis/discovery.k8s.io/v1/namespaces/{}/endpointslices/{}",
                svc.namespace,
                slice["metadata"]["name"].as_str().unwrap_or_default()
            );
            let issued = Instant::now();
            slice["metadata"]["annotations"] =
                json!({TRIGGER_ANNOTATION: rfc3339_micros(SystemTime::now())});
            api.put(&path, &serde_json::to_vec(&slice)?)?;
            if k == 0 {
                first_issue = issued;
            }
            last_issue = issued;
            last.insert(idx, ip);
        }
        let issuing = (last_issue - first_issue).as_secs_f64();
        let achieved = if issuing > 0.0 {
            (changes - 1) as f64 / issuing
        } else {
            f64::INFINITY
        };

        // Every change observed (or 15 s gone by): scrapes start only once
        // a passing rate has long been programmed.
        std::thread::sleep(Duration::from_millis(500));
        let deadline = Instant::now() + Duration::from_secs(15);
        let (seen, events) = loop {
            let now = scrape(sb, metrics)?;
            let seen = now.0.since(&before.0);
            if seen.count >= changes as f64 || Instant::now() > deadline {
                let events = now.1.since(&before.1);
                before = now;
                break (seen, events);
            }
            std::thread::sleep(Duration::from_secs(1));
        };
        let over = seen.count - seen.at(CHURN_BEHIND_S)?;
        let reached = achieved >= f64::from(rate) * ACHIEVED_MIN;
        let all_seen = seen.count == changes as f64;
        let passed = reached && all_seen && over == 0.0;
        let why = if passed {
            String::new()
        } else if !reached {
            format!(
                "the bench issued only {achieved:.0}/s (a limit of the bench, not of the agent)"
            )
        } else if !all_seen {
            format!("{} of {changes} changes observed", seen.count)
        } else {
            format!(
                "{over} changes took longer than {} ms",
                CHURN_BEHIND_S * 1e3
            )
        };
        note(&format!(
            "churn at {rate}/s: {changes} changes issued at {achieved:.0}/s, {} observed, {over} above {} ms, max ≤ {:?} s; event → map write p99 ≤ {:?} s, max ≤ {:?} s{}",
            seen.count,
            CHURN_BEHIND_S * 1e3,
            seen.bound(1.0),
            events.bound(0.99),
            events.bound(1.0),
            if passed { String::new() } else { format!(": not kept up ({why})") }
        ));
        let finite = |x: Option<f64>| x.filter(|x| x.is_finite());
        rows.push(ChurnRate {
            rate,
            seconds: plan.step.as_secs_f64(),
            changes,
            achieved_per_s: finite(Some(achieved)),
            driver_max_late_ms: max_late.as_secs_f64() * 1e3,
            observed: seen.count,
            over_behind: over,
            p50_le_s: finite(seen.bound(0.5)),
            p99_le_s: finite(seen.bound(0.99)),
            max_le_s: finite(seen.bound(1.0)),
            buckets: buckets_json(&seen),
            events: Some(events.count),
            event_p50_le_s: finite(events.bound(0.5)),
            event_p99_le_s: finite(events.bound(0.99)),
            event_max_le_s: finite(events.bound(1.0)),
            event_buckets: buckets_json(&events),
            passed,
            why,
        });
        if !passed {
            break;
        }
        sustained = Some(rate);
    }

    // The maps hold every churned Service's last change.
    let deadline = Instant::now() + Duration::from_secs(15);
    let (checked, mismatched, example) = loop {
        let frontends = sb.services(switchboard)?;
        let mut mismatched = 0usize;
        let mut example = None;
        for (&idx, &ip) in &last {
            let svc = &services[idx];
            let name = format!("{}/{}:{}", svc.namespace, svc.name, svc.ports[0].name);
            let want = expected_backends(svc, ip);
            let got = sandbox::find(&frontends, &name).map(sandbox::Frontend::backend_addrs);
            if got.as_ref() != Some(&want) {
                mismatched += 1;
                example
                    .get_or_insert_with(|| format!("{name}: maps {got:?}, last change {want:?}"));
            }
        }
        if mismatched == 0 || Instant::now() > deadline {
            break (last.len(), mismatched, example);
        }
        std::thread::sleep(Duration::from_secs(1));
    };
    note(&format!(
        "churn: sustained {} with the maps at most {} ms behind; maps after the last change: {} of {checked} churned Services as last changed{}",
        sustained.map_or("below the lowest rate".to_string(), |r| format!("{r} changes/s")),
        CHURN_BEHIND_S * 1e3,
        checked - mismatched,
        example.as_deref().map(|e| format!(" (e.g. {e})")).unwrap_or_default()
    ));
    Ok(Churn {
        services: services.len(),
        behind_s: CHURN_BEHIND_S,
        achieved_min: ACHIEVED_MIN,
        rates: rows,
        sustained_per_s: sustained,
        final_check: FinalCheck {
            services: checked,
            mismatched,
            example,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    #[test]
    fn rfc3339_with_microseconds() {
        assert_eq!(rfc3339_micros(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
        let t = UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789);
        assert_eq!(rfc3339_micros(t), "2023-11-14T22:13:20.123456Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400 + 86_399);
        assert_eq!(rfc3339_micros(leap), "2000-02-29T23:59:59.000000Z");
    }

    #[test]
    fn histogram_difference_and_bounds() {
        let text = |c: [u32; 4]| {
            format!(
                "# TYPE {HISTOGRAM} histogram\n{HISTOGRAM}_sum 1.0\n{HISTOGRAM}_count {}\n\
                 {HISTOGRAM}_bucket{{le=\"0.05\"}} {}\n{HISTOGRAM}_bucket{{le=\"0.1\"}} {}\n\
                 {HISTOGRAM}_bucket{{le=\"0.2\"}} {}\n{HISTOGRAM}_bucket{{le=\"+Inf\"}} {}\n",
                c[3], c[0], c[1], c[2], c[3]
            )
        };
        let before = Histogram::parse(&text([1, 1, 1, 1])).unwrap();
        let after = Histogram::parse(&text([90, 100, 101, 101])).unwrap();
        let seen = after.since(&before);
        assert_eq!(seen.count, 100.0);
        assert_eq!(seen.count - seen.at(0.1).unwrap(), 1.0);
        assert_eq!(seen.bound(0.5), Some(0.05));
        assert_eq!(seen.bound(0.99), Some(0.1));
        assert_eq!(seen.bound(1.0), Some(0.2));
        assert!(seen.at(0.3).is_err());
        assert!(Histogram::parse("nothing").is_err());
    }

    #[test]
    fn puts_reach_the_fake_api_server_on_one_connection() {
        use crate::fake_apiserver::{FakeApiServer, Kind};
        let server = FakeApiServer::start("127.0.0.1:0").unwrap();
        let pods = [Ipv4Addr::new(10, 244, 1, 2)];
        let svc = workload::services(3, &pods).remove(0);
        server.apply(workload::slice_json(&svc)).unwrap();
        let name = format!("{}-abcde", svc.name);
        let path = format!("/apis/discovery.k8s.io/v1/namespaces/bench/endpointslices/{name}");
        let mut client =
            ApiClient::over(ApiClient::dial(server.addr()).unwrap(), server.addr()).unwrap();
        for stamp in ["2024-01-01T00:00:00.000001Z", "2024-01-01T00:00:00.000002Z"] {
            let mut slice = workload::slice_json(&svc);
            slice["metadata"]["annotations"] = json!({TRIGGER_ANNOTATION: stamp});
            client
                .put(&path, &serde_json::to_vec(&slice).unwrap())
                .unwrap();
            let stored = server.get(Kind::EndpointSlice, "bench", &name).unwrap();
            assert_eq!(stored["metadata"]["annotations"][TRIGGER_ANNOTATION], stamp);
        }
        let err = client
            .put(
                "/apis/discovery.k8s.io/v1/namespaces/bench/endpointslices/nothing",
                b"{}",
            )
            .unwrap_err();
        assert!(err.to_string().contains("404"), "{err:#}");
        assert_eq!(
            server
                .requests()
                .iter()
                .filter(|r| r.verb.is_some())
                .count(),
            3,
            "three requests"
        );
    }

    #[test]
    fn expected_backends_replace_the_first() {
        let pods = [Ipv4Addr::new(10, 244, 1, 2)];
        let all = workload::services(3, &pods);
        let svc = all.iter().find(|s| s.name == "fill-0").unwrap();
        let want = expected_backends(svc, Ipv4Addr::new(10, 160, 0, 1));
        assert_eq!(want.len(), svc.endpoints.len());
        assert!(want.contains(&"10.160.0.1:8080".to_string()));
        assert!(!want.contains(&format!("{}:8080", svc.endpoints[0])));
    }
}
