//! The model's cases: one file each in `model/cases/`, Kubernetes objects
//! in, the frontends and warnings out (`util/txtar.rs` runs them; `docs/testing.md`
//! says how to add one).
//!
//! A case is a comment saying what it shows, then steps. A step makes
//! changes, then says what the model holds after them:
//!
//! - `-- flags --`: the agent flags the model reads, one a line:
//!   `--proxy-name NAME` (before the first change only) and
//!   `--max-endpoints-per-service N`;
//! - `-- input.yaml --`: Services, EndpointSlices and this node's Node as a
//!   user writes them; each replaces the object of its kind and name;
//! - `-- delete --`: objects deleted, one a line: `Service ns/name`,
//!   `EndpointSlice ns/name` or `Node name`;
//! - `-- frontends --`: every frontend after the step, one a line, in
//!   address order (`Frontend`'s display, which shows every field);
//! - `-- warnings --`: every warning after the step, sorted (left out: none).
//!
//! Besides what a case says, the runner checks at every step that the
//! update's delta names exactly the frontends and warnings that changed and
//! that backend lists are sorted and deduplicated; after the first step,
//! that a one-shot build of the same objects (`build_limited`) gives the same
//! state, and that the objects fed one at a time in reverse order, then
//! removed one at a time, give the same state and then nothing.
use std::collections::BTreeSet;

use super::*;
use crate::util::txtar::{self, Archive, At, Produced};

#[test]
fn cases() {
    txtar::run_dir("src/model/cases", run);
}

/// The objects of one `input.yaml`.
#[derive(Default)]
pub(super) struct Objects {
    pub(super) services: Vec<Service>,
    pub(super) slices: Vec<EndpointSlice>,
    nodes: Vec<Node>,
}

/// Services, EndpointSlices and a Node from a multi-document manifest.
pub(super) fn objects(yaml: &str) -> Result<Objects, String> {
    let mut objects = Objects::default();
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(yaml).map_err(|e| format!("input.yaml: {e}"))?;
    for value in docs.into_iter().filter(|v| !v.is_null()) {
        let kind = value["kind"].as_str().unwrap_or_default().to_string();
        let bad = |e: serde_json::Error| format!("input.yaml: a {kind}: {e}");
        match kind.as_str() {
            "Service" => objects
                .services
                .push(serde_json::from_value(value).map_err(bad)?),
            "EndpointSlice" => objects
                .slices
                .push(serde_json::from_value(value).map_err(bad)?),
            "Node" => objects
                .nodes
                .push(serde_json::from_value(value).map_err(bad)?),
            other => return Err(format!("input.yaml: kind {other:?} is not read here")),
        }
    }
    if objects.nodes.len() > 1 {
        return Err("input.yaml: one Node (this node) at most".into());
    }
    Ok(objects)
}

#[derive(Default)]
struct Flags {
    proxy_name: Option<String>,
    max_endpoints: Option<u16>,
}

impl Flags {
    fn read(&mut self, body: &str) -> Result<(), String> {
        for line in body.lines().filter(|l| !l.trim().is_empty()) {
            match line.split_whitespace().collect::<Vec<_>>()[..] {
                ["--proxy-name", name] => self.proxy_name = Some(name.to_string()),
                ["--max-endpoints-per-service", n] => {
                    self.max_endpoints = Some(n.parse().map_err(|e| format!("{line}: {e}"))?)
                }
                _ => return Err(format!("flags: {line:?} is not a flag the model reads")),
            }
        }
        Ok(())
    }

    fn model(&self) -> Model {
        let mut model = Model::new(None, self.proxy_name.clone());
        if let Some(max) = self.max_endpoints {
            model.set_max_endpoints_per_port(max);
        }
        model
    }
}

fn rendered<T: ToString>(items: impl Iterator<Item = T>) -> String {
    items.map(|i| i.to_string() + "\n").collect()
}

