//! HTTP side: routing, list/get/write handlers and watch streams.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::ops::Bound;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::CONTENT_TYPE;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::selector::{FieldSelector, LabelSelector};
use super::store::{merge_patch, set_rv, ApiError, EventType, HistEvent, Key, PutMode};
use super::{Injected, Kind, RequestRecord, Shared, Verb};

type Body = BoxBody<Bytes, io::Error>;

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never: Infallible| match never {})
        .boxed()
}

fn json_response(code: u16, v: &Value) -> Response<Body> {
    bytes_response(code, serde_json::to_vec(v).expect("serializable"))
}

/// A JSON body already serialized.
fn bytes_response(code: u16, mut body: Vec<u8>) -> Response<Body> {
    body.push(b'\n');
    Response::builder()
        .status(code)
        .header(CONTENT_TYPE, "application/json")
        .body(full(body))
        .expect("valid response")
}

fn error_response(e: &ApiError) -> Response<Body> {
    json_response(e.code, &e.status())
}

/// Accepts connections until `shutdown` fires (or its sender is dropped).
pub(crate) async fn serve(
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
    mut shutdown: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("fake apiserver: {e}");
            return;
        }
    };
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    let _ = stream.set_nodelay(true);
                    let shared = shared.clone();
                    tokio::spawn(async move {
                        let svc = hyper::service::service_fn(move |req| {
                            let shared = shared.clone();
                            async move { Ok::<_, Infallible>(handle(shared, req).await) }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc)
                            .await;
                    });
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
        }
    }
}

enum Route {
    Version,
    Health,
    ApiVersions,
    ApiGroups,
    CoreResources,
    DiscoveryGroup,
    DiscoveryResources,
    Resource {
        kind: Kind,
        ns: Option<String>,
        name: Option<String>,
    },
    NotFound,
}

fn route(path: &str) -> Route {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segs.as_slice() {
        ["version"] => Route::Version,
        ["healthz" | "livez" | "readyz", ..] => Route::Health,
        ["api"] => Route::ApiVersions,
        ["apis"] => Route::ApiGroups,
        ["api", "v1"] => Route::CoreResources,
        ["apis", "discovery.k8s.io"] => Route::DiscoveryGroup,
        ["apis", "discovery.k8s.io", "v1"] => Route::DiscoveryResources,
        ["api", "v1", rest @ ..] => resource_route("", rest),
        ["apis", "discovery.k8s.io", "v1", rest @ ..] => resource_route("discovery.k8s.io", rest),
        _ => Route::NotFound,
    }
}

fn resource_route(group: &str, rest: &[&str]) -> Route {
    let r =
        |plural: &str, ns: Option<&str>, name: Option<&str>| match Kind::from_path(group, plural) {
            Some(kind) if ns.is_none() || kind.namespaced() => {
                // A namespaced kind's object is only addressable within its namespace.
                if ns.is_none() && name.is_some() && kind.namespaced() {
                    return Route::NotFound;
                }
                Route::Resource {
                    kind,
                    ns: ns.map(str::to_string),
                    name: name.map(str::to_string),
                }
            }
            _ => Route::NotFound,
        };
    match rest {
        [plural] => r(plural, None, None),
        [plural, name] => r(plural, None, Some(name)),
        ["namespaces", ns, plural] => r(plural, Some(ns), None),
        ["namespaces", ns, plural, name] => r(plural, Some(ns), Some(name)),
        _ => Route::NotFound,
    }
}

fn not_found_path() -> ApiError {
    let mut e = ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    );
    e.details = Some(json!({}));
    e
}

