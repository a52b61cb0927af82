//! Parsing manifest files: YAML or JSON documents into the Services,
//! EndpointSlices and Nodes they hold, with errors naming the file, the
//! document and the problem.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;
use serde_saphyr::Spanned;

use crate::model::{ServiceInfo, SliceInfo};
use crate::source::wire::{DocInfo, ServiceInput, SliceInput};

/// What one manifest file holds: k8s-openapi objects (what [`load_file`]
/// and [`parse_manifests`] give), or, for the directory source, the model's
/// input types decoded straight from the documents ([`Inputs`]).
#[derive(Clone, Debug, PartialEq)]
pub struct FileObjects<S = Service, E = EndpointSlice> {
    pub services: Vec<S>,
    pub endpoint_slices: Vec<E>,
    /// Nodes of any name (only the one named like this node is used).
    pub nodes: Vec<Node>,
    /// Notes about skipped objects, each naming the file and the document.
    pub notes: Vec<String>,
}

impl<S, E> Default for FileObjects<S, E> {
    fn default() -> Self {
        FileObjects {
            services: Vec::new(),
            endpoint_slices: Vec::new(),
            nodes: Vec::new(),
            notes: Vec::new(),
        }
    }
}

/// What a file's Services and EndpointSlices are decoded into. Either way
/// a field of the wrong type is an error naming the object and the field;
/// [`Inputs`] looks only at the fields the model reads.
pub trait Decoder {
    type Service;
    type Slice;
    fn service(value: Value) -> Result<Self::Service, PathError>;
    fn slice(value: Value) -> Result<Self::Slice, PathError>;

    /// One YAML document (the text of one, from [`yaml_documents`])
    /// decoded in one pass, when that gives exactly what the general path
    /// would; `None` sends it down the general path, which also names any
    /// problem.
    fn direct(_text: &str) -> Option<FileObjects<Self::Service, Self::Slice>> {
        None
    }
}

type PathError = serde_path_to_error::Error<serde_json::Error>;

/// A document's (or file's) objects as `D` decodes them, or the problem.
pub(super) type Parsed<D> =
    Result<FileObjects<<D as Decoder>::Service, <D as Decoder>::Slice>, ManifestError>;

/// Whole k8s-openapi objects (the CLI, which reads selectors and more).
pub struct K8s;

impl Decoder for K8s {
    type Service = Service;
    type Slice = EndpointSlice;
    fn service(value: Value) -> Result<Service, PathError> {
        let mut svc: Service = serde_path_to_error::deserialize(value)?;
        default_namespace(&mut svc.metadata);
        Ok(svc)
    }
    fn slice(value: Value) -> Result<EndpointSlice, PathError> {
        let mut slice: EndpointSlice = serde_path_to_error::deserialize(value)?;
        default_namespace(&mut slice.metadata);
        Ok(slice)
    }
}

/// The model's input types, decoded straight from the document
/// ([`crate::source::wire`]); a slice's shared strings are not shared yet
/// ([`SliceInfo::share`]).
pub struct Inputs;

impl Decoder for Inputs {
    type Service = ServiceInfo;
    type Slice = SliceInfo;
    fn service(value: Value) -> Result<ServiceInfo, PathError> {
        serde_path_to_error::deserialize(&value).map(|o: ServiceInput| o.0)
    }
    fn slice(value: Value) -> Result<SliceInfo, PathError> {
        serde_path_to_error::deserialize(&value).map(|o: SliceInput| o.0)
    }

    /// A Service or an EndpointSlice straight from the YAML (no tree of
    /// values: most of the time a document took): in the usual block shape
    /// by [`super::block`], else by the general parser ([`direct_saphyr`]).
    /// Either reads what it accepts as the general path does; anything else
    /// (other kinds, Lists, empty documents, any error) takes the general
    /// path, which names the problem.
    fn direct(text: &str) -> Option<FileObjects<ServiceInfo, SliceInfo>> {
        let doc = match super::block::decode::<DocInfo>(text) {
            Some(doc) => doc,
            None => direct_saphyr(text)?,
        };
        let mut out = FileObjects::default();
        match doc {
            DocInfo::Service(svc) => out.services.push(svc),
            DocInfo::Slice(slice) => out.endpoint_slices.push(slice),
            DocInfo::Other => return None,
        }
        Some(out)
    }
}

/// A document [`super::block`] does not take, through the general YAML
/// parser without a tree of values. Plain scalars that read as numbers or
/// booleans are refused as strings (`no_schema`), and only `true`/`false`
/// are booleans, so what this accepts, it reads as the general path does; a
/// key given twice is an error, as there, and a merge key (`<<`) too (the
/// general path expands it).
fn direct_saphyr(text: &str) -> Option<DocInfo> {
    let mut options = yaml_options(text.len());
    options.no_schema = true;
    options.strict_booleans = true;
    options.merge_keys = serde_saphyr::MergeKeyPolicy::Error;
    serde_saphyr::from_str_with_options::<DocInfo>(text, options).ok()
}