fn run(archive: &Archive) -> Result<Vec<Produced>, String> {
    let sections = &archive.sections;
    let mut flags = Flags::default();
    let mut model: Option<Model> = None;
    let mut interner = Interner::default();
    // The first step's objects, until its expectations are checked.
    let mut first = Some(Objects::default());
    let mut changes = 0;
    let mut produced = Vec::new();
    let mut i = 0;
    while i < sections.len() {
        let section = &sections[i];
        let at = format!("section {} (`{}`)", i + 1, section.name);
        match section.name.as_str() {
            "flags" => {
                let proxy_name = flags.proxy_name.clone();
                flags.read(&section.body)?;
                if let Some(model) = model.as_mut() {
                    if flags.proxy_name != proxy_name {
                        return Err(format!("{at}: --proxy-name before the first change only"));
                    }
                    if let Some(max) = flags.max_endpoints {
                        model.set_max_endpoints_per_port(max);
                    }
                }
                changes += 1;
            }
            "input.yaml" => {
                let objects = objects(&section.body)?;
                let model = model.get_or_insert_with(|| flags.model());
                for svc in &objects.services {
                    let info = ServiceInfo::from_k8s(svc);
                    model.set_service(info.key.clone(), Some(Arc::new(info)));
                }
                for slice in &objects.slices {
                    let info = SliceInfo::from_k8s(slice, &mut interner);
                    model.set_slice(info.key.clone(), Some(Arc::new(info)));
                }
                if let Some(node) = objects.nodes.first() {
                    model.set_node(Some(NodeInfo::from_node(node)));
                }
                if let Some(first) = first.as_mut() {
                    first.services.extend(objects.services);
                    first.slices.extend(objects.slices);
                    first.nodes.extend(objects.nodes);
                }
                changes += 1;
            }
            "delete" => {
                let Some(model) = model.as_mut().filter(|_| first.is_none()) else {
                    return Err(format!("{at}: the first step adds objects"));
                };
                for line in section.body.lines().filter(|l| !l.trim().is_empty()) {
                    let key = |key: &str| match key.split_once('/') {
                        Some((ns, name)) => Ok(ObjectKey::new(ns, name)),
                        None => Err(format!("{at}: {line:?}: not namespace/name")),
                    };
                    match line.split_whitespace().collect::<Vec<_>>()[..] {
                        ["Service", k] => model.set_service(key(k)?, None),
                        ["EndpointSlice", k] => model.set_slice(key(k)?, None),
                        ["Node", _] => model.set_node(None),
                        _ => return Err(format!("{at}: {line:?}: not KIND namespace/name")),
                    }
                }
                changes += 1;
            }
            "frontends" => {
                if changes == 0 {
                    return Err(format!("{at}: no change before it"));
                }
                changes = 0;
                let model = model.get_or_insert_with(|| flags.model());
                step(model).map_err(|e| format!("{at}: {e}"))?;
                if let Some(first) = first.take() {
                    first_step(&first, &flags, model).map_err(|e| format!("{at}: {e}"))?;
                }
                produced.push(Produced {
                    at: At::Section(i),
                    name: "frontends".into(),
                    text: rendered(model.desired().frontends.values()),
                });
                let warnings = rendered(model.warnings());
                if sections.get(i + 1).is_some_and(|s| s.name == "warnings") {
                    i += 1;
                    produced.push(Produced {
                        at: At::Section(i),
                        name: "warnings".into(),
                        text: warnings,
                    });
                } else {
                    produced.push(Produced {
                        at: At::Absent { after: i },
                        name: "warnings".into(),
                        text: warnings,
                    });
                }
            }
            "warnings" => return Err(format!("{at}: comes right after `frontends`")),
            other => return Err(format!("{at}: unknown section {other:?}")),
        }
        i += 1;
    }
    if changes > 0 {
        return Err("changes after the last `-- frontends --`".into());
    }
    Ok(produced)
}