fn method_not_allowed(method: &Method) -> ApiError {
    ApiError::new(
        405,
        "MethodNotAllowed",
        format!("the server does not allow this method on the requested resource ({method})"),
    )
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let q: HashMap<String, String> = form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect();
    let (resp, kind, verb) = match route(&path) {
        Route::Resource { kind, ns, name } if method == Method::GET => {
            let verb = read_verb(&q, name.is_some());
            let delay = shared.read_delay();
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            match shared.inject() {
                Some(fault) => (injected_response(fault), Some(kind), Some(verb)),
                None => {
                    let (verb, resp) = resource(&shared, kind, ns, name, &q, req).await;
                    (resp, Some(kind), verb)
                }
            }
        }
        Route::Resource { kind, ns, name } => {
            let (verb, resp) = resource(&shared, kind, ns, name, &q, req).await;
            (resp, Some(kind), verb)
        }
        other if method == Method::GET => (discovery(other, &path), None, None),
        _ => (error_response(&method_not_allowed(&method)), None, None),
    };
    shared.record(RequestRecord {
        method: method.to_string(),
        path,
        query,
        kind,
        verb,
        status: resp.status().as_u16(),
        at: Instant::now(),
    });
    resp
}

/// The verb of a GET on a resource path.
fn read_verb(q: &HashMap<String, String>, named: bool) -> Verb {
    match (truthy(q, "watch") == Some(true), named) {
        (true, _) => Verb::Watch,
        (false, true) => Verb::Get,
        (false, false) => Verb::List,
    }
}

/// An injected fault as the real server words it.
fn injected_response(fault: Injected) -> Response<Body> {
    match fault {
        Injected::Error500 => error_response(&ApiError::new(
            500,
            "InternalError",
            "Internal error occurred: injected by the fake API server",
        )),
        Injected::Throttle429 { retry_after_s } => {
            let mut e = ApiError::new(
                429,
                "TooManyRequests",
                "the server has received too many requests and has asked us to try again later",
            );
            e.details = Some(json!({"retryAfterSeconds": retry_after_s}));
            let mut resp = error_response(&e);
            resp.headers_mut().insert(
                hyper::header::RETRY_AFTER,
                hyper::header::HeaderValue::from(retry_after_s),
            );
            resp
        }
    }
}

fn discovery(route: Route, _path: &str) -> Response<Body> {
    let verbs = json!(["create", "delete", "get", "list", "patch", "update", "watch"]);
    let resource = |kind: Kind, short: &[&str]| {
        json!({
            "name": kind.plural(),
            "singularName": kind.kind().to_ascii_lowercase(),
            "namespaced": kind.namespaced(),
            "kind": kind.kind(),
            "verbs": verbs,
            "shortNames": short,
        })
    };
    let group_version = json!({"groupVersion": "discovery.k8s.io/v1", "version": "v1"});
    let v = match route {
        Route::Version => json!({
            "major": "1", "minor": "33", "gitVersion": "v1.33.0-switchboard-fake",
            "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
            "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24.0", "compiler": "gc",
            "platform": "linux/amd64",
        }),
        Route::Health => {
            return Response::builder()
                .status(200)
                .header(CONTENT_TYPE, "text/plain; charset=utf-8")
                .body(full("ok"))
                .expect("valid response")
        }
        Route::ApiVersions => json!({
            "kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}],
        }),
        Route::ApiGroups => json!({
            "kind": "APIGroupList", "apiVersion": "v1",
            "groups": [{"name": "discovery.k8s.io", "versions": [group_version], "preferredVersion": group_version}],
        }),
        Route::DiscoveryGroup => json!({
            "kind": "APIGroup", "apiVersion": "v1", "name": "discovery.k8s.io",
            "versions": [group_version], "preferredVersion": group_version,
        }),
        Route::CoreResources => json!({
            "kind": "APIResourceList", "groupVersion": "v1",
            "resources": [resource(Kind::Node, &["no"]), resource(Kind::Pod, &["po"]), resource(Kind::Service, &["svc"])],
        }),
        Route::DiscoveryResources => json!({
            "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "discovery.k8s.io/v1",
            "resources": [resource(Kind::EndpointSlice, &[])],
        }),
        Route::Resource { .. } | Route::NotFound => return error_response(&not_found_path()),
    };
    json_response(200, &v)
}

fn param<'a>(q: &'a HashMap<String, String>, name: &str) -> Option<&'a str> {
    q.get(name).map(String::as_str).filter(|s| !s.is_empty())
}

fn truthy(q: &HashMap<String, String>, name: &str) -> Option<bool> {
    param(q, name).map(|v| v == "true" || v == "1")
}