/// Why a manifest file was rejected. Every message names the file, and
/// (after the file could be read) the 1-based document number in it.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The file could not be read (permissions, not UTF-8, ...).
    #[error("{}: cannot read the file: {error}", .path.display())]
    Read { path: PathBuf, error: io::Error },
    /// A document is not well-formed YAML (or JSON, for `.json` files).
    #[error("{}: document {document}: syntax error: {error}", .path.display())]
    Syntax {
        path: PathBuf,
        /// 1-based.
        document: usize,
        error: SyntaxError,
    },
    /// A document (or an item of a List) is not a Kubernetes object: not a
    /// mapping, or without `apiVersion` or `kind`.
    #[error("{}: {}: {problem}", .path.display(), Location(*.document, *.item))]
    NotAnObject {
        path: PathBuf,
        document: usize,
        /// 0-based index within the (innermost) List, for List items.
        item: Option<usize>,
        problem: String,
    },
    /// A Service, EndpointSlice or Node that does not match the Kubernetes schema.
    #[error("{0}")]
    Invalid(Box<InvalidObject>),
}

/// The details of [`ManifestError::Invalid`].
#[derive(Debug, thiserror::Error)]
#[error("{}: {}: {kind} {}: {field}: {error}", .path.display(), Location(*.document, *.item), .name.as_deref().unwrap_or("(without a name)"))]
pub struct InvalidObject {
    pub path: PathBuf,
    /// 1-based.
    pub document: usize,
    /// 0-based index within the (innermost) List, for List items.
    pub item: Option<usize>,
    /// `Service`, `EndpointSlice` or `Node`.
    pub kind: String,
    pub name: Option<String>,
    /// Where in the object, e.g. `spec.ports[0].port` (`.` for the object itself).
    pub field: String,
    pub error: serde_json::Error,
}

impl ManifestError {
    /// The file at fault.
    pub fn path(&self) -> &Path {
        match self {
            ManifestError::Read { path, .. }
            | ManifestError::Syntax { path, .. }
            | ManifestError::NotAnObject { path, .. } => path,
            ManifestError::Invalid(inv) => &inv.path,
        }
    }
}

/// The parser's own error, by file format.
#[derive(Debug, thiserror::Error)]
pub enum SyntaxError {
    #[error("{0}")]
    Yaml(Box<serde_saphyr::Error>),
    #[error("{0}")]
    Json(serde_json::Error),
}

struct Location(usize, Option<usize>);

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "document {}", self.0)?;
        if let Some(item) = self.1 {
            write!(f, ", List item {item}")?;
        }
        Ok(())
    }
}

/// Reads one manifest file. `.json` files are parsed as JSON, anything else as YAML.
pub fn load_file(path: &Path) -> Result<FileObjects, ManifestError> {
    let bytes = std::fs::read(path).map_err(|error| ManifestError::Read {
        path: path.to_path_buf(),
        error,
    })?;
    parse_manifests(path, &bytes)
}

/// Is this line a document marker (`---` or `...`, alone or followed by a
/// space or tab)? Such a line always ends the document before it: no scalar
/// may contain one.
fn is_marker(line: &str, marker: &str) -> bool {
    line.strip_prefix(marker).is_some_and(|rest| {
        rest.trim_end_matches(['\r', '\n']).is_empty() || rest.starts_with([' ', '\t'])
    })
}

/// Splits the YAML documents of a manifest file's text, each from its `---`
/// marker on (text before the first marker is a document of its own), so
/// each can be parsed, and its objects kept, on its own. `None` for a
/// `.json` file, for text that is not UTF-8, and for text with directives
/// (`%`) or end markers (`...`), which belong to the documents around them:
/// such a file is parsed whole. Parsing the pieces gives what parsing the
/// whole gives, except for the document numbers in errors.
pub(super) fn yaml_documents<'t>(path: &Path, bytes: &'t [u8]) -> Option<Vec<&'t str>> {
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"))
    {
        return None;
    }
    let text = std::str::from_utf8(bytes).ok()?;
    let mut documents = Vec::new();
    let mut start = 0;
    let mut at = 0;
    while at < text.len() {
        let end = text[at..].find('\n').map_or(text.len(), |i| at + i + 1);
        // Only lines that start with `%`, `.` or `-` need a closer look.
        match text.as_bytes()[at] {
            b'%' => return None,
            b'.' if is_marker(&text[at..end], "...") => return None,
            b'-' if at > start && is_marker(&text[at..end], "---") => {
                documents.push(&text[start..at]);
                start = at;
            }
            _ => {}
        }
        at = end;
    }
    if at > start {
        documents.push(&text[start..at]);
    }
    Some(documents)
}

/// Documents per thread below which [`parse_each`] stays on its own thread.
const PER_THREAD_MIN: usize = 64;

/// [`parse_manifests`] of each of `documents` (see [`yaml_documents`]), in
/// order, spread over every core: parsing is most of the time a large
/// directory takes to read.
pub(super) fn parse_each<D: Decoder>(path: &Path, documents: &[&str]) -> Vec<Parsed<D>>
where
    D::Service: Send,
    D::Slice: Send,
{
    let parse = |chunk: &[&str]| -> Vec<Parsed<D>> {
        chunk
            .iter()
            .map(|text| parse_document::<D>(path, text))
            .collect()
    };
    crate::util::cores::chunks_on_cores(documents, PER_THREAD_MIN, parse)
}