/// Updates the model and checks the delta against the states before and
/// after, and the state's own rules.
fn step(model: &mut Model) -> Result<(), String> {
    let before = model.desired().clone();
    let warnings_before: BTreeSet<ModelWarning> = model.warnings().cloned().collect();
    let delta = model.update();
    let after = model.desired();
    let changed: BTreeSet<FrontendAddr> = before
        .frontends
        .keys()
        .chain(after.frontends.keys())
        .filter(|a| before.frontends.get(a) != after.frontends.get(a))
        .copied()
        .collect();
    if delta.frontends != changed {
        return Err(format!(
            "the delta names {:?}, the frontends that changed are {changed:?}",
            delta.frontends
        ));
    }
    let warnings: BTreeSet<ModelWarning> = model.warnings().cloned().collect();
    let added: Vec<ModelWarning> = warnings.difference(&warnings_before).cloned().collect();
    let removed: Vec<ModelWarning> = warnings_before.difference(&warnings).cloned().collect();
    if delta.warnings_added != added || delta.warnings_removed != removed {
        return Err(format!(
            "the delta adds warnings {:?} and removes {:?}; the warnings added are {added:?}, removed {removed:?}",
            delta.warnings_added, delta.warnings_removed
        ));
    }
    for (addr, f) in &model.desired().frontends {
        if *addr != f.addr {
            return Err(format!("{f}: keyed by {addr}"));
        }
        let sorted = |list: &[BackendAddr]| list.windows(2).all(|w| w[0] < w[1]);
        if !sorted(&f.backends) || !f.external_backends.as_deref().is_none_or(sorted) {
            return Err(format!("{f}: backends not sorted and deduplicated"));
        }
        if f.external_backends.is_some() != (f.local_only && f.kind.is_external()) {
            return Err(format!(
                "{f}: a set from outside exactly on Local external frontends"
            ));
        }
    }
    Ok(())
}

/// The first step's state, built in one go and fed in another order.
fn first_step(objects: &Objects, flags: &Flags, model: &Model) -> Result<(), String> {
    let node = objects.nodes.first().map(NodeInfo::from_node);
    let proxy_name = flags.proxy_name.as_deref();
    let (built, warnings) = build_limited(
        &objects.services,
        &objects.slices,
        node.as_ref(),
        proxy_name,
        flags.max_endpoints,
    );
    let got: Vec<ModelWarning> = model.warnings().cloned().collect();
    if built != *model.desired() || warnings != got {
        return Err(format!(
            "a one-shot build differs:\n{}{}",
            rendered(built.frontends.values()),
            rendered(warnings.iter())
        ));
    }
    incremental_agrees(objects, node.as_ref(), flags)
}

/// Feeds the objects to a fresh [`Model`] one at a time (slices first,
/// everything in reverse order, an update after each), then removes them
/// one at a time: after the last addition the model must equal the full
/// build, after the last removal it must be empty, and each update's delta
/// must name exactly the frontends that changed.
fn incremental_agrees(
    objects: &Objects,
    node: Option<&NodeInfo>,
    flags: &Flags,
) -> Result<(), String> {
    let (want, want_warnings) = build_limited(
        &objects.services,
        &objects.slices,
        node,
        flags.proxy_name.as_deref(),
        flags.max_endpoints,
    );
    let mut model = flags.model();
    model.set_node(node.cloned());
    let mut interner = Interner::default();
    let slices: Vec<SliceInfo> = objects
        .slices
        .iter()
        .map(|s| SliceInfo::from_k8s(s, &mut interner))
        .collect();
    let services: Vec<ServiceInfo> = objects.services.iter().map(ServiceInfo::from_k8s).collect();
    for slice in slices.iter().rev() {
        model.set_slice(slice.key.clone(), Some(Arc::new(slice.clone())));
        step(&mut model).map_err(|e| format!("fed in reverse, slice {}: {e}", slice.key))?;
    }
    for svc in services.iter().rev() {
        model.set_service(svc.key.clone(), Some(Arc::new(svc.clone())));
        step(&mut model).map_err(|e| format!("fed in reverse, Service {}: {e}", svc.key))?;
    }
    let got_warnings: Vec<ModelWarning> = model.warnings().cloned().collect();
    if *model.desired() != want || got_warnings != want_warnings {
        return Err(format!(
            "fed in reverse, the model differs from the full build:\n{}{}",
            rendered(model.desired().frontends.values()),
            rendered(got_warnings.iter())
        ));
    }
    for svc in &services {
        model.set_service(svc.key.clone(), None);
        step(&mut model).map_err(|e| format!("removing Service {}: {e}", svc.key))?;
    }
    for slice in &slices {
        model.set_slice(slice.key.clone(), None);
        step(&mut model).map_err(|e| format!("removing slice {}: {e}", slice.key))?;
    }
    if !model.desired().frontends.is_empty() || model.warnings().next().is_some() {
        return Err("every object removed, but the model is not empty".into());
    }
    Ok(())
}