async fn read_json(req: Request<Incoming>) -> Result<Value, ApiError> {
    let body = req
        .into_body()
        .collect()
        .await
        .map_err(|e| ApiError::bad_request(format!("reading body: {e}")))?
        .to_bytes();
    serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))
}

async fn resource(
    shared: &Arc<Shared>,
    kind: Kind,
    ns: Option<String>,
    name: Option<String>,
    q: &HashMap<String, String>,
    req: Request<Incoming>,
) -> (Option<Verb>, Response<Body>) {
    let method = req.method().clone();
    let is_watch = truthy(q, "watch") == Some(true);
    let (verb, result) = match (&method, &name) {
        (&Method::GET, _) if is_watch => (Verb::Watch, watch(shared, kind, ns, name, q)),
        (&Method::GET, None) => (
            Verb::List,
            list(shared, kind, ns.as_deref(), q)
                .await
                .map(|body| bytes_response(200, body)),
        ),
        (&Method::GET, Some(n)) => (
            Verb::Get,
            shared
                .store()
                .get(kind, ns.as_deref().unwrap_or(""), n)
                .cloned()
                .ok_or_else(|| ApiError::not_found(kind, n))
                .map(|v| json_response(200, &v)),
        ),
        (&Method::POST, None) if ns.is_some() || !kind.namespaced() => {
            let r = match read_json(req).await {
                Ok(obj) => shared.mutate(|s| s.put(kind, obj, ns.as_deref(), PutMode::Create)),
                Err(e) => Err(e),
            };
            (Verb::Create, r.map(|v| json_response(201, &v)))
        }
        (&Method::PUT, Some(n)) => {
            let r = match read_json(req).await {
                Ok(mut obj) => match obj.pointer("/metadata/name").and_then(Value::as_str) {
                    Some(body_name) if body_name != n => Err(ApiError::bad_request(format!(
                        "the name of the object ({body_name}) does not match the name on the URL ({n})"
                    ))),
                    _ => {
                        if let Some(m) = obj.as_object_mut() {
                            let meta = m.entry("metadata").or_insert_with(|| json!({}));
                            if let Some(meta) = meta.as_object_mut() {
                                meta.insert("name".into(), json!(n));
                            }
                        }
                        shared.mutate(|s| s.put(kind, obj, ns.as_deref(), PutMode::Update))
                    }
                },
                Err(e) => Err(e),
            };
            (Verb::Update, r.map(|v| json_response(200, &v)))
        }
        (&Method::PATCH, Some(n)) => {
            let ct = req
                .headers()
                .get(CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let r = if ct.starts_with("application/merge-patch+json")
                || ct.starts_with("application/strategic-merge-patch+json")
            {
                match read_json(req).await {
                    Ok(patch) => shared.mutate(|s| {
                        let mut obj = s
                            .get(kind, ns.as_deref().unwrap_or(""), n)
                            .cloned()
                            .ok_or_else(|| ApiError::not_found(kind, n))?;
                        merge_patch(&mut obj, &patch);
                        s.put(kind, obj, ns.as_deref(), PutMode::Update)
                    }),
                    Err(e) => Err(e),
                }
            } else {
                Err(ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    format!("the body of the request was in an unknown format - accepted media types include: application/merge-patch+json, application/strategic-merge-patch+json (got {ct:?})"),
                ))
            };
            (Verb::Patch, r.map(|v| json_response(200, &v)))
        }
        (&Method::DELETE, Some(n)) => (
            Verb::Delete,
            shared
                .mutate(|s| s.delete(kind, ns.as_deref().unwrap_or(""), n))
                .map(|v| json_response(200, &v)),
        ),
        _ => return (None, error_response(&method_not_allowed(&method))),
    };
    (Some(verb), result.unwrap_or_else(|e| error_response(&e)))
}

fn selectors(
    kind: Kind,
    q: &HashMap<String, String>,
) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels = LabelSelector::parse(param(q, "labelSelector").unwrap_or(""))
        .map_err(ApiError::bad_request)?;
    let fields = FieldSelector::parse(kind, param(q, "fieldSelector").unwrap_or(""))
        .map_err(ApiError::bad_request)?;
    Ok((labels, fields))
}