/// One document's text (see [`yaml_documents`]): [`Decoder::direct`], else
/// [`parse_as`].
pub(super) fn parse_document<D: Decoder>(
    path: &Path,
    text: &str,
) -> Result<FileObjects<D::Service, D::Slice>, ManifestError> {
    D::direct(text).map_or_else(|| parse_as::<D>(path, text.as_bytes()), Ok)
}

/// Parses the contents of a manifest file; `path` decides the format (`.json`
/// or YAML) and names the file in errors and notes.
pub fn parse_manifests(path: &Path, bytes: &[u8]) -> Result<FileObjects, ManifestError> {
    parse_as::<K8s>(path, bytes)
}

/// [`parse_manifests`], decoding Services and EndpointSlices with `D`.
pub fn parse_as<D: Decoder>(
    path: &Path,
    bytes: &[u8],
) -> Result<FileObjects<D::Service, D::Slice>, ManifestError> {
    let text = std::str::from_utf8(bytes).map_err(|e| ManifestError::Read {
        path: path.to_path_buf(),
        error: io::Error::new(io::ErrorKind::InvalidData, format!("not UTF-8 text: {e}")),
    })?;
    let is_json = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    let out = if is_json {
        let mut out = Collector::<D>::new(path);
        let stream = serde_json::Deserializer::from_str(text).into_iter::<Value>();
        for (i, doc) in stream.enumerate() {
            let document = i + 1;
            let value = doc.map_err(|e| ManifestError::Syntax {
                path: path.to_path_buf(),
                document,
                error: SyntaxError::Json(e),
            })?;
            out.value(value, document, None)?;
        }
        out
    } else {
        parse_yaml::<D>(path, text)?
    };
    let notes = out
        .notes
        .into_iter()
        .map(|n| {
            format!(
                "{}: {}: {}",
                path.display(),
                Location(n.document, n.item),
                n.text
            )
        })
        .collect();
    Ok(FileObjects {
        services: out.services,
        endpoint_slices: out.slices,
        nodes: out.nodes,
        notes,
    })
}

fn parse_yaml<'p, D: Decoder>(
    path: &'p Path,
    text: &str,
) -> Result<Collector<'p, D>, ManifestError> {
    let mut out = Collector::new(path);
    let mut reader = text.as_bytes();
    let documents =
        serde_saphyr::read_with_options::<_, Spanned<Value>>(&mut reader, yaml_options(text.len()));
    // The parser yields documents in order: one counter reads each line once.
    let mut counter = DocumentCounter::new(text);
    for doc in documents {
        match doc {
            Ok(doc) => {
                let document = counter.at(doc.referenced.line(), doc.referenced.column());
                out.value(doc.value, document, None)?;
            }
            Err(error) => {
                let document = error
                    .location()
                    .map_or(1, |at| counter.at(at.line(), at.column()));
                return Err(ManifestError::Syntax {
                    path: path.to_path_buf(),
                    document,
                    error: SyntaxError::Yaml(Box::new(error)),
                });
            }
        }
    }
    Ok(out)
}

/// The parser's limits for a file of `len` bytes. The defaults guard a
/// configuration file; a manifest file may hold thousands of objects, so
/// the counts grow with the file (no object is smaller than a byte), while
/// the alias limits, which guard against expansion bombs, stay as they are.
pub(super) fn yaml_options(len: usize) -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_reader_input_bytes = None;
    budget.max_documents = budget.max_documents.max(len);
    budget.max_nodes = budget.max_nodes.max(len);
    budget.max_events = budget.max_events.max(len.saturating_mul(2));
    budget.max_total_scalar_bytes = budget.max_total_scalar_bytes.max(len);
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options
}

/// Which document (1-based) of `text` holds the position at `line` and
/// `column` (1-based, as the parser reports them); see [`DocumentCounter`].
#[cfg(test)]
fn document_at(text: &str, line: u64, column: u64) -> usize {
    DocumentCounter::new(text).at(line, column)
}

/// Numbers the documents of `text` at positions the parser reports, in
/// order. The parser skips empty documents, so its count of documents is
/// not the file's; the markers are counted instead. A line that starts with
/// `---` begins a document, and no scalar may contain such a line, so the
/// count is exact; after a `...` end marker, the next content begins a
/// document of its own. Each line is read once for the whole file (a file
/// of thousands of documents was read once per document before).
struct DocumentCounter<'t> {
    lines: std::iter::Peekable<std::iter::Zip<std::ops::RangeFrom<u64>, std::str::Lines<'t>>>,
    document: usize,
    open: bool,
}

impl<'t> DocumentCounter<'t> {
    fn new(text: &'t str) -> Self {
        Self {
            lines: (1u64..).zip(text.lines()).peekable(),
            document: 0,
            open: false,
        }
    }

    /// The document at `line` and `column`, for positions that do not go
    /// back (an earlier one gets the document the counter has reached).
    fn at(&mut self, line: u64, column: u64) -> usize {
        while let Some(&(number, text_line)) = self.lines.peek() {
            let (start, end) = (is_marker(text_line, "---"), is_marker(text_line, "..."));
            // The position's own line counts unless the position is at the
            // very start of a marker, which ends the document before it.
            if number > line || (number == line && column <= 1 && (start || end)) {
                break;
            }
            self.lines.next();
            if start {
                self.document += 1;
                self.open = true;
            } else if end {
                self.open = false;
            } else {
                let content = text_line.trim_start();
                let is_content =
                    !content.is_empty() && !content.starts_with('#') && !content.starts_with('%');
                if is_content && !self.open {
                    self.document += 1;
                    self.open = true;
                }
            }
        }
        self.document.max(1)
    }
}

