//! Label and field selectors, parsed and matched the way kube-apiserver does
//! (k8s.io/apimachinery/pkg/labels and pkg/fields).

use serde_json::Value;

use super::Kind;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Op {
    Exists,
    DoesNotExist,
    Equals(String),
    NotEquals(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Gt(i64),
    Lt(i64),
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Requirement {
    key: String,
    op: Op,
}

/// A parsed `labelSelector`. All requirements must hold (they are ANDed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector {
    reqs: Vec<Requirement>,
}

fn valid_key(key: &str) -> bool {
    // [prefix/]name; prefix a DNS subdomain, name <= 63 chars of [A-Za-z0-9._-],
    // starting and ending alphanumeric.
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        if p.is_empty()
            || p.len() > 253
            || !p
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        {
            return false;
        }
    }
    valid_value(name) && !name.is_empty()
}

fn valid_value(v: &str) -> bool {
    if v.is_empty() {
        return true;
    }
    v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && v.starts_with(|c: char| c.is_ascii_alphanumeric())
        && v.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// Splits on commas that are not inside parentheses.
fn split_top(s: &str) -> Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err(format!("unexpected ')' in selector {s:?}"));
                }
            }
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("unbalanced parentheses in selector {s:?}"));
    }
    out.push(&s[start..]);
    Ok(out)
}

fn is_key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/')
}

fn parse_requirement(raw: &str) -> Result<Requirement, String> {
    let s = raw.trim();
    if s.is_empty() {
        return Err("found '', expected: !, identifier, or 'end of string'".into());
    }
    if let Some(rest) = s.strip_prefix('!') {
        let key = rest.trim();
        if !valid_key(key) {
            return Err(format!("invalid label key {key:?}"));
        }
        return Ok(Requirement {
            key: key.into(),
            op: Op::DoesNotExist,
        });
    }
    let key_end = s.find(|c: char| !is_key_char(c)).unwrap_or(s.len());
    let key = &s[..key_end];
    if !valid_key(key) {
        return Err(format!("invalid label key {key:?}"));
    }
    let rest = s[key_end..].trim_start();
    let value = |v: &str| -> Result<String, String> {
        let v = v.trim();
        if !valid_value(v) {
            return Err(format!("invalid label value: {v:?}"));
        }
        Ok(v.to_string())
    };
    let set = |v: &str| -> Result<Vec<String>, String> {
        let v = v.trim();
        let inner = v
            .strip_prefix('(')
            .and_then(|v| v.strip_suffix(')'))
            .ok_or_else(|| format!("found {v:?}, expected: '(' values ')'"))?;
        let mut vals = Vec::new();
        for item in inner.split(',') {
            vals.push(value(item)?);
        }
        Ok(vals)
    };
    let op = if rest.is_empty() {
        Op::Exists
    } else if let Some(v) = rest.strip_prefix("!=") {
        Op::NotEquals(value(v)?)
    } else if let Some(v) = rest.strip_prefix("==") {
        Op::Equals(value(v)?)
    } else if let Some(v) = rest.strip_prefix('=') {
        Op::Equals(value(v)?)
    } else if let Some(v) = rest.strip_prefix('>') {
        Op::Gt(v.trim().parse().map_err(|_| {
            format!("for 'gt', 'lt' operators, the value must be an integer: {v:?}")
        })?)
    } else if let Some(v) = rest.strip_prefix('<') {
        Op::Lt(v.trim().parse().map_err(|_| {
            format!("for 'gt', 'lt' operators, the value must be an integer: {v:?}")
        })?)
    } else if let Some(v) = rest
        .strip_prefix("notin")
        .filter(|v| v.trim_start().starts_with('('))
    {
        Op::NotIn(set(v)?)
    } else if let Some(v) = rest
        .strip_prefix("in")
        .filter(|v| v.trim_start().starts_with('('))
    {
        Op::In(set(v)?)
    } else {
        return Err(format!(
            "found {rest:?}, expected: in, notin, =, ==, !=, gt, lt"
        ));
    };
    Ok(Requirement {
        key: key.into(),
        op,
    })
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, String> {
        if s.trim().is_empty() {
            return Ok(Self::default());
        }
        let reqs = split_top(s)?
            .into_iter()
            .map(parse_requirement)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("unable to parse requirement: {e}"))?;
        Ok(Self { reqs })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.reqs.iter().all(|r| {
            let v = get(&r.key);
            match &r.op {
                Op::Exists => v.is_some(),
                Op::DoesNotExist => v.is_none(),
                Op::Equals(x) => v == Some(x.as_str()),
                Op::NotEquals(x) => v != Some(x.as_str()),
                Op::In(xs) => v.is_some_and(|v| xs.iter().any(|x| x == v)),
                Op::NotIn(xs) => v.is_none_or(|v| !xs.iter().any(|x| x == v)),
                Op::Gt(n) => v
                    .and_then(|v| v.parse::<i64>().ok())
                    .is_some_and(|v| v > *n),
                Op::Lt(n) => v
                    .and_then(|v| v.parse::<i64>().ok())
                    .is_some_and(|v| v < *n),
            }
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct FieldReq {
    field: String,
    value: String,
    equal: bool,
}

/// A parsed `fieldSelector`: `field=value`, `field==value`, `field!=value`,
/// comma-separated, restricted to the fields the real server indexes for
/// each resource (anything else is a 400 "field label not supported").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector {
    reqs: Vec<FieldReq>,
}

/// Fields kube-apiserver accepts in field selectors for each kind.
pub fn supported_fields(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Service => &[
            "metadata.name",
            "metadata.namespace",
            "spec.clusterIP",
            "spec.type",
        ],
        Kind::EndpointSlice => &["metadata.name", "metadata.namespace", "addressType"],
        Kind::Node => &["metadata.name", "spec.unschedulable"],
        Kind::Pod => &[
            "metadata.name",
            "metadata.namespace",
            "spec.nodeName",
            "status.phase",
        ],
    }
}

fn field_value(kind: Kind, obj: &Value, field: &str) -> String {
    let ptr = format!("/{}", field.replace('.', "/"));
    match obj.pointer(&ptr) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => n.to_string(),
        _ if kind == Kind::Node && field == "spec.unschedulable" => "false".into(),
        _ => String::new(),
    }
}

