//! The forwarding rate on one core: `sb_bench fwd` in a sandbox of its
//! own, XDP live frames into the node's stack through the tc path.

use std::path::Path;

use anyhow::{ensure, Context, Result};

use super::plan::Plan;
use super::read_json;
use super::results::Fwd;
use crate::sandbox::{self, Sandbox};
use crate::util::show;

/// The sandbox's tag.
pub const TAG: &str = "sbbfwd";

pub fn run(sb_bench: &Path, plan: &Plan, dir: &Path) -> Result<Fwd> {
    let sb = Sandbox::new(TAG)?;
    let file = dir.join("fwd.json");
    let bin = sb_bench.to_string_lossy().into_owned();
    let file_s = file.to_string_lossy().into_owned();
    let frames = plan.fwd_frames.to_string();
    let pods: Vec<String> = (1..=sandbox::PODS)
        .map(|i| format!("{}:{}:{}", sb.pod_if(i), sb.pod_ns(i), sandbox::pod_ip(i)))
        .collect();
    let client_if = sb.client_if();
    let mut args: Vec<&str> = vec![
        &bin,
        "fwd",
        "--ingress",
        &client_if,
        "--count",
        &frames,
        "--out",
        &file_s,
    ];
    for p in &pods {
        args.extend(["--pod", p.as_str()]);
    }
    let mut c = sb.command(&sb.node_ns(), &args);
    let status = c
        .status()
        .with_context(|| format!("start `{}`", show(&c)))?;
    drop(sb);
    ensure!(status.success(), "`{}` failed: {status}", show(&c));
    read_json(&file)
}