fn parse_rv(s: &str) -> Result<u64, ApiError> {
    s.parse().map_err(|_| {
        ApiError::bad_request(format!(
            "resourceVersion: Invalid value: {s:?}: must be a valid resource version"
        ))
    })
}

fn encode_continue(rv: u64, key: &(String, String)) -> String {
    let raw =
        json!({"v": "meta.k8s.io/v1", "rv": rv, "start": format!("{}/{}\u{0}", key.0, key.1)});
    base64::engine::general_purpose::STANDARD.encode(raw.to_string())
}

fn decode_continue(tok: &str) -> Result<(u64, (String, String)), ApiError> {
    let bad = || {
        ApiError::bad_request("continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)")
    };
    let raw = base64::engine::general_purpose::STANDARD
        .decode(tok)
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let rv = v.get("rv").and_then(Value::as_u64).ok_or_else(bad)?;
    let start = v.get("start").and_then(Value::as_str).ok_or_else(bad)?;
    let start = start.strip_suffix('\u{0}').ok_or_else(bad)?;
    let (ns, name) = start.split_once('/').ok_or_else(bad)?;
    Ok((rv, (ns.to_string(), name.to_string())))
}

/// Waits (up to 3 s, as the real server does) for the store to reach `rv`.
async fn wait_for_rv(shared: &Shared, rv: u64) -> Result<(), ApiError> {
    let mut rx = shared.rv_tx.subscribe();
    let reached = tokio::time::timeout(Duration::from_secs(3), rx.wait_for(|cur| *cur >= rv)).await;
    match reached {
        Ok(Ok(_)) => Ok(()),
        _ => {
            let mut e = ApiError::new(
                504,
                "Timeout",
                format!(
                    "Too large resource version: {rv}, current: {}",
                    shared.store().rv
                ),
            );
            e.details = Some(
                json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1}),
            );
            Err(e)
        }
    }
}

/// A list response, serialized: the items straight from the store (no
/// copy of them is made; at 100k objects copying them was most of the time
/// a page took).
async fn list(
    shared: &Shared,
    kind: Kind,
    ns: Option<&str>,
    q: &HashMap<String, String>,
) -> Result<Vec<u8>, ApiError> {
    let (labels, fields) = selectors(kind, q)?;
    let limit: usize = match param(q, "limit") {
        Some(l) => l
            .parse()
            .map_err(|_| ApiError::bad_request(format!("limit: Invalid value: {l:?}")))?,
        None => 0,
    };
    let rv_param = param(q, "resourceVersion");
    let rvm = param(q, "resourceVersionMatch");
    let continue_tok = param(q, "continue");
    if let Some(m) = rvm {
        if m != "Exact" && m != "NotOlderThan" {
            return Err(ApiError::bad_request(format!(
                "resourceVersionMatch: Unsupported value: {m:?}"
            )));
        }
        if rv_param.is_none() {
            return Err(ApiError::bad_request(
                "resourceVersionMatch is forbidden unless resourceVersion is provided",
            ));
        }
        if continue_tok.is_some() {
            return Err(ApiError::bad_request(
                "resourceVersionMatch is forbidden when continue is provided",
            ));
        }
    }
    // Which snapshot to serve, and from which key on.
    let (snap_rv, start) = if let Some(tok) = continue_tok {
        let (rv, start) = decode_continue(tok)?;
        (Some(rv), Some(start))
    } else {
        match (rv_param, rvm) {
            (Some(rv), Some("Exact")) => (Some(parse_rv(rv)?), None),
            (Some(rv), _) => {
                let rv = parse_rv(rv)?;
                if rv != 0 {
                    wait_for_rv(shared, rv).await?;
                }
                (None, None)
            }
            (None, _) => (None, None),
        }
    };
    let filtered = !(labels.is_empty() && fields.is_empty());
    let mut items = Vec::new();
    let mut count = 0usize;
    let mut last_key = None;
    let mut remaining = 0usize;
    let rv = {
        let store = shared.store();
        let past;
        let (rv, objs) = match snap_rv {
            Some(rv) if rv != store.rv => {
                past = store.state_at(kind, rv).map_err(|e| {
                    if e.code == 410 && continue_tok.is_some() {
                        ApiError::expired(
                            "The provided continue parameter is too old to display a consistent list result. \
                             You can start a new list without the continue parameter, or use the continue token \
                             in this response to retrieve the remainder of the results. Continuing with the provided \
                             token results in an inconsistent list - objects that were created, modified, or deleted \
                             between the time the first chunk was returned and now may show up in the list.",
                        )
                    } else {
                        e
                    }
                })?;
                (rv, &past)
            }
            _ => (store.rv, store.current_ref(kind)),
        };
        let after = match &start {
            Some(s) => objs.range::<Key, _>((Bound::Excluded(s), Bound::Unbounded)),
            None => objs.range::<Key, _>(..),
        };
        for (key, obj) in after {
            if ns.is_some_and(|n| n != key.0) {
                continue;
            }
            if !(labels.matches(obj) && fields.matches(kind, obj)) {
                continue;
            }
            if limit > 0 && count == limit {
                remaining += 1;
                if filtered {
                    // Only whether more follow matters (no count is given
                    // with selectors).
                    break;
                }
                continue;
            }
            if count > 0 {
                items.push(b',');
            }
            serde_json::to_writer(&mut items, &Untyped(obj)).expect("serializable");
            count += 1;
            last_key = Some(key.clone());
        }
        rv
    };
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if remaining > 0 {
        meta["continue"] = json!(encode_continue(
            rv,
            last_key.as_ref().expect("a page before the rest")
        ));
        if !filtered {
            meta["remainingItemCount"] = json!(remaining);
        }
    }
    let head =
        json!({"kind": kind.list_kind(), "apiVersion": kind.api_version(), "metadata": meta});
    let mut body = serde_json::to_vec(&head).expect("serializable");
    body.pop(); // the closing brace: the items follow
    body.extend_from_slice(b",\"items\":[");
    body.extend_from_slice(&items);
    body.extend_from_slice(b"]}");
    Ok(body)
}

