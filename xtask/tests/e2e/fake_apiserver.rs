//! The fake API server against the real kube-rs client (kube 1.1): lists,
//! watchers, reflectors, relist after 410, reconnection after restarts,
//! selectors, pagination, writes and errors. No root needed, except for the
//! network-namespace test, which skips itself without it.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{reflector, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use serde_json::{json, Value};
use xtask::fake_apiserver::{Config, FakeApiServer, Kind, Verb};

const STEP: Duration = Duration::from_secs(5);

fn svc(ns: &str, name: &str, labels: Value, port: u16) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.10", "ports": [{"name": "http", "port": port, "protocol": "TCP"}]}
    })
}

fn slice(ns: &str, name: &str, service: &str, ip: &str) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": ns, "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
    })
}

fn node(name: &str, ip: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"addresses": [{"type": "InternalIP", "address": ip}]}
    })
}

/// A kube client built the way the agent builds one: from a kubeconfig file.
async fn client(server: &FakeApiServer) -> Client {
    let dir = std::env::temp_dir().join(format!(
        "sb-fake-kc-{}-{}",
        std::process::id(),
        server.addr().port()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("kubeconfig");
    server.write_kubeconfig(&path).unwrap();
    let kc = Kubeconfig::read_from(&path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    Client::try_from(config).unwrap()
}

fn start() -> FakeApiServer {
    FakeApiServer::start("127.0.0.1:0").unwrap()
}

/// Next successful watcher event (errors — expected around 410s and
/// restarts — are skipped and counted).
async fn next<K>(s: &mut Events<K>, errors: &mut usize) -> Event<K> {
    tokio::time::timeout(STEP, async {
        loop {
            match s.recv().await.expect("watcher stream ended") {
                Ok(e) => return e,
                Err(_) => *errors += 1,
            }
        }
    })
    .await
    .expect("no watcher event within 5 s")
}

/// Reads a full Init .. InitDone sequence; returns the names seen.
async fn init_sequence<K: kube::Resource>(
    s: &mut Events<K>,
    errors: &mut usize,
) -> BTreeSet<String> {
    match next(s, errors).await {
        Event::Init => {}
        other => panic!("expected Init, got {}", describe(&other)),
    }
    init_rest(s, errors).await
}

/// InitApply* InitDone (a streaming-list watcher starts here, without Init).
async fn init_rest<K: kube::Resource>(s: &mut Events<K>, errors: &mut usize) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    loop {
        match next(s, errors).await {
            Event::InitApply(o) => {
                names.insert(o.name_any());
            }
            Event::InitDone => return names,
            other => panic!("expected InitApply/InitDone, got {}", describe(&other)),
        }
    }
}

fn describe<K: kube::Resource>(e: &Event<K>) -> String {
    match e {
        Event::Apply(o) => format!("Apply({})", o.name_any()),
        Event::Delete(o) => format!("Delete({})", o.name_any()),
        Event::Init => "Init".into(),
        Event::InitApply(o) => format!("InitApply({})", o.name_any()),
        Event::InitDone => "InitDone".into(),
    }
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let end = tokio::time::Instant::now() + STEP;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < end,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn list_and_get_see_applied_objects() {
    let server = start();
    server
        .apply(svc("default", "web", json!({"app": "web"}), 80))
        .unwrap();
    server
        .apply(svc("kube-system", "dns", json!({"app": "dns"}), 53))
        .unwrap();
    server
        .apply(slice("default", "web-abc", "web", "10.0.0.1"))
        .unwrap();
    server.apply(node("node-1", "192.168.0.1")).unwrap();
    let c = client(&server).await;

    let all = Api::<Service>::all(c.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(
        all.items
            .iter()
            .map(|s| s.name_any())
            .collect::<BTreeSet<_>>(),
        set(&["dns", "web"])
    );
    assert_eq!(all.metadata.resource_version.as_deref(), Some("5"));
    let web = &all.items.iter().find(|s| s.name_any() == "web").unwrap();
    assert_eq!(web.metadata.resource_version.as_deref(), Some("2"));
    assert!(web.metadata.uid.is_some() && web.metadata.creation_timestamp.is_some());

    let ns = Api::<Service>::namespaced(c.clone(), "kube-system")
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(ns.items.len(), 1);
    assert_eq!(
        ns.items[0].spec.as_ref().unwrap().ports.as_ref().unwrap()[0].port,
        53
    );

    let slices = Api::<EndpointSlice>::all(c.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(
        slices.items[0].endpoints[0].addresses,
        vec!["10.0.0.1".to_string()]
    );
    let n = Api::<Node>::all(c.clone()).get("node-1").await.unwrap();
    assert_eq!(
        n.status.unwrap().addresses.unwrap()[0].address,
        "192.168.0.1"
    );

    // The raw list looks like the real server's: items without kind/apiVersion.
    let raw: Value = reqwest_free_get(&server, "/api/v1/namespaces/default/services").await;
    assert_eq!(raw["kind"], "ServiceList");
    assert!(raw["items"][0].get("kind").is_none());

    // An update bumps the version and keeps uid; a no-op update does not.
    let before = server.get(Kind::Service, "default", "web").unwrap();
    let after = server
        .apply(svc("default", "web", json!({"app": "web"}), 8080))
        .unwrap();
    assert_eq!(after["metadata"]["uid"], before["metadata"]["uid"]);
    assert_eq!(after["metadata"]["resourceVersion"], "6");
    let same = server
        .apply(svc("default", "web", json!({"app": "web"}), 8080))
        .unwrap();
    assert_eq!(same["metadata"]["resourceVersion"], "6");
    assert_eq!(server.resource_version(), 6);

    assert_eq!(server.request_count(Kind::Service, Verb::List), 3);
    assert_eq!(server.request_count(Kind::Node, Verb::Get), 1);
}

/// GET via a raw hyper-free TCP request, to look at the wire format.
async fn reqwest_free_get(server: &FakeApiServer, path: &str) -> Value {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8(buf).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    serde_json::from_str(body.trim()).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[tokio::test]
async fn pagination_is_consistent() {
    let server = start();
    for i in 0..5 {
        server
            .apply(svc("default", &format!("s{i}"), json!({}), 80))
            .unwrap();
    }
    let api = Api::<Service>::all(client(&server).await);
    let p1 = api.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(p1.items.len(), 2);
    assert_eq!(p1.metadata.remaining_item_count, Some(3));
    let tok = p1.metadata.continue_.clone().unwrap();
    // Changes after the first page do not show in later pages.
    server.apply(svc("default", "s9", json!({}), 80)).unwrap();
    server.delete(Kind::Service, "default", "s4").unwrap();
    let p2 = api
        .list(&ListParams::default().limit(2).continue_token(&tok))
        .await
        .unwrap();
    let p3 = api
        .list(
            &ListParams::default()
                .limit(2)
                .continue_token(p2.metadata.continue_.as_ref().unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(p3.metadata.continue_, None);
    let names: Vec<_> = p1
        .items
        .iter()
        .chain(&p2.items)
        .chain(&p3.items)
        .map(|s| s.name_any())
        .collect();
    assert_eq!(names, vec!["s0", "s1", "s2", "s3", "s4"]);
    assert_eq!(p2.metadata.resource_version, p1.metadata.resource_version);

    // A watcher with a small page size pages through the whole list.
    let mut w = watcher(api.clone(), watcher::Config::default().page_size(2));
    let mut errors = 0;
    assert_eq!(
        init_sequence(&mut w, &mut errors).await,
        set(&["s0", "s1", "s2", "s3", "s9"])
    );
    assert!(server
        .requests()
        .iter()
        .filter(|r| r.verb == Some(Verb::List))
        .any(|r| r.param("continue").is_some()));

    // A continue token older than the history is 410 Expired.
    server.compact();
    server.apply(svc("default", "s10", json!({}), 80)).unwrap();
    match api
        .list(&ListParams::default().limit(2).continue_token(&tok))
        .await
    {
        Err(kube::Error::Api(e)) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected 410, got {other:?}"),
    }
}

#[tokio::test]
async fn paged_lists_with_a_selector_page_through_the_matches_only() {
    let server = start();
    for i in 0..7 {
        let labels = if i % 2 == 0 {
            json!({"keep": "yes"})
        } else {
            json!({})
        };
        server
            .apply(svc("default", &format!("s{i}"), labels, 80))
            .unwrap();
    }
    let api = Api::<Service>::all(client(&server).await);
    let mut names = Vec::new();
    let mut token: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut lp = ListParams::default().labels("keep=yes").limit(2);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = api.list(&lp).await.unwrap();
        pages += 1;
        // No count with a selector, as on the real server.
        assert_eq!(page.metadata.remaining_item_count, None);
        names.extend(page.items.iter().map(|s| s.name_any()));
        match page.metadata.continue_ {
            Some(t) => token = Some(t),
            None => break,
        }
    }
    assert_eq!(names, vec!["s0", "s2", "s4", "s6"]);
    assert_eq!(
        pages, 2,
        "a last full page with nothing after it has no continue token"
    );
}

type Events<K> = tokio::sync::mpsc::UnboundedReceiver<Result<Event<K>, watcher::Error>>;

/// Runs a kube-rs watcher in a task (polled continuously, as the agent's
/// are) and hands its events over a channel.
fn watcher<K>(api: Api<K>, config: watcher::Config) -> Events<K>
where
    K: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    tokio::spawn(async move {
        while let Some(ev) = stream.next().await {
            if tx.send(ev).is_err() {
                return;
            }
        }
    });
    rx
}

#[tokio::test]
async fn watcher_sees_creates_updates_deletes() {
    let server = start();
    server.apply(svc("default", "a", json!({}), 80)).unwrap();
    let api = Api::<Service>::all(client(&server).await);
    let mut w = watcher(api, watcher::Config::default());
    let mut errors = 0;
    assert_eq!(init_sequence(&mut w, &mut errors).await, set(&["a"]));
    wait_for("the watch", || server.open_watches(Kind::Service) == 1).await;

    server.apply(svc("default", "b", json!({}), 80)).unwrap();
    match next(&mut w, &mut errors).await {
        Event::Apply(s) => assert_eq!(s.name_any(), "b"),
        e => panic!("{}", describe(&e)),
    }
    server.apply(svc("default", "a", json!({}), 81)).unwrap();
    match next(&mut w, &mut errors).await {
        Event::Apply(s) => assert_eq!(s.spec.unwrap().ports.unwrap()[0].port, 81),
        e => panic!("{}", describe(&e)),
    }
    let deleted = server.delete(Kind::Service, "default", "a").unwrap();
    match next(&mut w, &mut errors).await {
        Event::Delete(s) => {
            assert_eq!(s.name_any(), "a");
            assert_eq!(
                s.resource_version(),
                deleted["metadata"]["resourceVersion"]
                    .as_str()
                    .map(String::from)
            );
        }
        e => panic!("{}", describe(&e)),
    }
    assert_eq!(errors, 0);
    assert!(server.delete(Kind::Service, "default", "a").is_none());

    // What kube-rs 1.1's default watcher asked for.
    let reqs = server.requests();
    let list = reqs.iter().find(|r| r.verb == Some(Verb::List)).unwrap();
    assert_eq!(list.path, "/api/v1/services");
    assert_eq!(list.param("limit").as_deref(), Some("500"));
    assert_eq!(list.param("resourceVersion"), None);
    let watch = reqs.iter().find(|r| r.verb == Some(Verb::Watch)).unwrap();
    assert_eq!(watch.param("allowWatchBookmarks").as_deref(), Some("true"));
    assert_eq!(watch.param("timeoutSeconds").as_deref(), Some("290"));
    assert_eq!(watch.param("resourceVersion").as_deref(), Some("2"));
    assert_eq!(watch.param("sendInitialEvents"), None);
}

#[tokio::test]
async fn relist_after_compaction_and_dropped_watch() {
    let server = start();
    server.apply(svc("default", "a", json!({}), 80)).unwrap();
    server.apply(svc("default", "b", json!({}), 80)).unwrap();
    let api = Api::<Service>::all(client(&server).await);
    let mut w = watcher(api, watcher::Config::default());
    let mut errors = 0;
    assert_eq!(init_sequence(&mut w, &mut errors).await, set(&["a", "b"]));
    wait_for("the watch", || server.open_watches(Kind::Service) == 1).await;
    assert_eq!(server.lists(Kind::Service), 1);

    // Changes the client will miss: the connection drops and history is gone.
    server.drop_watches();
    wait_for("the watch to drop", || {
        server.open_watches(Kind::Service) == 0
    })
    .await;
    server.delete(Kind::Service, "default", "a").unwrap();
    server.apply(svc("default", "c", json!({}), 80)).unwrap();
    server.compact();

    // The client re-watches from its old version, gets the 410 ERROR event,
    // and relists: a full Init .. InitDone with the new state.
    assert_eq!(init_sequence(&mut w, &mut errors).await, set(&["b", "c"]));
    assert_eq!(server.lists(Kind::Service), 2);
    assert!(errors >= 1, "the 410 surfaces as a watcher error");
    let rewatch = server
        .requests()
        .into_iter()
        .filter(|r| r.verb == Some(Verb::Watch))
        .nth(1)
        .unwrap();
    assert_eq!(rewatch.param("resourceVersion").as_deref(), Some("3"));
    assert_eq!(rewatch.status, 200);

    // And it keeps watching from the relisted version.
    server.apply(svc("default", "d", json!({}), 80)).unwrap();
    match next(&mut w, &mut errors).await {
        Event::Apply(s) => assert_eq!(s.name_any(), "d"),
        e => panic!("{}", describe(&e)),
    }
}

#[tokio::test]
async fn dropped_watch_resumes_without_relist() {
    let server = start();
    let api = Api::<Service>::all(client(&server).await);
    let mut w = watcher(api, watcher::Config::default());
    let mut errors = 0;
    assert_eq!(init_sequence(&mut w, &mut errors).await, set(&[]));
    wait_for("the watch", || server.open_watches(Kind::Service) == 1).await;
    server.drop_watches();
    server.apply(svc("default", "a", json!({}), 80)).unwrap();
    match next(&mut w, &mut errors).await {
        Event::Apply(s) => assert_eq!(s.name_any(), "a"),
        e => panic!("{}", describe(&e)),
    }
    assert_eq!(server.lists(Kind::Service), 1);
    assert!(server.watches(Kind::Service) >= 2);

    // On the wire: the chunked body stops without its terminating chunk.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut raw = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    raw.write_all(b"GET /api/v1/services?watch=true&resourceVersion=0 HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("\"ADDED\"") {
        let mut buf = [0u8; 4096];
        let n = tokio::time::timeout(STEP, raw.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "closed early");
        seen.extend_from_slice(&buf[..n]);
    }
    server.drop_watches();
    let mut rest = Vec::new();
    tokio::time::timeout(STEP, raw.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    assert!(
        !rest.ends_with(b"0\r\n\r\n"),
        "the connection was aborted, not finished"
    );
}

#[tokio::test]
async fn watcher_reconnects_after_restart() {
    let server = start();
    let port = server.addr().port();
    server.apply(svc("default", "a", json!({}), 80)).unwrap();
    let api = Api::<Service>::all(client(&server).await);
    let mut w = watcher(api, watcher::Config::default());
    let mut errors = 0;
    assert_eq!(init_sequence(&mut w, &mut errors).await, set(&["a"]));
    wait_for("the watch", || server.open_watches(Kind::Service) == 1).await;

    // Restart with state kept; a change made while it is down arrives after
    // the reconnect, from the retained history (no relist).
    server.stop();
    assert!(!server.is_running());
    server.apply(svc("default", "b", json!({}), 80)).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.start_again().unwrap();
    assert_eq!(server.addr().port(), port);
    match next(&mut w, &mut errors).await {
        Event::Apply(s) => assert_eq!(s.name_any(), "b"),
        e => panic!("{}", describe(&e)),
    }
    assert_eq!(server.lists(Kind::Service), 1);

    // Restart with fresh state: the client's version is unknown → 410 → relist.
    server.restart_fresh().unwrap();
    server.apply(svc("default", "z", json!({}), 80)).unwrap();
    assert_eq!(init_sequence(&mut w, &mut errors).await, set(&["z"]));
    assert_eq!(server.lists(Kind::Service), 2);
}

#[tokio::test]
async fn reflector_store_follows_the_server() {
    let server = start();
    server
        .apply(slice("default", "web-1", "web", "10.0.0.1"))
        .unwrap();
    let api = Api::<EndpointSlice>::all(client(&server).await);
    let (reader, writer) = reflector::store::<EndpointSlice>();
    let stream = reflector::reflector(
        writer,
        watcher::watcher(api, watcher::Config::default()).default_backoff(),
    );
    let task = tokio::spawn(stream.for_each(|_| async {}));
    tokio::time::timeout(STEP, reader.wait_until_ready())
        .await
        .unwrap()
        .unwrap();
    let names = || {
        reader
            .state()
            .iter()
            .map(|s| s.name_any())
            .collect::<BTreeSet<_>>()
    };
    assert_eq!(names(), set(&["web-1"]));

    server
        .apply(slice("default", "web-2", "web", "10.0.0.2"))
        .unwrap();
    wait_for("web-2", || names() == set(&["web-1", "web-2"])).await;
    server
        .delete(Kind::EndpointSlice, "default", "web-1")
        .unwrap();
    wait_for("web-1 gone", || names() == set(&["web-2"])).await;

    // Relist swaps the store: a delete missed during the 410 disappears.
    server.drop_watches();
    wait_for("the watch to drop", || {
        server.open_watches(Kind::EndpointSlice) == 0
    })
    .await;
    server
        .delete(Kind::EndpointSlice, "default", "web-2")
        .unwrap();
    server
        .apply(slice("default", "web-3", "web", "10.0.0.3"))
        .unwrap();
    server.compact();
    wait_for("relisted store", || names() == set(&["web-3"])).await;
    assert_eq!(server.lists(Kind::EndpointSlice), 2);
    task.abort();
}

#[tokio::test]
async fn selectors_filter_lists_and_watches() {
    let server = start();
    server
        .apply(svc(
            "default",
            "web",
            json!({"app": "web", "tier": "front"}),
            80,
        ))
        .unwrap();
    server
        .apply(svc(
            "default",
            "api",
            json!({"app": "api", "tier": "back"}),
            80,
        ))
        .unwrap();
    server
        .apply(svc("other", "db", json!({"app": "db"}), 5432))
        .unwrap();
    server
        .apply(svc(
            "default",
            "proxied",
            json!({"service.kubernetes.io/service-proxy-name": "other"}),
            80,
        ))
        .unwrap();
    server.apply(node("node-1", "192.168.0.1")).unwrap();
    server.apply(node("node-2", "192.168.0.2")).unwrap();
    let c = client(&server).await;
    let api = Api::<Service>::all(c.clone());
    let names = |l: kube::core::ObjectList<Service>| {
        l.items
            .iter()
            .map(|s| s.name_any())
            .collect::<BTreeSet<_>>()
    };

    let q = |s: &str| ListParams::default().labels(s);
    assert_eq!(names(api.list(&q("app=web")).await.unwrap()), set(&["web"]));
    assert_eq!(
        names(api.list(&q("app!=web")).await.unwrap()),
        set(&["api", "db", "proxied"])
    );
    assert_eq!(
        names(api.list(&q("app in (web,db)")).await.unwrap()),
        set(&["db", "web"])
    );
    assert_eq!(
        names(api.list(&q("app notin (web,db)")).await.unwrap()),
        set(&["api", "proxied"])
    );
    assert_eq!(
        names(api.list(&q("tier")).await.unwrap()),
        set(&["api", "web"])
    );
    assert_eq!(
        names(
            api.list(&q("!service.kubernetes.io/service-proxy-name"))
                .await
                .unwrap()
        ),
        set(&["api", "db", "web"])
    );
    assert_eq!(
        names(api.list(&q("app,tier=front")).await.unwrap()),
        set(&["web"])
    );
    let f = |s: &str| ListParams::default().fields(s);
    assert_eq!(
        names(api.list(&f("metadata.name=db")).await.unwrap()),
        set(&["db"])
    );
    assert_eq!(
        names(api.list(&f("metadata.namespace!=default")).await.unwrap()),
        set(&["db"])
    );
    assert_eq!(
        names(
            api.list(&f("metadata.namespace=default,metadata.name!=web"))
                .await
                .unwrap()
        ),
        set(&["api", "proxied"])
    );
    match api.list(&f("spec.selector=x")).await {
        Err(kube::Error::Api(e)) => assert_eq!(
            (e.code, e.message.as_str()),
            (400, "field label not supported: spec.selector")
        ),
        other => panic!("expected 400, got {other:?}"),
    }
    match api.list(&q("app in web")).await {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 400),
        other => panic!("expected 400, got {other:?}"),
    }

    // A node watch by name, as the agent does for its own Node.
    let nodes = Api::<Node>::all(c.clone());
    let mut nw = watcher(
        nodes,
        watcher::Config::default().fields("metadata.name=node-2"),
    );
    let mut errors = 0;
    assert_eq!(init_sequence(&mut nw, &mut errors).await, set(&["node-2"]));

    // A label-selected watch: an object leaving the selector is a Delete,
    // one entering it an Apply; others are not seen.
    let mut w = watcher(api.clone(), watcher::Config::default().labels("tier=front"));
    assert_eq!(init_sequence(&mut w, &mut errors).await, set(&["web"]));
    wait_for("the watches", || {
        server.open_watches(Kind::Service) == 1 && server.open_watches(Kind::Node) == 1
    })
    .await;
    server.apply(node("node-1", "192.168.0.11")).unwrap();
    server.apply(node("node-2", "192.168.0.22")).unwrap();
    match next(&mut nw, &mut errors).await {
        Event::Apply(n) => assert_eq!(n.name_any(), "node-2"),
        e => panic!("{}", describe(&e)),
    }
    server
        .apply(svc(
            "default",
            "api",
            json!({"app": "api", "tier": "back", "x": "1"}),
            80,
        ))
        .unwrap();
    server
        .apply(svc(
            "default",
            "web",
            json!({"app": "web", "tier": "back"}),
            80,
        ))
        .unwrap();
    match next(&mut w, &mut errors).await {
        Event::Delete(s) => assert_eq!(s.name_any(), "web"),
        e => panic!("{}", describe(&e)),
    }
    server
        .apply(svc(
            "default",
            "api",
            json!({"app": "api", "tier": "front"}),
            80,
        ))
        .unwrap();
    match next(&mut w, &mut errors).await {
        Event::Apply(s) => assert_eq!(s.name_any(), "api"),
        e => panic!("{}", describe(&e)),
    }
    assert_eq!(errors, 0);
}

#[tokio::test]
async fn raw_watch_bookmarks_and_410() {
    let server = FakeApiServer::start_with(
        Config {
            bookmark_interval: Duration::from_millis(100),
            ..Config::default()
        },
        None,
        "127.0.0.1:0",
    )
    .unwrap();
    server.apply(svc("default", "a", json!({}), 80)).unwrap();
    let api = Api::<Service>::all(client(&server).await);

    // Bookmarks carry the current version; the stream ends at timeoutSeconds.
    let started = std::time::Instant::now();
    let mut s = api
        .watch(&WatchParams::default().timeout(1), "2")
        .await
        .unwrap()
        .boxed();
    let mut bookmarks = 0;
    while let Some(ev) = tokio::time::timeout(STEP, s.next()).await.unwrap() {
        match ev.unwrap() {
            WatchEvent::Bookmark(b) => {
                assert_eq!(b.metadata.resource_version, "2");
                bookmarks += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(bookmarks >= 5, "{bookmarks} bookmarks");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(950) && took < Duration::from_secs(3),
        "{took:?}"
    );

    // "0" starts with synthetic ADDED events for the current state.
    let mut s = api
        .watch(&WatchParams::default().timeout(1).disable_bookmarks(), "0")
        .await
        .unwrap()
        .boxed();
    match s.next().await.unwrap().unwrap() {
        WatchEvent::Added(o) => assert_eq!(o.name_any(), "a"),
        other => panic!("unexpected {other:?}"),
    }
    drop(s);

    // Too old: HTTP 200, then one ERROR event with a 410 Expired Status.
    server.apply(svc("default", "b", json!({}), 80)).unwrap();
    server.compact();
    let mut s = api
        .watch(&WatchParams::default(), "2")
        .await
        .unwrap()
        .boxed();
    match s.next().await.unwrap().unwrap() {
        WatchEvent::Error(e) => {
            assert_eq!(
                (e.code, e.reason.as_str(), e.status.as_str()),
                (410, "Expired", "Failure")
            );
            assert!(
                e.message.starts_with("too old resource version: 2 (3)"),
                "{}",
                e.message
            );
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(s.next().await.is_none(), "the stream ends after the ERROR");

    // The history window: only the last N events are retained.
    let small = FakeApiServer::start_with(
        Config {
            history_limit: 2,
            ..Config::default()
        },
        None,
        "127.0.0.1:0",
    )
    .unwrap();
    for i in 0..4 {
        small
            .apply(svc("default", &format!("s{i}"), json!({}), 80))
            .unwrap();
    }
    assert_eq!(small.history_len(), 2);
    let api = Api::<Service>::all(client(&small).await);
    let mut s = api
        .watch(&WatchParams::default(), "2")
        .await
        .unwrap()
        .boxed();
    assert!(matches!(s.next().await.unwrap().unwrap(), WatchEvent::Error(e) if e.code == 410));
    let mut s = api
        .watch(&WatchParams::default().timeout(1), "3")
        .await
        .unwrap()
        .boxed();
    let mut added = Vec::new();
    for _ in 0..2 {
        match s.next().await.unwrap().unwrap() {
            WatchEvent::Added(o) => added.push(o.name_any()),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(added, vec!["s2", "s3"]);
    assert_eq!(added.len(), 2);
}

#[tokio::test]
async fn streaming_list_watcher() {
    let server = start();
    server.apply(svc("default", "a", json!({}), 80)).unwrap();
    server.apply(svc("default", "b", json!({}), 80)).unwrap();
    let api = Api::<Service>::all(client(&server).await);
    let mut w = watcher(api, watcher::Config::default().streaming_lists());
    let mut errors = 0;
    // kube-rs emits no Init for a streaming list.
    assert_eq!(init_rest(&mut w, &mut errors).await, set(&["a", "b"]));
    server.apply(svc("default", "c", json!({}), 80)).unwrap();
    match next(&mut w, &mut errors).await {
        Event::Apply(s) => assert_eq!(s.name_any(), "c"),
        e => panic!("{}", describe(&e)),
    }
    assert_eq!(server.lists(Kind::Service), 0);
    let watch = server
        .requests()
        .into_iter()
        .find(|r| r.verb == Some(Verb::Watch))
        .unwrap();
    assert_eq!(watch.param("sendInitialEvents").as_deref(), Some("true"));
    assert_eq!(
        watch.param("resourceVersionMatch").as_deref(),
        Some("NotOlderThan")
    );
    assert_eq!(watch.param("resourceVersion").as_deref(), Some("0"));
}

#[tokio::test]
async fn http_writes_and_status_errors() {
    let server = start();
    let c = client(&server).await;
    let api = Api::<Service>::namespaced(c.clone(), "default");
    let obj: Service =
        serde_json::from_value(svc("default", "web", json!({"app": "web"}), 80)).unwrap();

    let created = api.create(&PostParams::default(), &obj).await.unwrap();
    assert_eq!(created.resource_version().as_deref(), Some("2"));
    assert_eq!(
        server.get(Kind::Service, "default", "web").unwrap()["metadata"]["uid"].as_str(),
        created.uid().as_deref()
    );
    let api_err = |r: Result<Service, kube::Error>| match r {
        Err(kube::Error::Api(e)) => (e.code, e.reason),
        other => panic!("expected an API error, got {other:?}"),
    };
    assert_eq!(
        api_err(api.create(&PostParams::default(), &obj).await),
        (409, "AlreadyExists".into())
    );
    assert_eq!(api_err(api.get("nope").await), (404, "NotFound".into()));

    let mut changed = created.clone();
    changed.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 81;
    let replaced = api
        .replace("web", &PostParams::default(), &changed)
        .await
        .unwrap();
    assert_eq!(replaced.resource_version().as_deref(), Some("3"));
    // Replacing from a stale copy is a conflict.
    assert_eq!(
        api_err(api.replace("web", &PostParams::default(), &changed).await),
        (409, "Conflict".into())
    );

    let patched = api
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.labels().get("x").map(String::as_str), Some("y"));
    assert_eq!(patched.labels().get("app").map(String::as_str), Some("web"));

    let deleted = api.delete("web", &DeleteParams::default()).await.unwrap();
    assert!(deleted.left().is_some());
    assert_eq!(api_err(api.get("web").await), (404, "NotFound".into()));
    assert!(
        matches!(api.delete("web", &DeleteParams::default()).await, Err(kube::Error::Api(e)) if e.code == 404)
    );

    // Cluster-scoped nodes, and discovery-group slices.
    let nodes = Api::<Node>::all(c.clone());
    let n: Node = serde_json::from_value(node("n1", "192.168.0.1")).unwrap();
    nodes.create(&PostParams::default(), &n).await.unwrap();
    assert!(server.get(Kind::Node, "", "n1").unwrap()["metadata"]
        .get("namespace")
        .is_none());
    let slices = Api::<EndpointSlice>::namespaced(c.clone(), "default");
    let s: EndpointSlice =
        serde_json::from_value(slice("default", "web-1", "web", "10.0.0.1")).unwrap();
    slices.create(&PostParams::default(), &s).await.unwrap();
    assert_eq!(server.objects(Kind::EndpointSlice).len(), 1);

    // Discovery answers, should anything ask.
    let v = c.apiserver_version().await.unwrap();
    assert_eq!((v.major.as_str(), v.minor.as_str()), ("1", "33"));
    let groups = c.list_api_groups().await.unwrap();
    assert_eq!(groups.groups[0].name, "discovery.k8s.io");
    let core = c.list_core_api_resources("v1").await.unwrap();
    assert!(core.resources.iter().any(|r| r.name == "services"));

    assert_eq!(server.request_count(Kind::Service, Verb::Create), 2);
    assert_eq!(server.request_count(Kind::Service, Verb::Update), 2);
    assert_eq!(server.request_count(Kind::Service, Verb::Patch), 1);
    assert_eq!(server.request_count(Kind::Service, Verb::Delete), 2);
}

/// Inside a network namespace: reachable there, not from the root namespace.
/// Needs root and `ip` (`cargo xtask setup`); fails with a message without
/// them, never passes silently.
#[test]
fn serves_inside_a_network_namespace() {
    xtask::testenv::require_root();
    assert!(
        std::process::Command::new("ip").arg("-V").output().is_ok(),
        "this test needs iproute2's `ip` (`cargo xtask setup` installs it)"
    );
    let ns = format!("sb-fakeapi-{}", std::process::id());
    let ip = |args: &[&str]| proxy_testkit::netns::ip(args).unwrap_or_else(|e| panic!("{e:#}"));
    struct Cleanup(String);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", &self.0])
                .status();
        }
    }
    let _ = std::process::Command::new("ip")
        .args(["netns", "del", &ns])
        .output();
    ip(&["netns", "add", &ns]);
    let _cleanup = Cleanup(ns.clone());
    ip(&["-n", &ns, "link", "set", "lo", "up"]);

    let server = FakeApiServer::start_in_netns(Some(&ns), "127.0.0.1:0").unwrap();
    server.apply(svc("default", "web", json!({}), 80)).unwrap();
    let port = server.addr().port();
    // From the root namespace: nothing listens there.
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    // From inside (a thread that enters the namespace): the list answers.
    let inside = xtask::sandbox::http_get(
        &ns,
        ([127, 0, 0, 1], port).into(),
        "/api/v1/services",
        Duration::from_secs(5),
    )
    .expect("GET from inside the namespace");
    assert_eq!(inside.status, 200, "{inside:?}");
    assert!(inside.body.contains("\"name\":\"web\""), "{inside:?}");
    // Restart keeps the namespace.
    server.restart().unwrap();
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    drop(server);
}