struct Note {
    document: usize,
    item: Option<usize>,
    text: String,
}

struct Collector<'p, D: Decoder> {
    path: &'p Path,
    services: Vec<D::Service>,
    slices: Vec<D::Slice>,
    nodes: Vec<Node>,
    notes: Vec<Note>,
}

impl<'p, D: Decoder> Collector<'p, D> {
    fn new(path: &'p Path) -> Collector<'p, D> {
        Collector {
            path,
            services: Vec::new(),
            slices: Vec::new(),
            nodes: Vec::new(),
            notes: Vec::new(),
        }
    }
}

impl<D: Decoder> Collector<'_, D> {
    fn not_an_object(
        &self,
        document: usize,
        item: Option<usize>,
        problem: impl Into<String>,
    ) -> ManifestError {
        ManifestError::NotAnObject {
            path: self.path.to_path_buf(),
            document,
            item,
            problem: problem.into(),
        }
    }

    fn value(
        &mut self,
        value: Value,
        document: usize,
        item: Option<usize>,
    ) -> Result<(), ManifestError> {
        let obj = match &value {
            Value::Null => return Ok(()), // an empty document
            Value::Object(obj) => obj,
            _ => {
                return Err(self.not_an_object(
                    document,
                    item,
                    "is not a mapping (a Kubernetes object)",
                ))
            }
        };
        let Some(kind) = obj.get("kind").and_then(Value::as_str).map(str::to_owned) else {
            return Err(self.not_an_object(document, item, "has no kind"));
        };
        let Some(api_version) = obj
            .get("apiVersion")
            .and_then(Value::as_str)
            .map(str::to_owned)
        else {
            return Err(self.not_an_object(document, item, format!("{kind} has no apiVersion")));
        };
        let meta = obj.get("metadata");
        let name = meta
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        // For notes: the name as written (`ns/name`, or just `name` when the
        // object has no namespace, as cluster-scoped kinds do).
        let namespaced_name = {
            let name = name.as_deref().unwrap_or("(without a name)");
            match meta
                .and_then(|m| m.get("namespace"))
                .and_then(Value::as_str)
                .filter(|ns| !ns.is_empty())
            {
                Some(ns) => format!("{ns}/{name}"),
                None => name.to_string(),
            }
        };
        let invalid = |e: serde_path_to_error::Error<serde_json::Error>| {
            ManifestError::Invalid(Box::new(InvalidObject {
                path: self.path.to_path_buf(),
                document,
                item,
                kind: kind.clone(),
                name: name.clone(),
                field: e.path().to_string(),
                error: e.into_inner(),
            }))
        };

        match (api_version.as_str(), kind.as_str()) {
            ("v1", "Service") => {
                let svc = D::service(value).map_err(invalid)?;
                self.services.push(svc);
            }
            ("discovery.k8s.io/v1", "EndpointSlice") => {
                let slice = D::slice(value).map_err(invalid)?;
                self.slices.push(slice);
            }
            ("v1", "Node") => {
                let mut node: Node = serde_path_to_error::deserialize(value).map_err(invalid)?;
                node.metadata.namespace = None; // cluster-scoped
                self.nodes.push(node);
            }
            (_, list_kind) if list_kind.ends_with("List") && obj.contains_key("items") => {
                // `kind: List` holds complete objects; typed lists (ServiceList, as
                // the API returns them) may leave kind and apiVersion out of items.
                let item_kind = list_kind.strip_suffix("List").unwrap_or_default().to_owned();
                let Value::Object(mut obj) = value else {
                    return Ok(()); // unreachable: checked above
                };
                let items = match obj.remove("items") {
                    Some(Value::Array(items)) => items,
                    Some(Value::Null) | None => Vec::new(),
                    Some(_) => {
                        return Err(self.not_an_object(document, item, format!("{list_kind} items is not a sequence")));
                    }
                };
                for (i, mut it) in items.into_iter().enumerate() {
                    if let (Value::Object(io), false) = (&mut it, item_kind.is_empty()) {
                        io.entry("kind").or_insert_with(|| Value::String(item_kind.clone()));
                        io.entry("apiVersion")
                            .or_insert_with(|| Value::String(api_version.clone()));
                    }
                    self.value(it, document, Some(i))?;
                }
            }
            (_, "Service" | "EndpointSlice" | "Node") => {
                let want = if kind == "EndpointSlice" { "discovery.k8s.io/v1" } else { "v1" };
                self.note(
                    document,
                    item,
                    format!("skipped {kind} {namespaced_name}: apiVersion {api_version} is not supported (use {want})"),
                );
            }
            ("v1", "Endpoints") => self.note(
                document,
                item,
                format!(
                    "skipped Endpoints {namespaced_name}: switchboard reads EndpointSlices (discovery.k8s.io/v1), not Endpoints"
                ),
            ),
            _ => self.note(
                document,
                item,
                format!("skipped {kind} {namespaced_name} (only Services, EndpointSlices and Nodes are read)"),
            ),
        }
        Ok(())
    }

