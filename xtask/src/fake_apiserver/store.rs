//! The object store: current objects, one global resourceVersion counter, and
//! the retained event history that watches resume from (the "watch cache").

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};

use super::Kind;

/// A Kubernetes `Status` failure, as the API server returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub code: u16,
    pub reason: String,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason.into(),
            message: message.into(),
            details: None,
        }
    }

    fn named(code: u16, reason: &str, kind: Kind, name: &str, message: String) -> Self {
        let mut details = json!({"name": name, "kind": kind.plural()});
        if !kind.group().is_empty() {
            details["group"] = json!(kind.group());
        }
        Self {
            code,
            reason: reason.into(),
            message,
            details: Some(details),
        }
    }

    pub fn not_found(kind: Kind, name: &str) -> Self {
        Self::named(
            404,
            "NotFound",
            kind,
            name,
            format!("{} {name:?} not found", kind.qualified()),
        )
    }

    pub fn already_exists(kind: Kind, name: &str) -> Self {
        Self::named(
            409,
            "AlreadyExists",
            kind,
            name,
            format!("{} {name:?} already exists", kind.qualified()),
        )
    }

    pub fn conflict(kind: Kind, name: &str) -> Self {
        Self::named(
            409,
            "Conflict",
            kind,
            name,
            format!(
                "Operation cannot be fulfilled on {} {name:?}: the object has been modified; \
                 please apply your changes to the latest version and try again",
                kind.qualified()
            ),
        )
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn invalid(kind: Kind, name: &str, message: impl Into<String>) -> Self {
        let message = format!("{} {name:?} is invalid: {}", kind.kind(), message.into());
        Self::named(422, "Invalid", kind, name, message)
    }

    /// What the API server says for a resourceVersion it no longer (or never) had.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// The `Status` object.
    pub fn status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One retained change. `obj` is the object after the change (for DELETED:
/// the last state, carrying the deletion's resourceVersion); `prev` the one
/// before (for MODIFIED and DELETED).
#[derive(Clone, Debug)]
pub struct HistEvent {
    pub rv: u64,
    pub kind: Kind,
    pub ns: String,
    pub name: String,
    pub ty: EventType,
    pub obj: Value,
    pub prev: Option<Value>,
}

pub type Key = (String, String); // (namespace, name); namespace "" for cluster-scoped

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PutMode {
    /// POST: fails with 409 AlreadyExists if present.
    Create,
    /// PUT: fails with 404 if absent, 409 Conflict if `metadata.resourceVersion`
    /// is set and stale.
    Update,
    /// Test hook: create or replace unconditionally.
    Upsert,
}

pub struct Store {
    objects: BTreeMap<Kind, BTreeMap<Key, Value>>,
    history: VecDeque<HistEvent>,
    /// Current (latest) resourceVersion.
    pub rv: u64,
    /// Oldest resourceVersion a watch can resume from: history holds every
    /// event with rv > floor.
    pub floor: u64,
    history_limit: usize,
    uid_seq: u64,
    uid_salt: u64,
}

fn now_rfc3339() -> String {
    crate::util::rfc3339(SystemTime::now(), k8s_openapi::chrono::SecondsFormat::Secs)
}

fn random_salt() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

fn meta(obj: &Value) -> Option<&Map<String, Value>> {
    obj.get("metadata").and_then(Value::as_object)
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    meta(obj)
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// Sets `metadata.resourceVersion` on an object.
pub fn set_rv(obj: &mut Value, rv: u64) {
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        m.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
}

impl Store {
    pub fn new(history_limit: usize, first_rv: u64) -> Self {
        Self {
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            rv: first_rv,
            floor: first_rv,
            history_limit,
            uid_seq: 0,
            uid_salt: random_salt(),
        }
    }

    fn new_uid(&mut self) -> String {
        self.uid_seq += 1;
        let a = self.uid_salt;
        let b = self.uid_seq;
        format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            (a >> 32) as u32,
            (a >> 16) as u16,
            (a & 0xfff) as u16,
            ((b >> 48) & 0xfff) as u16,
            b & 0xffff_ffff_ffff
        )
    }

    fn record(&mut self, ev: HistEvent) {
        self.history.push_back(ev);
        while self.history.len() > self.history_limit {
            let old = self.history.pop_front().expect("non-empty");
            self.floor = old.rv;
        }
    }

    /// Forgets all history: watches can only resume from the current version.
    pub fn compact(&mut self) {
        self.history.clear();
        self.floor = self.rv;
    }

    pub fn get(&self, kind: Kind, ns: &str, name: &str) -> Option<&Value> {
        let ns = if kind.namespaced() { ns } else { "" };
        self.objects
            .get(&kind)?
            .get(&(ns.to_string(), name.to_string()))
    }

    pub fn current(&self, kind: Kind) -> BTreeMap<Key, Value> {
        self.objects.get(&kind).cloned().unwrap_or_default()
    }

    /// The current objects of `kind`, borrowed (a list page clones only the
    /// objects it returns: at 100k objects, cloning them all per page of
    /// 500 made a paged list quadratic).
    pub fn current_ref(&self, kind: Kind) -> &BTreeMap<Key, Value> {
        static EMPTY: BTreeMap<Key, Value> = BTreeMap::new();
        self.objects.get(&kind).unwrap_or(&EMPTY)
    }

    /// The objects of `kind` as they were at resourceVersion `rv`, rebuilt
    /// from the current state by undoing the retained events after `rv`.
    pub fn state_at(&self, kind: Kind, rv: u64) -> Result<BTreeMap<Key, Value>, ApiError> {
        if rv < self.floor {
            return Err(ApiError::expired(format!(
                "too old resource version: {rv} ({})",
                self.floor
            )));
        }
        if rv > self.rv {
            return Err(ApiError::new(
                504,
                "Timeout",
                format!("Too large resource version: {rv}, current: {}", self.rv),
            ));
        }
        let mut m = self.current(kind);
        for ev in self.history.iter().rev() {
            if ev.rv <= rv {
                break;
            }
            if ev.kind != kind {
                continue;
            }
            let key = (ev.ns.clone(), ev.name.clone());
            match ev.ty {
                EventType::Added => {
                    m.remove(&key);
                }
                EventType::Modified | EventType::Deleted => {
                    m.insert(key, ev.prev.clone().expect("prev recorded"));
                }
            }
        }
        Ok(m)
    }

    /// Events after `rv`, or None if they are no longer all retained.
    pub fn events_after(&self, rv: u64) -> Option<Vec<HistEvent>> {
        if rv < self.floor {
            return None;
        }
        // history is ordered by rv; find the first event after `rv`.
        let start = self.history.partition_point(|e| e.rv <= rv);
        Some(self.history.iter().skip(start).cloned().collect())
    }

    /// Validates and completes an incoming object for `kind`; returns it with
    /// its namespace and name.
    fn normalize(
        &mut self,
        kind: Kind,
        mut obj: Value,
        path_ns: Option<&str>,
    ) -> Result<(Value, String, String), ApiError> {
        let o = obj
            .as_object_mut()
            .ok_or_else(|| ApiError::bad_request("the body must be a JSON object"))?;
        match o.get("apiVersion").and_then(Value::as_str) {
            None | Some("") => {
                o.insert("apiVersion".into(), json!(kind.api_version()));
            }
            Some(v) if v == kind.api_version() => {}
            Some(v) => {
                return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({})",
                kind.api_version()
            )))
            }
        }
        match o.get("kind").and_then(Value::as_str) {
            None | Some("") => {
                o.insert("kind".into(), json!(kind.kind()));
            }
            Some(k) if k == kind.kind() => {}
            Some(k) => {
                return Err(ApiError::bad_request(format!(
                    "the kind in the data ({k}) does not match the expected kind ({})",
                    kind.kind()
                )))
            }
        }
        let m = o
            .entry("metadata")
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .ok_or_else(|| ApiError::bad_request("metadata must be an object"))?;
        let name = match m
            .get("name")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
        {
            Some(n) => n.to_string(),
            None => match m
                .get("generateName")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
            {
                Some(prefix) => {
                    self.uid_seq += 1;
                    let suffix: String =
                        format!("{:x}", self.uid_salt.wrapping_mul(self.uid_seq | 1))
                            .chars()
                            .filter(|c| !matches!(c, 'a' | 'e' | 'i' | 'o' | 'u'))
                            .take(5)
                            .collect();
                    let n = format!("{prefix}{suffix}");
                    m.insert("name".into(), json!(n));
                    n
                }
                None => {
                    return Err(ApiError::invalid(
                        kind,
                        "",
                        "metadata.name: Required value: name or generateName is required",
                    ))
                }
            },
        };
        let ns = if kind.namespaced() {
            let body_ns = m
                .get("namespace")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string);
            let ns = match (path_ns, body_ns) {
                (Some(p), Some(b)) if p != b => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ))
                }
                (Some(p), _) => p.to_string(),
                (None, Some(b)) => b,
                (None, None) => "default".to_string(),
            };
            m.insert("namespace".into(), json!(ns));
            ns
        } else {
            m.remove("namespace");
            String::new()
        };
        Ok((obj, ns, name))
    }

    /// Creates or updates an object; returns the stored object. An update
    /// that changes nothing is a no-op (no new resourceVersion, no event), as
    /// on the real server.
    pub fn put(
        &mut self,
        kind: Kind,
        obj: Value,
        path_ns: Option<&str>,
        mode: PutMode,
    ) -> Result<Value, ApiError> {
        let (mut obj, ns, name) = self.normalize(kind, obj, path_ns)?;
        let key = (ns.clone(), name.clone());
        let existing = self.objects.get(&kind).and_then(|m| m.get(&key)).cloned();
        match (&existing, mode) {
            (Some(_), PutMode::Create) => return Err(ApiError::already_exists(kind, &name)),
            (None, PutMode::Update) => return Err(ApiError::not_found(kind, &name)),
            (Some(old), PutMode::Update) => {
                if let Some(sent) = meta_str(&obj, "resourceVersion") {
                    if Some(sent) != meta_str(old, "resourceVersion") {
                        return Err(ApiError::conflict(kind, &name));
                    }
                }
            }
            _ => {}
        }
        let m = obj["metadata"].as_object_mut().expect("normalized");
        match &existing {
            Some(old) => {
                for f in ["uid", "creationTimestamp", "resourceVersion"] {
                    match meta(old).and_then(|om| om.get(f)) {
                        Some(v) => m.insert(f.into(), v.clone()),
                        None => m.remove(f),
                    };
                }
                if &obj == old {
                    return Ok(obj);
                }
            }
            None => {
                m.insert("uid".into(), json!(self.new_uid()));
                m.insert("creationTimestamp".into(), json!(now_rfc3339()));
            }
        }
        self.rv += 1;
        let rv = self.rv;
        set_rv(&mut obj, rv);
        self.objects
            .entry(kind)
            .or_default()
            .insert(key, obj.clone());
        let ty = if existing.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.record(HistEvent {
            rv,
            kind,
            ns,
            name,
            ty,
            obj: obj.clone(),
            prev: existing,
        });
        Ok(obj)
    }

    /// Deletes an object; returns its last state (with the deletion's
    /// resourceVersion).
    pub fn delete(&mut self, kind: Kind, ns: &str, name: &str) -> Result<Value, ApiError> {
        let ns = if kind.namespaced() { ns } else { "" };
        let key = (ns.to_string(), name.to_string());
        let prev = self
            .objects
            .get_mut(&kind)
            .and_then(|m| m.remove(&key))
            .ok_or_else(|| ApiError::not_found(kind, name))?;
        self.rv += 1;
        let rv = self.rv;
        let mut obj = prev.clone();
        set_rv(&mut obj, rv);
        self.record(HistEvent {
            rv,
            kind,
            ns: key.0,
            name: key.1,
            ty: EventType::Deleted,
            obj: obj.clone(),
            prev: Some(prev),
        });
        Ok(obj)
    }

    pub fn history_len(&self) -> usize {
        self.history.len()
    }
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            let t = target.as_object_mut().expect("object");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(name: &str, port: u16) -> Value {
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "default"},
               "spec": {"ports": [{"port": port}]}})
    }

    #[test]
    fn rv_history_and_snapshots() {
        let mut s = Store::new(100, 1);
        let a = s
            .put(Kind::Service, svc("a", 80), None, PutMode::Upsert)
            .unwrap();
        assert_eq!(a["metadata"]["resourceVersion"], "2");
        let uid = a["metadata"]["uid"].clone();
        // no-op update
        let a2 = s
            .put(Kind::Service, svc("a", 80), None, PutMode::Upsert)
            .unwrap();
        assert_eq!(a2["metadata"]["resourceVersion"], "2");
        assert_eq!(s.rv, 2);
        let a3 = s
            .put(Kind::Service, svc("a", 81), None, PutMode::Upsert)
            .unwrap();
        assert_eq!(a3["metadata"]["resourceVersion"], "3");
        assert_eq!(a3["metadata"]["uid"], uid);
        s.put(Kind::Service, svc("b", 80), None, PutMode::Upsert)
            .unwrap();
        s.delete(Kind::Service, "default", "a").unwrap();
        assert_eq!(s.rv, 5);
        let at2 = s.state_at(Kind::Service, 2).unwrap();
        assert_eq!(at2.len(), 1);
        assert_eq!(
            at2[&("default".into(), "a".into())]["spec"]["ports"][0]["port"],
            80
        );
        assert_eq!(s.state_at(Kind::Service, 4).unwrap().len(), 2);
        assert_eq!(s.state_at(Kind::Service, 5).unwrap().len(), 1);
        assert_eq!(s.events_after(3).unwrap().len(), 2);
        s.compact();
        assert!(s.events_after(3).is_none());
        assert_eq!(s.state_at(Kind::Service, 3).unwrap_err().code, 410);
        assert_eq!(s.events_after(5).unwrap().len(), 0);
    }

    #[test]
    fn create_update_conflicts() {
        let mut s = Store::new(2, 1);
        s.put(
            Kind::Service,
            svc("a", 80),
            Some("default"),
            PutMode::Create,
        )
        .unwrap();
        assert_eq!(
            s.put(Kind::Service, svc("a", 80), None, PutMode::Create)
                .unwrap_err()
                .code,
            409
        );
        assert_eq!(
            s.put(Kind::Service, svc("x", 80), None, PutMode::Update)
                .unwrap_err()
                .code,
            404
        );
        let mut stale = svc("a", 82);
        stale["metadata"]["resourceVersion"] = json!("1");
        assert_eq!(
            s.put(Kind::Service, stale, None, PutMode::Update)
                .unwrap_err()
                .reason,
            "Conflict"
        );
        assert_eq!(
            s.put(Kind::Service, svc("a", 80), Some("other"), PutMode::Create)
                .unwrap_err()
                .code,
            400
        );
        // history window of 2
        s.put(Kind::Service, svc("b", 80), None, PutMode::Upsert)
            .unwrap();
        s.put(Kind::Service, svc("c", 80), None, PutMode::Upsert)
            .unwrap();
        assert_eq!(s.history_len(), 2);
        assert_eq!(s.floor, 2);
        assert!(s.events_after(1).is_none());
        assert_eq!(s.events_after(2).unwrap().len(), 2);
    }

    #[test]
    fn timestamp_format() {
        let t = now_rfc3339();
        assert_eq!(t.len(), 20, "{t}");
        assert!(t.starts_with("20"));
    }
}