/// An object as a list item: list items carry no kind/apiVersion on the wire.
struct Untyped<'a>(&'a Value);

impl serde::Serialize for Untyped<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        let Value::Object(obj) = self.0 else {
            return self.0.serialize(s);
        };
        let fields = obj
            .iter()
            .filter(|(k, _)| k.as_str() != "kind" && k.as_str() != "apiVersion");
        let mut map = s.serialize_map(None)?;
        for (k, v) in fields {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

struct WatchSpec {
    kind: Kind,
    ns: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
    bookmarks: bool,
    timeout: Duration,
}

impl WatchSpec {
    fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(self.kind, obj)
    }

    /// What this watcher sees of a change: the watch cache turns selector
    /// transitions into ADDED / DELETED.
    fn render(&self, ev: &HistEvent) -> Option<(EventType, Value)> {
        if ev.kind != self.kind || self.ns.as_ref().is_some_and(|n| n != &ev.ns) {
            return None;
        }
        let now = self.matches(&ev.obj);
        let before = ev.prev.as_ref().is_some_and(|p| self.matches(p));
        match ev.ty {
            EventType::Added => now.then(|| (EventType::Added, ev.obj.clone())),
            EventType::Deleted => before.then(|| (EventType::Deleted, ev.obj.clone())),
            EventType::Modified => match (before, now) {
                (true, true) => Some((EventType::Modified, ev.obj.clone())),
                (false, true) => Some((EventType::Added, ev.obj.clone())),
                (true, false) => {
                    let mut old = ev.prev.clone().expect("prev recorded");
                    set_rv(&mut old, ev.rv);
                    Some((EventType::Deleted, old))
                }
                (false, false) => None,
            },
        }
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        line(
            "BOOKMARK",
            &json!({"kind": self.kind.kind(), "apiVersion": self.kind.api_version(), "metadata": meta}),
        )
    }
}

fn line(ty: &str, obj: &Value) -> Bytes {
    let mut v = serde_json::to_vec(&json!({"type": ty, "object": obj})).expect("serializable");
    v.push(b'\n');
    Bytes::from(v)
}

enum Start {
    /// Synthetic ADDED for the current state (resourceVersion unset or "0",
    /// or sendInitialEvents=true), then live events.
    Initial { end_bookmark: bool },
    /// Only live events from now on (sendInitialEvents=false without a version).
    Now,
    /// Events after this resourceVersion.
    After(u64),
}