    fn note(&mut self, document: usize, item: Option<usize>, text: String) {
        self.notes.push(Note {
            document,
            item,
            text,
        });
    }
}

fn default_namespace(meta: &mut ObjectMeta) {
    if meta.namespace.as_deref().is_none_or(str::is_empty) {
        meta.namespace = Some("default".to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_documents_split_at_start_markers() {
        let yaml = Path::new("a.yaml");
        let text =
            "# lead\nkind: A\n---\nkind: B\n--- {kind: C}\n---\r\nkind: D\n  ---not a marker\n";
        assert_eq!(
            yaml_documents(yaml, text.as_bytes()),
            Some(vec![
                "# lead\nkind: A\n",
                "---\nkind: B\n",
                "--- {kind: C}\n",
                "---\r\nkind: D\n  ---not a marker\n"
            ])
        );
        assert_eq!(
            yaml_documents(yaml, b"---\nkind: A\n"),
            Some(vec!["---\nkind: A\n"])
        );
        assert_eq!(yaml_documents(yaml, b""), Some(vec![]));
        // Read whole: directives and end markers, JSON, not UTF-8.
        assert_eq!(yaml_documents(yaml, b"%YAML 1.2\n---\nkind: A\n"), None);
        assert_eq!(yaml_documents(yaml, b"kind: A\n...\nkind: B\n"), None);
        assert_eq!(yaml_documents(Path::new("a.json"), b"{}"), None);
        assert_eq!(yaml_documents(yaml, b"kind: \xff\n"), None);
    }

    /// A document read in one pass gives what the general path gives;
    /// what one pass would read differently (a plain scalar that is a
    /// number or a boolean where a string goes, `yes` for a boolean) takes
    /// the general path, errors and all.
    #[test]
    fn one_pass_reads_what_the_general_path_reads() {
        let path = Path::new("a.yaml");
        let svc = |meta: &str, spec: &str| {
            format!("---\napiVersion: v1\nkind: Service\nmetadata: {meta}\nspec: {spec}\n")
        };
        let slice = |endpoints: &str| {
            format!("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: s, namespace: shop}}\naddressType: IPv4\nendpoints: {endpoints}\nports: [{{name: http, port: 80}}]\n")
        };
        let one_pass = [
            svc(
                "{name: web}",
                "{clusterIP: 10.96.0.10, ports: [{port: 80, name: http}]}",
            ),
            svc(
                "{name: web, namespace: '', labels: {a: b}}",
                "{type: NodePort, ports: [{port: 80, nodePort: 30080}]}",
            ),
            slice("[{addresses: [10.0.0.1], conditions: {ready: true}, nodeName: n1}]"),
            slice("[]"),
        ];
        for doc in &one_pass {
            let direct = Inputs::direct(doc).expect("one pass");
            let general = parse_as::<Inputs>(path, doc.as_bytes()).expect("general");
            assert_eq!(direct, general, "{doc}");
        }
        let general_only = [
            svc("{name: 0123}", "{}"),
            svc("{name: web}", "{ports: [{port: 80, name: 8080}]}"),
            svc("{name: web}", "{ports: [{port: '80'}]}"),
            svc("{name: web}", "{clusterIP: null, sessionAffinity: true}"),
            slice("[{addresses: [10.0.0.1], conditions: {ready: yes}}]"),
            svc("{name: web, labels: {a: b, a: c}}", "{}"),
            svc("{name: web, name: web2}", "{}"),
            svc(
                "{name: web}",
                "{<<: {clusterIP: 10.96.0.10}, ports: [{port: 80}]}",
            ),
            "apiVersion: v1\nkind: List\nitems: []\n".to_string(),
            "# nothing\n".to_string(),
        ];
        for doc in &general_only {
            assert!(Inputs::direct(doc).is_none(), "{doc}");
            let general = parse_as::<Inputs>(path, doc.as_bytes()).map_err(|e| e.to_string());
            let document = parse_document::<Inputs>(path, doc).map_err(|e| e.to_string());
            assert_eq!(document, general, "{doc}");
        }
        let err =
            parse_document::<Inputs>(path, &general_only[1]).expect_err("a number for a name");
        assert!(
            err.to_string()
                .contains("Service web: spec.ports[0].name: invalid type: integer"),
            "{err}"
        );
    }

    /// How long a file of the benchmark's shape takes to decode, per
    /// object: in one pass on every core (what the directory source does),
    /// in one pass on one core, and through the tree of values on one core
    /// (`cargo test --release -p proxy-user --lib decode_time -- --ignored --nocapture`).
    #[test]
    #[ignore = "a timing, not a test"]
    fn decode_time() {
        let path = Path::new("bench.yaml");
        let text = crate::source::dir::test_support::bench_yaml(0..2000);
        let documents = yaml_documents(path, text.as_bytes()).expect("split");
        assert!(
            documents.iter().all(|d| Inputs::direct(d).is_some()),
            "each in one pass"
        );
        let per = |n: usize, t: std::time::Instant| t.elapsed() / n as u32;
        for round in 0..3 {
            let t = std::time::Instant::now();
            let results = parse_each::<Inputs>(path, &documents);
            let every_core = per(documents.len(), t);
            assert!(results.iter().all(Result::is_ok));
            let some = &documents[..400];
            let t = std::time::Instant::now();
            for doc in some {
                parse_document::<Inputs>(path, doc).expect("parses");
            }
            let one_pass = per(some.len(), t);
            let t = std::time::Instant::now();
            for doc in some {
                parse_as::<Inputs>(path, doc.as_bytes()).expect("parses");
            }
            let values = per(some.len(), t);
            eprintln!("round {round}: {every_core:?} per object on every core; on one core {one_pass:?} in one pass, {values:?} through values");
        }
    }

    /// Spread over threads, the results come back in the documents' order,
    /// errors included.
    #[test]
    fn parse_each_keeps_the_documents_order() {
        let path = Path::new("a.yaml");
        let texts: Vec<String> = (0..4 * PER_THREAD_MIN)
            .map(|i| match i {
                100 => "kind: [\n".to_string(),
                _ => format!("---\napiVersion: v1\nkind: Service\nmetadata: {{name: s{i}}}\n"),
            })
            .collect();
        let documents: Vec<&str> = texts.iter().map(String::as_str).collect();
        let results = parse_each::<K8s>(path, &documents);
        assert_eq!(results.len(), documents.len());
        for (i, result) in results.iter().enumerate() {
            match result {
                Ok(objects) => assert_eq!(
                    objects.services[0].metadata.name.as_deref(),
                    Some(format!("s{i}").as_str())
                ),
                Err(_) => assert_eq!(i, 100, "only document 100 is broken"),
            }
        }
        assert!(results[100].is_err());
    }

    /// The pieces parse to what the whole parses to.
    #[test]
    fn yaml_documents_parse_as_the_whole_file_does() {
        let path = Path::new("a.yaml");
        let text = "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {clusterIP: 10.96.0.1}\n---\n---\napiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata: {name: b}\n- apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: c}\n--- # comment\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: d}\naddressType: IPv4\nendpoints: []\n";
        let whole = parse_manifests(path, text.as_bytes()).expect("whole");
        let mut pieces = FileObjects::default();
        for doc in yaml_documents(path, text.as_bytes()).expect("split") {
            let objects = parse_manifests(path, doc.as_bytes()).expect("piece");
            pieces.services.extend(objects.services);
            pieces.endpoint_slices.extend(objects.endpoint_slices);
            pieces.nodes.extend(objects.nodes);
        }
        assert_eq!(pieces.services, whole.services);
        assert_eq!(pieces.endpoint_slices, whole.endpoint_slices);
        assert_eq!(whole.services.len(), 2);
        assert_eq!(whole.endpoint_slices.len(), 1);
    }
    use crate::source::dir::test_support::{node_b, NODE_A, SERVICE, SLICE};

    fn parse(name: &str, text: &str) -> Result<FileObjects, ManifestError> {
        parse_manifests(Path::new(name), text.as_bytes())
    }

    fn names<T: k8s_openapi::Metadata<Ty = ObjectMeta>>(objs: &[T]) -> Vec<String> {
        objs.iter()
            .map(|o| {
                let m = o.metadata();
                format!(
                    "{}/{}",
                    m.namespace.as_deref().unwrap_or("?"),
                    m.name.as_deref().unwrap_or("?")
                )
            })
            .collect()
    }

    #[test]
    fn multi_document_file_with_empty_documents() {
        let text = format!(
            "# leading comment\n---\n{SERVICE}---\n---\n# only a comment\n---\n{SLICE}---\n"
        );
        let FileObjects {
            services,
            endpoint_slices: slices,
            notes,
            ..
        } = parse("a.yaml", &text).expect("parses");
        assert_eq!(
            names(&services),
            ["default/web"],
            "namespace defaults to default"
        );
        assert_eq!(names(&slices), ["shop/web-1"]);
        assert!(notes.is_empty(), "{notes:?}");
        let spec = services[0].spec.as_ref().expect("spec");
        assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.0.10"));
    }

    #[test]
    fn empty_file_is_fine() {
        let FileObjects {
            services,
            endpoint_slices: slices,
            notes,
            ..
        } = parse("empty.yaml", "").expect("parses");
        assert!(services.is_empty() && slices.is_empty() && notes.is_empty());
        let FileObjects { services, .. } =
            parse("comments.yaml", "# nothing here\n").expect("parses");
        assert!(services.is_empty());
    }

    #[test]
    fn kubectl_list_is_expanded_and_feeds_the_model() {
        let text = include_str!("../../../tests/fixtures/manifests/kubectl-get-list.yaml");
        let FileObjects {
            services,
            endpoint_slices: slices,
            notes,
            ..
        } = parse("list.yaml", text).expect("parses");
        assert_eq!(names(&services), ["shop/web"]);
        assert_eq!(names(&slices), ["shop/web-x7k2p"]);
        assert_eq!(
            notes,
            ["list.yaml: document 1, List item 2: skipped ConfigMap shop/web-config (only Services, EndpointSlices and Nodes are read)"]
        );
        let (state, warnings) = crate::model::build(&services, &slices);
        assert!(warnings.is_empty(), "{warnings:?}");
        let lines: Vec<String> = state.frontends.values().map(ToString::to_string).collect();
        assert_eq!(
            lines,
            [
                "10.96.0.10:7/UDP ClusterIP shop/web:echo -> 10.244.1.2:7007",
                "10.96.0.10:80/TCP ClusterIP shop/web:http -> 10.244.1.2:8080",
            ]
        );
    }

    #[test]
    fn typed_list_items_get_kind_and_api_version() {
        let text = r#"
apiVersion: v1
kind: ServiceList
items:
- metadata: {name: a, namespace: x}
  spec: {clusterIP: 10.96.0.1}
- metadata: {name: b}
  spec: {clusterIP: 10.96.0.2}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSliceList
items:
- metadata: {name: a-1, namespace: x, labels: {kubernetes.io/service-name: a}}
  addressType: IPv4
  endpoints: null
---
apiVersion: v1
kind: List
items: []
"#;
        let FileObjects {
            services,
            endpoint_slices: slices,
            notes,
            ..
        } = parse("typed.yaml", text).expect("parses");
        assert_eq!(names(&services), ["x/a", "default/b"]);
        assert_eq!(names(&slices), ["x/a-1"]);
        assert!(slices[0].endpoints.is_empty());
        assert!(notes.is_empty(), "{notes:?}");
    }

    #[test]
    fn other_kinds_are_skipped_with_a_note() {
        let text = r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: settings}
data: {a: b}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shop}
spec: {}
---
apiVersion: v1
kind: Endpoints
metadata: {name: web}
---
apiVersion: discovery.k8s.io/v1beta1
kind: EndpointSlice
metadata: {name: old}
addressType: IPv4
endpoints: []
---
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: Secret, metadata: {name: s}}
"#;
        let FileObjects {
            services,
            endpoint_slices: slices,
            notes,
            ..
        } = parse("mixed.yaml", text).expect("parses");
        assert!(services.is_empty() && slices.is_empty());
        assert_eq!(
            notes,
            [
                "mixed.yaml: document 1: skipped ConfigMap settings (only Services, EndpointSlices and Nodes are read)",
                "mixed.yaml: document 2: skipped Deployment shop/web (only Services, EndpointSlices and Nodes are read)",
                "mixed.yaml: document 3: skipped Endpoints web: switchboard reads EndpointSlices (discovery.k8s.io/v1), not Endpoints",
                "mixed.yaml: document 4: skipped EndpointSlice old: apiVersion discovery.k8s.io/v1beta1 is not supported (use discovery.k8s.io/v1)",
                "mixed.yaml: document 5, List item 0: skipped Secret s (only Services, EndpointSlices and Nodes are read)",
            ]
        );
    }

    #[test]
    fn json_files() {
        let text = r#"{"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
             "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 80}]}}]}
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web2"}}"#;
        let FileObjects { services, .. } = parse("objs.json", text).expect("parses");
        assert_eq!(names(&services), ["default/web", "default/web2"]);

        let err = parse("bad.json", "{\"kind\": ").expect_err("truncated JSON");
        assert!(
            matches!(
                err,
                ManifestError::Syntax {
                    document: 1,
                    error: SyntaxError::Json(_),
                    ..
                }
            ),
            "{err:?}"
        );
    }

    /// One counter walked forward through a file numbers every position as
    /// a counter made for that position alone does.
    #[test]
    fn one_counter_numbers_positions_in_order_as_fresh_ones_do() {
        let text = "a: 1\n---\n---\nb: 2\n...\nc: 3\n--- {d: 4}\n# note\n---\ne: 5\n";
        let mut counter = DocumentCounter::new(text);
        for line in 1..=11u64 {
            for column in [1u64, 3] {
                assert_eq!(
                    counter.at(line, column),
                    document_at(text, line, column),
                    "line {line} column {column}"
                );
            }
        }
    }

    #[test]
    fn positions_map_to_documents_as_the_file_counts_them() {
        let text = "a: 1\n---\n---\nb: 2\n...\nc: 3\n--- {d: 4}\n";
        // (line, column) → document
        let cases = [
            (1, 1, 1),
            (2, 1, 1), // at the start of a marker: still the document before
            (2, 4, 2), // after it
            (4, 1, 3),
            (5, 1, 3),
            (6, 1, 4), // content after `...` begins a document of its own
            (7, 5, 5), // a node on its marker's line
        ];
        for (line, column, want) in cases {
            assert_eq!(
                document_at(text, line, column),
                want,
                "line {line} column {column}"
            );
        }
        assert_eq!(
            document_at("%YAML 1.2\n---\na: 1\n", 3, 1),
            1,
            "a directive is no content"
        );
        assert_eq!(document_at("# a comment\n\na: 1\n", 3, 1), 1);
        assert_eq!(document_at("----\na: 1\n", 2, 1), 1, "---- is not a marker");
    }

    #[test]
    fn malformed_files_name_the_file_and_the_problem() {
        // YAML syntax error in the second document.
        let err = parse(
            "dir/broken.yaml",
            &format!("{SERVICE}---\nkind: Service\n  bad: [indent\n"),
        )
        .expect_err("syntax");
        assert!(
            matches!(
                err,
                ManifestError::Syntax {
                    document: 2,
                    error: SyntaxError::Yaml(_),
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(err.path(), Path::new("dir/broken.yaml"));
        let msg = err.to_string();
        assert!(
            msg.starts_with("dir/broken.yaml: document 2: syntax error: "),
            "{msg}"
        );
        // The parser's message says where: the line of the bad indent.
        assert!(msg.contains("line 7"), "{msg}");

        // Empty documents count: the file's fourth document is the one at fault.
        let err = parse(
            "gaps.yaml",
            &format!("{SERVICE}---\n---\n# nothing\n---\nkind: [\n"),
        )
        .expect_err("syntax");
        assert!(
            err.to_string()
                .starts_with("gaps.yaml: document 4: syntax error: "),
            "{err}"
        );

        // A Service that does not match the schema: names kind and name.
        let err = parse(
            "bad-svc.yaml",
            "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {ports: [{port: eighty}]}\n",
        )
        .expect_err("schema");
        match &err {
            ManifestError::Invalid(inv) => {
                assert_eq!(
                    (
                        inv.document,
                        inv.item,
                        inv.kind.as_str(),
                        inv.name.as_deref(),
                        inv.field.as_str()
                    ),
                    (1, None, "Service", Some("web"), "spec.ports[0].port")
                );
            }
            other => panic!("wrong error {other:?}"),
        }
        assert_eq!(
            err.to_string(),
            "bad-svc.yaml: document 1: Service web: spec.ports[0].port: invalid type: string \"eighty\", expected i32"
        );

        // Inside a List: the item is named.
        let err = parse(
            "bad-list.yaml",
            "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: discovery.k8s.io/v1, kind: EndpointSlice, metadata: {name: s}, addressType: IPv4, endpoints: [{addresses: 5}]}\n",
        )
        .expect_err("schema in list");
        assert!(
            err.to_string().starts_with(
                "bad-list.yaml: document 1, List item 0: EndpointSlice s: endpoints[0].addresses: "
            ),
            "{err}"
        );

        // Not Kubernetes objects at all.
        let err = parse("scalar.yaml", "just a string\n").expect_err("scalar");
        assert_eq!(
            err.to_string(),
            "scalar.yaml: document 1: is not a mapping (a Kubernetes object)"
        );
        let err =
            parse("nokind.yaml", "apiVersion: v1\nmetadata: {name: x}\n").expect_err("no kind");
        assert_eq!(err.to_string(), "nokind.yaml: document 1: has no kind");
        let err =
            parse("noapi.yaml", "kind: Service\nmetadata: {name: x}\n").expect_err("no apiVersion");
        assert_eq!(
            err.to_string(),
            "noapi.yaml: document 1: Service has no apiVersion"
        );

        // Not UTF-8, and a file that is not there.
        let err = parse_manifests(Path::new("bin.yaml"), b"\xff\xfe").expect_err("not utf-8");
        assert!(
            matches!(err, ManifestError::Read { .. })
                && err
                    .to_string()
                    .starts_with("bin.yaml: cannot read the file: ")
        );
        let err = load_file(Path::new("/nonexistent/switchboard/x.yaml")).expect_err("missing");
        assert!(
            err.to_string()
                .starts_with("/nonexistent/switchboard/x.yaml: cannot read the file: "),
            "{err}"
        );
    }

    #[test]
    fn nodes_are_read_cluster_scoped() {
        let text = format!(
            "{NODE_A}---\n{}",
            node_b().replace("name: node-b", "name: node-b\n  namespace: shop")
        );
        let FileObjects { nodes, notes, .. } = parse("nodes.yaml", &text).expect("parses");
        let names: Vec<_> = nodes
            .iter()
            .map(|n| (n.metadata.name.as_deref(), n.metadata.namespace.as_deref()))
            .collect();
        assert_eq!(names, [(Some("node-a"), None), (Some("node-b"), None)]);
        assert!(notes.is_empty(), "{notes:?}");

        let text = "apiVersion: v1\nkind: NodeList\nitems:\n- metadata: {name: n1}\n";
        let FileObjects { nodes, .. } = parse("nodelist.yaml", text).expect("parses");
        assert_eq!(nodes.len(), 1);

        let FileObjects { nodes, notes, .. } = parse(
            "old.yaml",
            "apiVersion: v2\nkind: Node\nmetadata: {name: n1}\n",
        )
        .expect("parses");
        assert!(nodes.is_empty());
        assert_eq!(
            notes,
            ["old.yaml: document 1: skipped Node n1: apiVersion v2 is not supported (use v1)"]
        );
    }

    #[test]
    fn malformed_node_names_the_file_and_field() {
        let err = parse(
            "node.yaml",
            "apiVersion: v1\nkind: Node\nmetadata: {name: node-a}\nstatus: {addresses: [{type: InternalIP, address: [10]}]}\n",
        )
        .expect_err("schema");
        match &err {
            ManifestError::Invalid(inv) => assert_eq!(
                (
                    inv.document,
                    inv.kind.as_str(),
                    inv.name.as_deref(),
                    inv.field.as_str()
                ),
                (1, "Node", Some("node-a"), "status.addresses[0].address")
            ),
            other => panic!("wrong error {other:?}"),
        }
        assert!(
            err.to_string()
                .starts_with("node.yaml: document 1: Node node-a: status.addresses[0].address: invalid type: sequence"),
            "{err}"
        );
    }
}
