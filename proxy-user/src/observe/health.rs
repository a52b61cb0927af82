//! The agent's own health: `/healthz` and `/livez` on
//! `--healthz-bind-address` (default `0.0.0.0:10256`, kube-proxy's port).
//!
//! The rule is kube-proxy's (pkg/proxy/healthcheck, the proxier health
//! server): the agent is healthy unless a change has been queued for longer
//! than [`HEALTH_TIMEOUT`] without a sync following it. The agent calls
//! [`ProxyHealth::queued`] when a snapshot arrives (only the oldest pending
//! one counts) and [`ProxyHealth::updated`] when the sync that follows has
//! written the maps.
//!
//! * `/healthz` is also unhealthy while the node is being deleted (a
//!   deletionTimestamp, or the cluster autoscaler's `ToBeDeletedByClusterAutoscaler`
//!   taint; see [`ProxyHealth::set_node_eligible`]), so that load balancers
//!   probing 10256 stop sending new connections to a node about to go.
//! * `/livez` is the same check without the node: it is what a liveness probe
//!   should use, since a node being drained is no reason to restart the agent.
//! * Both answer 200 or 503 with `Content-Type: application/json` and
//!   `X-Content-Type-Options: nosniff`, and the body
//!   `{"lastUpdated": T,"currentTime": T, "nodeEligible": B}` (`/livez`
//!   without `nodeEligible`), for any method. As in kube-proxy, `lastUpdated`
//!   is the current time while healthy, and the last sync's time otherwise.
//!   Times are RFC 3339 (kube-proxy prints Go's `time.String()` form); a
//!   sync that never happened prints the zero time, `0001-01-01T00:00:00Z`.
//!   Other paths get 404.
//!
//! Startup: the agent starts this server right after the maps are loaded,
//! before the source's first snapshot. The start itself counts as a queued
//! change, so both endpoints answer 200 for up to [`HEALTH_TIMEOUT`] while
//! the agent catches up, and turn 503 only if the first sync has not finished
//! by then. kube-proxy behaves alike: its informers queue updates as they
//! list, and the health check fails only once those have waited longer than
//! its timeout. A sync that left some frontends unprogrammed (a full map)
//! still counts as a sync: everything else is programmed, and the failures
//! are logged, in the status file and in `/metrics`.
//!
//! Times are wall-clock ([`SystemTime`]), as kube-proxy's are; a clock
//! stepped backwards reads as "not late yet".

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use k8s_openapi::chrono::{DateTime, SecondsFormat, Utc};
use tokio::task::JoinHandle;
use tracing::info;

use crate::observe::healthcheck::{http_response, listen, serve_http};

/// How long a queued change may wait for a sync before the agent reports
/// itself unhealthy: kube-proxy's default (twice its 30 s sync period). The
/// agent syncs on every change, so a healthy agent stays far below it.
pub const HEALTH_TIMEOUT: Duration = Duration::from_secs(60);

/// A listen address could not be bound. Names the address and the flag.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr} (set by {flag}; an empty value turns the server off)")]
pub struct BindError {
    pub addr: SocketAddr,
    pub flag: &'static str,
    #[source]
    pub source: io::Error,
}

/// Binds `addr` for the server configured by `flag`.
pub(crate) fn bind(
    addr: SocketAddr,
    flag: &'static str,
) -> Result<tokio::net::TcpListener, BindError> {
    listen(addr).map_err(|source| BindError { addr, flag, source })
}

