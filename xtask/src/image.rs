//! `cargo xtask image`: a container image of `switchboard` as an OCI image
//! layout (`oci-layout`, `index.json`, `blobs/sha256/…`), built without a
//! container engine. Push it with `skopeo copy oci:DIR:TAG docker://…`.
//!
//! The image has one layer: the release binary at `/usr/local/bin/switchboard`,
//! the shared libraries `ldd` lists for it (the dynamic loader included) at
//! their paths, and a static busybox (`/bin/sh`, `mount`, `grep`, …) for the
//! DaemonSet's init step that mounts bpffs on the host. Files carry uid 0 and
//! mtime 0, so the same inputs give the same digests.

use std::{
    collections::BTreeMap,
    fs,
    io::Write as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};

use crate::util::{is_root, run_capture, run_inherit, target_dir, which};

pub const MEDIA_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const MEDIA_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const MEDIA_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const MEDIA_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// The annotation in `index.json` that names a manifest by tag (what
/// `skopeo copy oci:DIR:TAG` looks up).
pub const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";
/// The annotation containerd's image import names the image by.
pub const ANNOTATION_CONTAINERD_NAME: &str = "io.containerd.image.name";

/// Where the binary lives in the image (the DaemonSet's `command`).
pub const BINARY_PATH: &str = "usr/local/bin/switchboard";
/// busybox applets linked in `/bin`: the shell and what the init step runs,
/// plus a few for looking around with `kubectl exec`.
const BUSYBOX_APPLETS: &[&str] = &[
    "sh",
    "mount",
    "umount",
    "grep",
    "cat",
    "ls",
    "mkdir",
    "stat",
    "mountpoint",
];
/// The Debian package with a statically linked busybox at /bin/busybox.
const BUSYBOX_PACKAGE: &str = "busybox-static";

/// An image name and tag, e.g. `switchboard:0.1.0`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRef {
    pub name: String,
    pub tag: String,
}

impl ImageRef {
    /// Parses `NAME:TAG` (a registry host with a port is fine: the tag
    /// follows the last `/`).
    pub fn parse(s: &str) -> Result<Self> {
        let last_slash = s.rfind('/').map_or(0, |i| i + 1);
        let Some(colon) = s[last_slash..].rfind(':').map(|i| i + last_slash) else {
            bail!("image reference {s:?} has no tag (want NAME:TAG)");
        };
        let (name, tag) = (&s[..colon], &s[colon + 1..]);
        let tag_ok = !tag.is_empty()
            && tag.len() <= 128
            && tag
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
            && !tag.starts_with(['.', '-']);
        if name.is_empty() || !tag_ok || name.contains('@') {
            bail!("image reference {s:?} is not NAME:TAG");
        }
        Ok(Self {
            name: name.to_owned(),
            tag: tag.to_owned(),
        })
    }

    /// The fully qualified name containerd and the kubelet use for it
    /// (`switchboard:0.1.0` → `docker.io/library/switchboard:0.1.0`).
    pub fn normalized(&self) -> String {
        let first = self.name.split('/').next().unwrap_or_default();
        let has_host = self.name.contains('/')
            && (first.contains('.') || first.contains(':') || first == "localhost");
        let name = if has_host {
            self.name.clone()
        } else if self.name.contains('/') {
            format!("docker.io/{}", self.name)
        } else {
            format!("docker.io/library/{}", self.name)
        };
        format!("{name}:{}", self.tag)
    }
}

impl std::fmt::Display for ImageRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.name, self.tag)
    }
}

/// What goes into an image.
#[derive(Clone, Debug)]
pub struct Inputs {
    /// The `switchboard` binary.
    pub binary: PathBuf,
    /// A busybox for the init step's shell (`None`: an image without a shell;
    /// the DaemonSet's init container then cannot run).
    pub busybox: Option<PathBuf>,
    /// Image name and tag (`None`: `switchboard:<version of the binary>`).
    pub reference: Option<ImageRef>,
    /// `org.opencontainers.image.source` label (`None`: the git remote
    /// `origin`, if there is one).
    pub source: Option<String>,
}

/// What was built.
#[derive(Clone, Debug)]
pub struct Built {
    pub layout: PathBuf,
    pub reference: ImageRef,
    /// `sha256:…` of the image manifest.
    pub manifest_digest: String,
    /// The binary's version (`switchboard --version`, without the name).
    pub version: String,
}