impl FieldSelector {
    pub fn parse(kind: Kind, s: &str) -> Result<Self, String> {
        if s.trim().is_empty() {
            return Ok(Self::default());
        }
        let mut reqs = Vec::new();
        for part in s.split(',') {
            let part = part.trim();
            let (field, value, equal) = if let Some((f, v)) = part.split_once("!=") {
                (f, v, false)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, v, true)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, v, true)
            } else {
                return Err(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                ));
            };
            let field = field.trim();
            if !supported_fields(kind).contains(&field) {
                return Err(format!("field label not supported: {field}"));
            }
            reqs.push(FieldReq {
                field: field.into(),
                value: value.trim().into(),
                equal,
            });
        }
        Ok(Self { reqs })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// Adds `metadata.name=<name>` (used for a watch on an object's own path).
    pub fn with_name(mut self, name: &str) -> Self {
        self.reqs.push(FieldReq {
            field: "metadata.name".into(),
            value: name.into(),
            equal: true,
        });
        self
    }

    pub fn matches(&self, kind: Kind, obj: &Value) -> bool {
        self.reqs
            .iter()
            .all(|r| (field_value(kind, obj, &r.field) == r.value) == r.equal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns", "labels": labels}})
    }

    #[test]
    fn label_selector_ops() {
        let o = obj(json!({"app": "web", "tier": "front", "n": "5"}));
        let m = |s: &str| LabelSelector::parse(s).unwrap().matches(&o);
        assert!(m(""));
        assert!(m("app=web"));
        assert!(m("app==web"));
        assert!(!m("app!=web"));
        assert!(m("missing!=x"));
        assert!(m("app in (web, api)"));
        assert!(!m("app notin (web,api)"));
        assert!(m("missing notin (web)"));
        assert!(!m("missing in (web)"));
        assert!(m("app,tier"));
        assert!(m("!missing"));
        assert!(!m("!app"));
        assert!(m("app=web,tier in (front),!missing"));
        assert!(!m("app=web,tier=back"));
        assert!(m("n>4"));
        assert!(!m("n<5"));
        assert!(m("kubernetes.io/service-name notin (x)"));
        assert!(LabelSelector::parse("app in web").is_err());
        assert!(LabelSelector::parse("app=(").is_err());
        assert!(LabelSelector::parse("=x").is_err());
    }

    /// The selectors switchboard's cluster source sends (kube-proxy's, and
    /// the looser one used with a proxy name of its own).
    #[test]
    fn kube_proxy_selectors() {
        let both = LabelSelector::parse(
            "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless",
        )
        .unwrap();
        let headless_only = LabelSelector::parse("!service.kubernetes.io/headless").unwrap();
        let plain = obj(json!({"app": "web"}));
        let other_proxy = obj(json!({"service.kubernetes.io/service-proxy-name": "other"}));
        let headless = obj(json!({"service.kubernetes.io/headless": ""}));
        assert!(both.matches(&plain));
        assert!(!both.matches(&other_proxy));
        assert!(!both.matches(&headless));
        assert!(headless_only.matches(&plain));
        assert!(headless_only.matches(&other_proxy));
        assert!(!headless_only.matches(&headless));
        assert!(both.matches(&json!({"metadata": {"name": "unlabelled"}})));
    }

    #[test]
    fn field_selector_ops() {
        let o = json!({"metadata": {"name": "a", "namespace": "ns"}, "spec": {"type": "NodePort"}});
        let m = |s: &str| {
            FieldSelector::parse(Kind::Service, s)
                .unwrap()
                .matches(Kind::Service, &o)
        };
        assert!(m("metadata.name=a"));
        assert!(m("metadata.name==a,metadata.namespace=ns"));
        assert!(!m("metadata.namespace!=ns"));
        assert!(m("spec.type=NodePort"));
        assert!(FieldSelector::parse(Kind::Service, "spec.foo=1").is_err());
        let node = json!({"metadata": {"name": "n1"}});
        assert!(FieldSelector::parse(Kind::Node, "spec.unschedulable=false")
            .unwrap()
            .matches(Kind::Node, &node));
    }
}