fn watch(
    shared: &Arc<Shared>,
    kind: Kind,
    ns: Option<String>,
    name: Option<String>,
    q: &HashMap<String, String>,
) -> Result<Response<Body>, ApiError> {
    let (labels, mut fields) = selectors(kind, q)?;
    if let Some(n) = &name {
        fields = fields.with_name(n);
    }
    let send_initial = truthy(q, "sendInitialEvents");
    let rv = param(q, "resourceVersion");
    let bookmarks = truthy(q, "allowWatchBookmarks") == Some(true);
    if send_initial == Some(true) {
        if param(q, "resourceVersionMatch") != Some("NotOlderThan") {
            return Err(ApiError::new(
                422,
                "Invalid",
                "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            ));
        }
        if !bookmarks {
            return Err(ApiError::new(
                422,
                "Invalid",
                "allowWatchBookmarks: Forbidden: sendInitialEvents requires setting allowWatchBookmarks to true",
            ));
        }
    }
    let start = match (send_initial, rv) {
        (Some(true), _) => Start::Initial { end_bookmark: true },
        (Some(false), None) => Start::Now,
        (_, None | Some("0")) => Start::Initial {
            end_bookmark: false,
        },
        (_, Some(v)) => Start::After(parse_rv(v)?),
    };
    let config = &shared.config;
    let mut timeout =
        match param(q, "timeoutSeconds") {
            Some(t) => Duration::from_secs(t.parse().map_err(|_| {
                ApiError::bad_request(format!("timeoutSeconds: Invalid value: {t:?}"))
            })?),
            None => config.default_watch_timeout,
        };
    if let Some(max) = config.max_watch_timeout {
        timeout = timeout.min(max);
    }
    let spec = WatchSpec {
        kind,
        ns,
        labels,
        fields,
        bookmarks,
        timeout,
    };
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, io::Error>>(256);
    tokio::spawn(produce(shared.clone(), spec, start, tx));
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(CONTENT_TYPE, "application/json")
        .body(StreamBody::new(stream).boxed())
        .expect("valid response"))
}

struct OpenWatch {
    shared: Arc<Shared>,
    kind: Kind,
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        self.shared.watch_closed(self.kind);
    }
}

type Tx = mpsc::Sender<Result<Frame<Bytes>, io::Error>>;

async fn send(tx: &Tx, b: Bytes) -> bool {
    tx.send(Ok(Frame::data(b))).await.is_ok()
}

fn expired_line(rv: u64, floor: u64) -> Bytes {
    let e = ApiError::expired(format!("too old resource version: {rv} ({floor})"));
    line("ERROR", &e.status())
}