/// `cargo xtask image`: release build, busybox, then the layout.
pub fn run(out: Option<PathBuf>, tag: Option<String>) -> Result<()> {
    let bins = crate::build::run()?;
    let busybox = ensure_busybox()?;
    let out = out.unwrap_or_else(default_out);
    let built = build_layout(
        &Inputs {
            binary: bins.switchboard,
            busybox: Some(busybox),
            reference: tag.as_deref().map(ImageRef::parse).transpose()?,
            source: None,
        },
        &out,
    )?;
    println!(
        "image: {} ({}) in OCI layout {}",
        built.reference,
        built.manifest_digest,
        built.layout.display()
    );
    println!(
        "image: push with `skopeo copy oci:{}:{} docker://REGISTRY/{}:{}`",
        built.layout.display(),
        built.reference.tag,
        built.reference.name,
        built.reference.tag
    );
    Ok(())
}

/// `target/oci/switchboard`.
pub fn default_out() -> PathBuf {
    target_dir().join("oci").join("switchboard")
}

/// A static busybox, installing Debian's `busybox-static` when there is none
/// (as root; otherwise says what to install).
pub fn ensure_busybox() -> Result<PathBuf> {
    if let Some(path) = which("busybox") {
        println!("image: busybox present ({})", path.display());
        return Ok(path);
    }
    if !is_root() {
        bail!("image: busybox missing: run as root, or `apt-get install {BUSYBOX_PACKAGE}`");
    }
    println!("image: installing {BUSYBOX_PACKAGE}");
    let install = || {
        run_inherit(
            Command::new("apt-get")
                .args([
                    "install",
                    "-y",
                    "-q",
                    "--no-install-recommends",
                    BUSYBOX_PACKAGE,
                ])
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )
    };
    if install().is_err() {
        // Stale package lists: refresh once and try again.
        run_inherit(
            Command::new("apt-get")
                .args(["update", "-q"])
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )?;
        install()?;
    }
    which("busybox").context("image: busybox still missing after installing busybox-static")
}

/// The shared libraries a dynamically linked ELF file loads, dynamic loader
/// included, as `ldd` resolves them on this machine (none for a static one).
pub fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .context("running ldd (package libc-bin)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || text.contains("not a dynamic executable") {
        let stderr = String::from_utf8_lossy(&out.stderr);
        if stderr.contains("not a dynamic executable") || text.contains("not a dynamic executable")
        {
            return Ok(Vec::new());
        }
        bail!("ldd {} failed: {}", binary.display(), stderr.trim());
    }
    parse_ldd(&text)
}

/// Parses `ldd` output: `name => /path (0x…)` and `/path (0x…)` lines; the
/// vDSO (no file) and `statically linked` are skipped.
pub fn parse_ldd(text: &str) -> Result<Vec<PathBuf>> {
    let mut libs = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.contains("statically linked")
            || line.starts_with("linux-vdso")
            || line.starts_with("linux-gate")
        {
            continue;
        }
        let path = match line.split_once("=>") {
            Some((name, rest)) => {
                let path = rest.split_whitespace().next().unwrap_or_default();
                if path == "not" {
                    bail!("ldd: {} not found", name.trim());
                }
                path
            }
            None => line.split_whitespace().next().unwrap_or_default(),
        };
        if !path.starts_with('/') {
            bail!("ldd: cannot read line {line:?}");
        }
        libs.push(PathBuf::from(path));
    }
    Ok(libs)
}

/// `switchboard 0.1.0` → `0.1.0`.
fn binary_version(binary: &Path) -> Result<String> {
    let out = run_capture(Command::new(binary).arg("--version"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text.split_whitespace().nth(1).with_context(|| {
        format!(
            "unexpected `{} --version` output {text:?}",
            binary.display()
        )
    })?;
    Ok(version.to_owned())
}

/// One entry of the layer, by its path inside the image (no leading `/`).
enum Entry {
    Dir { mode: u32 },
    File { data: Vec<u8>, mode: u32 },
    Symlink { target: String },
}

/// The layer's entries, by path; parents are added as directories.
#[derive(Default)]
struct Tree(BTreeMap<String, Entry>);

impl Tree {
    fn add(&mut self, path: &str, entry: Entry) -> Result<()> {
        let path = path.trim_start_matches('/').trim_end_matches('/');
        if path.is_empty()
            || path
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == "..")
        {
            bail!("image: bad path {path:?} in the layer");
        }
        let components: Vec<&str> = path.split('/').collect();
        let mut parent = String::new();
        for component in &components[..components.len() - 1] {
            if !parent.is_empty() {
                parent.push('/');
            }
            parent.push_str(component);
            match self.0.get(&parent) {
                None => {
                    self.0.insert(parent.clone(), Entry::Dir { mode: 0o755 });
                }
                Some(Entry::Dir { .. }) => {}
                Some(_) => bail!("image: {parent} is a file and a directory"),
            }
        }
        self.0.insert(path.to_owned(), entry);
        Ok(())
    }

    fn add_file(&mut self, path: &str, source: &Path, mode: u32) -> Result<()> {
        // fs::read follows symlinks: the layer holds the file itself.
        let data = fs::read(source).with_context(|| format!("reading {}", source.display()))?;
        self.add(path, Entry::File { data, mode })
    }

    /// The uncompressed tar of the tree, parents before children.
    fn tar(&self) -> Result<Vec<u8>> {
        let mut builder = tar::Builder::new(Vec::new());
        builder.mode(tar::HeaderMode::Deterministic);
        for (path, entry) in &self.0 {
            let mut header = tar::Header::new_ustar();
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(0);
            match entry {
                Entry::Dir { mode } => {
                    header.set_entry_type(tar::EntryType::Directory);
                    header.set_mode(*mode);
                    header.set_size(0);
                    builder.append_data(&mut header, format!("{path}/"), std::io::empty())?;
                }
                Entry::File { data, mode } => {
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_mode(*mode);
                    header.set_size(data.len() as u64);
                    builder.append_data(&mut header, path, data.as_slice())?;
                }
                Entry::Symlink { target } => {
                    header.set_entry_type(tar::EntryType::Symlink);
                    header.set_mode(0o777);
                    header.set_size(0);
                    builder.append_link(&mut header, path, target)?;
                }
            }
        }
        Ok(builder.into_inner()?)
    }
}

pub fn sha256_hex(data: &[u8]) -> String {
    let digest = Sha256::digest(data);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes `data` as a blob; returns its descriptor fields (digest, size).
fn write_blob(layout: &Path, data: &[u8]) -> Result<(String, u64)> {
    let hex = sha256_hex(data);
    let path = layout.join("blobs/sha256").join(&hex);
    fs::write(&path, data).with_context(|| format!("writing {}", path.display()))?;
    Ok((format!("sha256:{hex}"), data.len() as u64))
}

/// The OCI name of this machine's architecture.
fn oci_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "arm" => "arm",
        "riscv64" => "riscv64",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        other => other,
    }
}