/// A running server; dropping it stops the server.
#[derive(Debug)]
pub struct Serving {
    /// Where it listens (the bound port when port 0 was asked for).
    pub local_addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Serving {
    /// Serves `handler` on `listener` (on the current tokio runtime).
    pub(crate) fn spawn<H, F>(
        listener: tokio::net::TcpListener,
        what: &'static str,
        handler: H,
    ) -> io::Result<Serving>
    where
        H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
        F: std::future::Future<Output = Response<Full<Bytes>>> + Send + 'static,
    {
        let local_addr = listener.local_addr()?;
        let task = tokio::spawn(serve_http(listener, what, handler));
        Ok(Serving { local_addr, task })
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Where "now" comes from: the system clock, or a test's.
pub type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// The health state the agent updates and the server reads. Clones share it.
#[derive(Clone)]
pub struct ProxyHealth {
    timeout: Duration,
    clock: Clock,
    state: Arc<Mutex<State>>,
}

#[derive(Clone, Copy, Debug)]
struct State {
    /// When the last sync finished (`None`: never).
    last_updated: Option<SystemTime>,
    /// The oldest change not yet followed by a sync (`None`: all synced).
    oldest_queued: Option<SystemTime>,
    /// False while the node is being deleted.
    node_eligible: bool,
    /// Which change the last sync programmed (see [`ProxyHealth::queued_change`]).
    synced_change: Option<u64>,
}

/// One health check's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub healthy: bool,
    /// kube-proxy's `lastUpdated`: now when healthy, else the last sync.
    pub last_updated: Option<SystemTime>,
    pub current_time: SystemTime,
    pub node_eligible: bool,
}

impl ProxyHealth {
    /// Starting now: healthy for `timeout` while the first sync is awaited.
    pub fn new(timeout: Duration) -> ProxyHealth {
        ProxyHealth::with_clock(timeout, Arc::new(SystemTime::now))
    }

    /// As [`ProxyHealth::new`], reading the time from `clock`.
    pub fn with_clock(timeout: Duration, clock: Clock) -> ProxyHealth {
        let started = clock();
        ProxyHealth {
            timeout,
            clock,
            state: Arc::new(Mutex::new(State {
                last_updated: None,
                oldest_queued: Some(started),
                node_eligible: true,
                synced_change: None,
            })),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is three plain fields: a panic elsewhere leaves it valid.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A change arrived and awaits a sync (only the oldest pending counts).
    pub fn queued(&self) {
        let now = (self.clock)();
        self.state().oldest_queued.get_or_insert(now);
    }

    /// Change `id` arrived (marked apart from the loop that syncs it, so a
    /// hung loop shows); nothing is queued when a sync already programmed
    /// that change or a later one (ids grow: the source's publish count).
    pub fn queued_change(&self, id: u64) {
        let now = (self.clock)();
        let mut state = self.state();
        if state.synced_change.is_none_or(|synced| synced < id) {
            state.oldest_queued.get_or_insert(now);
        }
    }

    /// A sync of change `id` finished: everything queued so far is programmed.
    pub fn updated_change(&self, id: u64) {
        self.updated();
        self.state().synced_change = Some(id);
    }

    /// A sync finished: everything queued so far is programmed.
    pub fn updated(&self) {
        let now = (self.clock)();
        let mut state = self.state();
        state.oldest_queued = None;
        state.last_updated = Some(now);
    }

    /// Whether the node may take traffic (false while it is being deleted).
    pub fn set_node_eligible(&self, eligible: bool) {
        let mut state = self.state();
        if state.node_eligible != eligible {
            info!(eligible, "node eligibility for /healthz changed");
        }
        state.node_eligible = eligible;
    }

    /// `/livez`: healthy unless a change waited past the timeout.
    pub fn livez(&self) -> Verdict {
        let now = (self.clock)();
        let state = *self.state();
        let late = state.oldest_queued.is_some_and(|queued| {
            now.duration_since(queued)
                .is_ok_and(|waited| waited >= self.timeout)
        });
        Verdict {
            healthy: !late,
            last_updated: if late { state.last_updated } else { Some(now) },
            current_time: now,
            node_eligible: state.node_eligible,
        }
    }

    /// `/healthz`: `/livez`, and the node is not being deleted.
    pub fn healthz(&self) -> Verdict {
        let mut verdict = self.livez();
        verdict.healthy &= verdict.node_eligible;
        if !verdict.node_eligible {
            // Unhealthy: report the real last sync, as kube-proxy does.
            verdict.last_updated = self.state().last_updated;
        }
        verdict
    }

    /// The answer to a request for `path`.
    pub fn respond(&self, path: &str) -> Response<Full<Bytes>> {
        match path {
            "/healthz" => verdict_response(&self.healthz(), true),
            "/livez" => verdict_response(&self.livez(), false),
            _ => http_response(
                StatusCode::NOT_FOUND,
                "text/plain; charset=utf-8",
                "404 page not found\n",
            ),
        }
    }

    /// Serves `/healthz` and `/livez` on `addr` (`--healthz-bind-address`).
    /// Must be called inside a tokio runtime.
    pub fn serve(&self, addr: SocketAddr) -> Result<Serving, BindError> {
        const FLAG: &str = "--healthz-bind-address";
        let listener = bind(addr, FLAG)?;
        let health = self.clone();
        let handler = move |request: Request<Incoming>| {
            let answer = health.respond(request.uri().path());
            async move { answer }
        };
        let serving = Serving::spawn(listener, "healthz", handler).map_err(|source| BindError {
            addr,
            flag: FLAG,
            source,
        })?;
        info!(addr = %serving.local_addr, "serving /healthz and /livez");
        Ok(serving)
    }
}

/// kube-proxy's fields, in its order.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Payload {
    last_updated: String,
    current_time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    node_eligible: Option<bool>,
}

fn verdict_response(verdict: &Verdict, with_node: bool) -> Response<Full<Bytes>> {
    let payload = Payload {
        last_updated: rfc3339(verdict.last_updated),
        current_time: rfc3339(Some(verdict.current_time)),
        node_eligible: with_node.then_some(verdict.node_eligible),
    };
    // Cannot fail: two strings and a bool.
    let body = serde_json::to_vec(&payload).unwrap_or_default();
    let status = if verdict.healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    http_response(status, "application/json", body)
}

/// RFC 3339 in UTC with milliseconds; `None` is the zero time.
fn rfc3339(time: Option<SystemTime>) -> String {
    match time {
        Some(t) => DateTime::<Utc>::from(t).to_rfc3339_opts(SecondsFormat::Millis, true),
        None => "0001-01-01T00:00:00Z".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A clock the test moves by hand, in seconds after an arbitrary epoch.
    #[derive(Clone, Default)]
    struct TestClock(Arc<AtomicU64>);

    impl TestClock {
        const BASE: Duration = Duration::from_secs(1_700_000_000);
        fn advance(&self, secs: u64) {
            self.0.fetch_add(secs, Ordering::SeqCst);
        }
        fn clock(&self) -> Clock {
            let secs = Arc::clone(&self.0);
            Arc::new(move || {
                SystemTime::UNIX_EPOCH
                    + Self::BASE
                    + Duration::from_secs(secs.load(Ordering::SeqCst))
            })
        }
        fn at(secs: u64) -> SystemTime {
            SystemTime::UNIX_EPOCH + Self::BASE + Duration::from_secs(secs)
        }
    }

    fn health() -> (ProxyHealth, TestClock) {
        let clock = TestClock::default();
        (
            ProxyHealth::with_clock(HEALTH_TIMEOUT, clock.clock()),
            clock,
        )
    }

    fn both(h: &ProxyHealth) -> (bool, bool) {
        (h.healthz().healthy, h.livez().healthy)
    }

    #[test]
    fn healthy_at_start_until_the_grace_runs_out_without_a_sync() {
        let (h, clock) = health();
        assert_eq!(both(&h), (true, true));
        clock.advance(59);
        assert_eq!(both(&h), (true, true), "within the grace");
        clock.advance(1);
        assert_eq!(both(&h), (false, false), "no first sync after 60 s");
        assert_eq!(h.healthz().last_updated, None, "never synced");
    }

    #[test]
    fn a_queued_change_turns_unhealthy_only_past_the_timeout_and_a_sync_heals() {
        let (h, clock) = health();
        h.updated();
        clock.advance(100);
        assert_eq!(both(&h), (true, true), "nothing queued: no sync needed");
        h.queued();
        clock.advance(30);
        // A later change does not restart the wait: the oldest counts.
        h.queued();
        clock.advance(29);
        assert_eq!(both(&h), (true, true), "59 s queued: not late yet");
        let healthy = h.healthz();
        assert_eq!(
            healthy.last_updated,
            Some(healthy.current_time),
            "now while healthy"
        );
        clock.advance(1);
        assert_eq!(both(&h), (false, false), "60 s queued without a sync");
        assert_eq!(
            h.healthz().last_updated,
            Some(TestClock::at(0)),
            "the last sync"
        );
        h.updated();
        assert_eq!(both(&h), (true, true), "synced again");
        clock.advance(1000);
        assert_eq!(both(&h), (true, true));
    }

    #[test]
    fn a_change_marked_after_its_own_sync_is_not_queued_but_a_hung_loop_shows() {
        let (h, clock) = health();
        // The sync loop programmed change 7 before the marker saw it.
        h.updated_change(7);
        h.queued_change(7);
        clock.advance(61);
        assert_eq!(both(&h), (true, true), "change 7 is programmed");
        // Change 8 arrives and the loop never gets to it.
        h.queued_change(8);
        clock.advance(59);
        assert_eq!(both(&h), (true, true));
        clock.advance(1);
        assert_eq!(both(&h), (false, false), "change 8 waited 60 s");
        h.updated_change(8);
        assert_eq!(both(&h), (true, true));
    }

    #[test]
    fn a_node_being_deleted_fails_healthz_but_not_livez() {
        let (h, clock) = health();
        h.updated();
        h.set_node_eligible(false);
        assert_eq!(both(&h), (false, true));
        let verdict = h.healthz();
        assert!(!verdict.node_eligible);
        assert_eq!(verdict.last_updated, Some(TestClock::at(0)));
        clock.advance(5);
        h.set_node_eligible(true);
        assert_eq!(both(&h), (true, true));
    }

    #[test]
    fn bodies_and_status_codes_follow_kube_proxy() {
        let (h, _clock) = health();
        h.set_node_eligible(false);
        let response = h.respond("/healthz");
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()["content-type"], "application/json");
        assert_eq!(response.headers()["x-content-type-options"], "nosniff");
        assert_eq!(h.respond("/livez").status(), StatusCode::OK);
        assert_eq!(h.respond("/metrics").status(), StatusCode::NOT_FOUND);

        let healthz = verdict_response(&h.healthz(), true);
        let livez = verdict_response(&h.livez(), false);
        let body = |r: Response<Full<Bytes>>| {
            let bytes =
                futures::executor::block_on(http_body_util::BodyExt::collect(r.into_body()))
                    .expect("body")
                    .to_bytes();
            String::from_utf8(bytes.to_vec()).expect("utf-8")
        };
        assert_eq!(
            body(healthz),
            r#"{"lastUpdated":"0001-01-01T00:00:00Z","currentTime":"2023-11-14T22:13:20.000Z","nodeEligible":false}"#
        );
        assert_eq!(
            body(livez),
            r#"{"lastUpdated":"2023-11-14T22:13:20.000Z","currentTime":"2023-11-14T22:13:20.000Z"}"#
        );
    }

    async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
        let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let answer = crate::observe::healthcheck::test_http::get_on(stream, path).await;
        (answer.status, answer.body)
    }

    #[tokio::test]
    async fn the_server_answers_both_paths_and_a_taken_port_is_a_clear_error() {
        let (h, _clock) = health();
        h.set_node_eligible(false);
        let serving = h
            .serve(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .expect("serve");
        let (status, text) = get(serving.local_addr, "/healthz").await;
        assert_eq!(status, 503, "{text}");
        assert!(text.contains("\"nodeEligible\":false"), "{text}");
        assert_eq!(get(serving.local_addr, "/livez").await.0, 200);

        let error = h.serve(serving.local_addr).expect_err("port taken");
        let message = error.to_string();
        assert!(
            message.contains(&serving.local_addr.to_string()),
            "{message}"
        );
        assert!(message.contains("--healthz-bind-address"), "{message}");
    }

    #[tokio::test]
    async fn the_server_answers_on_an_ipv6_address() {
        let (h, _clock) = health();
        let serving = h
            .serve(SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, 0)))
            .expect("serve on [::1]");
        assert!(serving.local_addr.is_ipv6(), "{}", serving.local_addr);
        assert_eq!(get(serving.local_addr, "/livez").await.0, 200);
    }
}