/// Feeds one watch stream until it times out, the client goes away, the
/// test drops it, or its position expires.
async fn produce(shared: Arc<Shared>, spec: WatchSpec, start: Start, tx: Tx) {
    shared.watch_opened(spec.kind);
    let _open = OpenWatch {
        shared: shared.clone(),
        kind: spec.kind,
    };
    let mut rv_rx = shared.rv_tx.subscribe();
    let mut drop_rx = shared.drop_tx.subscribe();
    drop_rx.borrow_and_update();
    let mut cut_rx = shared.cut_rx();
    cut_rx.borrow_and_update();
    let mut silent_rx = shared.silent_rx();
    if *silent_rx.borrow_and_update() {
        // Held open, nothing sent, until the client gives up.
        tx.closed().await;
        return;
    }
    let deadline = tokio::time::Instant::now() + spec.timeout;

    rv_rx.borrow_and_update();
    enum Begin {
        Initial(u64, Vec<Value>, bool),
        From(u64),
        Expired(u64, u64),
    }
    let begin = {
        let store = shared.store();
        match start {
            Start::Initial { end_bookmark } => {
                let objs: Vec<Value> = store
                    .current(spec.kind)
                    .into_iter()
                    .filter(|(k, o)| spec.ns.as_ref().is_none_or(|n| n == &k.0) && spec.matches(o))
                    .map(|(_, o)| o)
                    .collect();
                Begin::Initial(store.rv, objs, end_bookmark)
            }
            Start::Now => Begin::From(store.rv),
            Start::After(rv) if rv < store.floor || rv > store.rv => {
                Begin::Expired(rv, store.floor)
            }
            Start::After(rv) => Begin::From(rv),
        }
    };
    let mut cursor = match begin {
        Begin::Expired(rv, floor) => {
            let _ = send(&tx, expired_line(rv, floor)).await;
            return;
        }
        Begin::From(rv) => rv,
        Begin::Initial(rv, objs, end_bookmark) => {
            for o in objs {
                if !send(&tx, line("ADDED", &o)).await {
                    return;
                }
            }
            if end_bookmark && !send(&tx, spec.bookmark(rv, true)).await {
                return;
            }
            rv
        }
    };
    let interval = shared
        .config
        .bookmark_interval
        .max(Duration::from_millis(10));
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        rv_rx.borrow_and_update();
        let (events, floor) = {
            let store = shared.store();
            (store.events_after(cursor), store.floor)
        };
        let Some(events) = events else {
            // Fell behind a compaction (or the store was reset).
            let _ = send(&tx, expired_line(cursor, floor)).await;
            return;
        };
        for ev in &events {
            if let Some((ty, obj)) = spec.render(ev) {
                if !send(&tx, line(ty.as_str(), &obj)).await {
                    return;
                }
            }
            cursor = ev.rv;
        }
        tokio::select! {
            biased;
            _ = tx.closed() => return,
            changed = drop_rx.changed() => {
                if changed.is_ok() {
                    // Body error: hyper aborts the connection without the
                    // terminating chunk, as a dropped connection looks.
                    let _ = tx.send(Err(io::Error::new(io::ErrorKind::ConnectionAborted, "watch dropped by test"))).await;
                }
                return;
            }
            _ = cut_rx.changed() => {
                // Half a line, then the connection is aborted: the client
                // holds a torn event when the stream breaks.
                let line = spec.bookmark(cursor, false);
                let _ = send(&tx, line.slice(..line.len() / 2)).await;
                tokio::time::sleep(Duration::from_millis(20)).await;
                let _ = tx.send(Err(io::Error::new(io::ErrorKind::ConnectionAborted, "watch cut mid-event by test"))).await;
                return;
            }
            silent = async { silent_rx.wait_for(|silent| *silent).await.is_ok() } => {
                if silent {
                    tx.closed().await;
                }
                return;
            }
            _ = tokio::time::sleep_until(deadline) => {
                if spec.bookmarks {
                    let _ = send(&tx, spec.bookmark(cursor, false)).await;
                }
                return;
            }
            changed = rv_rx.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = ticker.tick(), if spec.bookmarks => {
                if !send(&tx, spec.bookmark(cursor, false)).await {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert!(matches!(
            route("/api/v1/services"),
            Route::Resource {
                kind: Kind::Service,
                ns: None,
                name: None
            }
        ));
        assert!(matches!(
            route("/api/v1/namespaces/a/services/b"),
            Route::Resource {
                kind: Kind::Service,
                ns: Some(_),
                name: Some(_)
            }
        ));
        assert!(matches!(route("/api/v1/services/b"), Route::NotFound));
        assert!(matches!(
            route("/api/v1/nodes/n1"),
            Route::Resource {
                kind: Kind::Node,
                ns: None,
                name: Some(_)
            }
        ));
        assert!(matches!(
            route("/api/v1/namespaces/a/nodes"),
            Route::NotFound
        ));
        assert!(matches!(
            route("/apis/discovery.k8s.io/v1/namespaces/x/endpointslices"),
            Route::Resource {
                kind: Kind::EndpointSlice,
                ns: Some(_),
                name: None
            }
        ));
        assert!(matches!(route("/api/v1/endpointslices"), Route::NotFound));
        assert!(matches!(route("/api/v1/namespaces/a"), Route::NotFound));
    }

    #[test]
    fn continue_tokens_round_trip() {
        let key = ("default".to_string(), "svc-1".to_string());
        let tok = encode_continue(42, &key);
        assert_eq!(decode_continue(&tok).unwrap(), (42, key));
        assert_eq!(decode_continue("garbage").unwrap_err().code, 400);
    }
}