/// `git rev-parse HEAD` (with `-dirty` for a changed tree), if in a repository.
fn git_revision() -> Option<String> {
    let root = crate::util::repo_root();
    let head = Command::new("git")
        .current_dir(&root)
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()?;
    if !head.status.success() {
        return None;
    }
    let mut revision = String::from_utf8_lossy(&head.stdout).trim().to_owned();
    let dirty = Command::new("git")
        .current_dir(&root)
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .ok()
        .is_some_and(|o| !o.stdout.is_empty());
    if dirty {
        revision.push_str("-dirty");
    }
    Some(revision)
}

fn git_origin() -> Option<String> {
    let out = Command::new("git")
        .current_dir(crate::util::repo_root())
        .args(["remote", "get-url", "origin"])
        .output()
        .ok()?;
    let url = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (out.status.success() && !url.is_empty()).then_some(url)
}

/// Builds the OCI image layout in `out` from `inputs`. `out` must be absent,
/// empty, or an earlier layout (which is replaced).
pub fn build_layout(inputs: &Inputs, out: &Path) -> Result<Built> {
    let version = binary_version(&inputs.binary)?;
    let reference = match &inputs.reference {
        Some(r) => r.clone(),
        None => ImageRef {
            name: "switchboard".to_owned(),
            tag: version.clone(),
        },
    };

    // The layer.
    let mut tree = Tree::default();
    tree.add_file(BINARY_PATH, &inputs.binary, 0o755)?;
    let mut elf_files = vec![inputs.binary.clone()];
    if let Some(busybox) = &inputs.busybox {
        tree.add_file("bin/busybox", busybox, 0o755)?;
        for applet in BUSYBOX_APPLETS {
            tree.add(
                &format!("bin/{applet}"),
                Entry::Symlink {
                    target: "busybox".to_owned(),
                },
            )?;
        }
        elf_files.push(busybox.clone());
    }
    for elf in &elf_files {
        for lib in shared_libraries(elf)? {
            let path = lib.to_string_lossy().into_owned();
            if !tree.0.contains_key(path.trim_start_matches('/')) {
                tree.add_file(&path, &lib, 0o755)?;
            }
        }
    }
    for dir in ["etc", "tmp", "run", "proc", "sys", "dev", "var"] {
        let mode = if dir == "tmp" { 0o1777 } else { 0o755 };
        tree.add(dir, Entry::Dir { mode })?;
    }
    let tar = tree.tar()?;
    let diff_id = format!("sha256:{}", sha256_hex(&tar));
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&tar)?;
    let layer = gz.finish()?;

    prepare_out(out)?;
    fs::create_dir_all(out.join("blobs/sha256"))
        .with_context(|| format!("creating {}", out.display()))?;
    let (layer_digest, layer_size) = write_blob(out, &layer)?;

    let mut labels = serde_json::Map::new();
    labels.insert(
        "org.opencontainers.image.title".into(),
        json!("switchboard"),
    );
    labels.insert(
        "org.opencontainers.image.description".into(),
        json!("eBPF Service load balancer (kube-proxy replacement)"),
    );
    labels.insert("org.opencontainers.image.version".into(), json!(version));
    labels.insert(
        "org.opencontainers.image.licenses".into(),
        json!("MIT OR Apache-2.0"),
    );
    if let Some(revision) = git_revision() {
        labels.insert("org.opencontainers.image.revision".into(), json!(revision));
    }
    if let Some(source) = inputs.source.clone().or_else(git_origin) {
        labels.insert("org.opencontainers.image.source".into(), json!(source));
    }
    // The epoch, like the files' mtimes: a reproducible image. (Some tools
    // expect the times to be there at all.)
    let created = "1970-01-01T00:00:00Z";
    let config = json!({
        "created": created,
        "architecture": oci_architecture(),
        "os": "linux",
        "config": {
            "Entrypoint": [format!("/{BINARY_PATH}")],
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "WorkingDir": "/",
            "Labels": labels,
        },
        "rootfs": { "type": "layers", "diff_ids": [diff_id] },
        "history": [{ "created": created, "created_by": "cargo xtask image" }],
    });
    let (config_digest, config_size) = write_blob(out, &serde_json::to_vec(&config)?)?;

    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": { "mediaType": MEDIA_CONFIG, "digest": config_digest, "size": config_size },
        "layers": [{ "mediaType": MEDIA_LAYER_GZIP, "digest": layer_digest, "size": layer_size }],
        "annotations": labels,
    });
    let (manifest_digest, manifest_size) = write_blob(out, &serde_json::to_vec(&manifest)?)?;

    let index = json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [{
            "mediaType": MEDIA_MANIFEST,
            "digest": manifest_digest,
            "size": manifest_size,
            "platform": { "architecture": oci_architecture(), "os": "linux" },
            "annotations": {
                ANNOTATION_REF_NAME: reference.tag,
                ANNOTATION_CONTAINERD_NAME: reference.normalized(),
            },
        }],
    });
    write_json(&out.join("index.json"), &index)?;
    write_json(
        &out.join("oci-layout"),
        &json!({ "imageLayoutVersion": "1.0.0" }),
    )?;
    Ok(Built {
        layout: out.to_path_buf(),
        reference,
        manifest_digest,
        version,
    })
}

