//! `sb-apiserver`: the fake Kubernetes API server, for use by hand.
//!
//! ```text
//! sb-apiserver --listen 127.0.0.1:6443 --kubeconfig /tmp/fake.kubeconfig -f manifests/demo/
//! KUBECONFIG=/tmp/fake.kubeconfig switchboard agent --source cluster
//! curl -s localhost:6443/api/v1/services
//! curl -sN 'localhost:6443/api/v1/services?watch=true&allowWatchBookmarks=true'
//! curl -s -XPOST -H 'content-type: application/json' -d @svc.json localhost:6443/api/v1/namespaces/default/services
//! curl -s -XDELETE localhost:6443/api/v1/namespaces/default/services/web
//! ```
//!
//! Faults for trying the agent under a failing API server: `--fail-requests
//! N`, `--fail-fraction 0.2`, `--throttle-requests N --retry-after S`,
//! `--delay-ms MS`, `--silent-watches`, `--cut-watches-every SECONDS`.
//!
//! Runs until interrupted.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use serde_json::Value;
use xtask::fake_apiserver::{Config, FakeApiServer, Faults, Kind};

#[derive(Parser)]
#[command(
    name = "sb-apiserver",
    about = "Fake Kubernetes API server (services, endpointslices, nodes) for switchboard tests"
)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: String,
    /// Create the listening socket inside this network namespace (/run/netns/NAME).
    #[arg(long)]
    netns: Option<String>,
    /// Write a kubeconfig pointing at the server to this path.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// YAML/JSON manifests (files or directories) to load at start-up;
    /// objects of other kinds are skipped.
    #[arg(short = 'f', long = "file")]
    files: Vec<PathBuf>,
    /// Events of history kept for resuming watches.
    #[arg(long, default_value_t = 100_000)]
    history: usize,
    /// Seconds between watch bookmarks.
    #[arg(long, default_value_t = 1.0)]
    bookmark_interval: f64,
    /// Fault: answer the first N reads (list, watch, get) with HTTP 500.
    #[arg(long, value_name = "N", default_value_t = 0)]
    fail_requests: u64,
    /// Fault: answer this share of reads (0 to 1) with HTTP 500.
    #[arg(long, value_name = "SHARE", default_value_t = 0.0)]
    fail_fraction: f64,
    /// Fault: answer the first N reads with HTTP 429 and Retry-After.
    #[arg(long, value_name = "N", default_value_t = 0)]
    throttle_requests: u64,
    /// The Retry-After (seconds) of those 429s.
    #[arg(long, value_name = "SECONDS", default_value_t = 1)]
    retry_after: u64,
    /// Fault: wait this long before answering each read.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    delay_ms: u64,
    /// Fault: every watch stays silent (held open; no event, no bookmark).
    #[arg(long)]
    silent_watches: bool,
    /// Fault: cut every open watch in the middle of a line this often.
    #[arg(long, value_name = "SECONDS")]
    cut_watches_every: Option<f64>,
    /// Log each request to stderr.
    #[arg(short, long)]
    verbose: bool,
}

fn load(server: &FakeApiServer, path: &Path) -> Result<usize> {
    if path.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path)?
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .collect();
        entries.sort();
        let mut n = 0;
        for p in entries {
            let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("");
            if p.is_dir() || matches!(ext, "yaml" | "yml" | "json") {
                n += load(server, &p)?;
            }
        }
        return Ok(n);
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut n = 0;
    // JSON is YAML too. The files are the tests' and benchmarks' own, some
    // with thousands of documents: none of the parser's limits (1024
    // documents by default, meant for files from elsewhere) applies.
    let mut options = serde_saphyr::Options::default();
    options.budget = None;
    let docs: Vec<Value> = serde_saphyr::from_multiple_with_options(&text, options)
        .with_context(|| format!("parsing {}", path.display()))?;
    for v in docs {
        let items = match v.get("items").and_then(Value::as_array) {
            Some(items)
                if v.get("kind")
                    .and_then(Value::as_str)
                    .is_some_and(|k| k.ends_with("List")) =>
            {
                items.clone()
            }
            _ => vec![v],
        };
        for obj in items {
            if obj.is_null() {
                continue;
            }
            if Kind::of(&obj).is_some() {
                server
                    .apply(&obj)
                    .with_context(|| format!("applying an object from {}", path.display()))?;
                n += 1;
            }
        }
    }
    Ok(n)
}

fn main() -> Result<()> {
    let args = Args::parse();
    let config = Config {
        history_limit: args.history,
        bookmark_interval: Duration::from_secs_f64(args.bookmark_interval),
        ..Config::default()
    };
    let server = FakeApiServer::start_with(config, args.netns.as_deref(), &args.listen)?;
    let mut loaded = 0;
    for f in &args.files {
        loaded += load(&server, f)?;
    }
    server.set_faults(Faults {
        fail_next: args.fail_requests,
        fail_fraction: args.fail_fraction,
        throttle_next: args.throttle_requests,
        retry_after: Duration::from_secs(args.retry_after),
        delay: Duration::from_millis(args.delay_ms),
        silent_watches: args.silent_watches,
    });
    let cut_every = args.cut_watches_every.map(Duration::from_secs_f64);
    let mut last_cut = std::time::Instant::now();
    if let Some(k) = &args.kubeconfig {
        server.write_kubeconfig(k)?;
        eprintln!("kubeconfig: {}", k.display());
    }
    eprintln!(
        "fake apiserver on {}{} ({loaded} objects loaded, resourceVersion {})",
        server.url(),
        args.netns
            .as_deref()
            .map(|n| format!(" in netns {n}"))
            .unwrap_or_default(),
        server.resource_version()
    );
    let (tx, rx) = std::sync::mpsc::channel();
    ctrlc::set_handler(move || {
        let _ = tx.send(());
    })?;
    let mut seen = 0;
    loop {
        if rx.recv_timeout(Duration::from_millis(200)).is_ok() {
            break;
        }
        if let Some(every) = cut_every {
            if last_cut.elapsed() >= every {
                server.cut_watches_mid_event();
                last_cut = std::time::Instant::now();
            }
        }
        if args.verbose {
            let reqs = server.requests();
            for r in &reqs[seen..] {
                let q = if r.query.is_empty() {
                    String::new()
                } else {
                    format!("?{}", r.query)
                };
                eprintln!("{} {}{} -> {}", r.method, r.path, q, r.status);
            }
            seen = reqs.len();
        }
    }
    server.stop();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The benchmarks hand it files of more than the parser's default 1024
    /// documents.
    #[test]
    fn loads_a_file_of_thousands_of_documents() {
        let dir = std::env::temp_dir().join(format!("sb-apiserver-load-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("services.yaml");
        let text: String = (0..1500)
            .map(|i| {
                format!(
                    "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: s{i}\n  namespace: bench\nspec:\n  clusterIP: 10.96.{}.{}\n  ports:\n  - port: 80\n    protocol: TCP\n",
                    i / 250,
                    i % 250 + 1
                )
            })
            .collect();
        std::fs::write(&path, text).expect("write the manifest");
        let server = FakeApiServer::start("127.0.0.1:0").expect("start");
        let loaded = load(&server, &path);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(loaded.expect("load"), 1500);
        assert_eq!(server.objects(Kind::Service).len(), 1500);
    }
}