fn write_json(path: &Path, value: &Value) -> Result<()> {
    fs::write(path, serde_json::to_vec_pretty(value)?)
        .with_context(|| format!("writing {}", path.display()))
}

/// Makes `out` an empty directory, replacing an earlier layout; refuses a
/// directory holding anything else.
fn prepare_out(out: &Path) -> Result<()> {
    match fs::read_dir(out) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("reading {}", out.display())),
        Ok(mut entries) => {
            if entries.next().is_some() {
                if !out.join("oci-layout").exists() {
                    bail!(
                        "image: {} exists and is not an OCI layout: choose another --out",
                        out.display()
                    );
                }
                fs::remove_dir_all(out)
                    .with_context(|| format!("removing the old layout {}", out.display()))?;
            }
        }
    }
    fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_references() {
        let r = ImageRef::parse("switchboard:0.1.0").expect("parse");
        assert_eq!((r.name.as_str(), r.tag.as_str()), ("switchboard", "0.1.0"));
        assert_eq!(r.normalized(), "docker.io/library/switchboard:0.1.0");
        let r = ImageRef::parse("registry.local:5000/net/switchboard:v1").expect("parse");
        assert_eq!(r.name, "registry.local:5000/net/switchboard");
        assert_eq!(r.normalized(), "registry.local:5000/net/switchboard:v1");
        assert_eq!(
            ImageRef::parse("me/switchboard:dev")
                .expect("parse")
                .normalized(),
            "docker.io/me/switchboard:dev"
        );
        for bad in [
            "switchboard",
            "registry.local:5000/switchboard",
            "x:",
            ":tag",
            "x:-a",
            "x@sha256:ab:c",
        ] {
            assert!(ImageRef::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn parses_ldd_output() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                    \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        assert_eq!(
            parse_ldd(text).expect("parse"),
            vec![
                PathBuf::from("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
        assert!(parse_ldd("\tstatically linked\n")
            .expect("parse")
            .is_empty());
        assert!(parse_ldd("\tlibfoo.so => not found\n").is_err());
    }

    #[test]
    fn tree_adds_parents_and_refuses_bad_paths() {
        let mut tree = Tree::default();
        tree.add(
            "usr/local/bin/x",
            Entry::File {
                data: vec![1],
                mode: 0o755,
            },
        )
        .expect("add");
        assert!(matches!(tree.0.get("usr/local"), Some(Entry::Dir { .. })));
        assert!(tree.add("../etc/x", Entry::Dir { mode: 0o755 }).is_err());
        assert!(tree
            .add("usr/local/bin/x/y", Entry::Dir { mode: 0o755 })
            .is_err());
    }
}
