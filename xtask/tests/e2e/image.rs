//! `cargo xtask image`: builds the OCI layout from the already built
//! `SWITCHBOARD_BIN` (no second release build), unpacks it with an unpacker of
//! its own (index.json → manifest → config and layers, every blob's sha256 and
//! size checked, layers untarred into a temporary root filesystem), and runs
//! `switchboard --version` and the bpffs init step's shell inside it with
//! `chroot`. Needs root (chroot, and busybox-static from apt when missing).

use std::{
    fs,
    io::Read as _,
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::Value;
use xtask::image::{self, ImageRef, Inputs};

/// A temporary directory removed on drop, also when the test fails.
struct TempDir(PathBuf);

impl TempDir {
    fn new(label: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let path =
            std::env::temp_dir().join(format!("sb-image-{label}-{}-{nanos}", std::process::id()));
        fs::create_dir_all(&path).expect("create temp dir");
        Self(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Reads the blob a descriptor names, checking its size and sha256.
fn read_blob(layout: &Path, descriptor: &Value) -> Vec<u8> {
    let digest = descriptor["digest"].as_str().expect("descriptor digest");
    let size = descriptor["size"].as_u64().expect("descriptor size");
    let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
    assert!(
        hex.len() == 64
            && hex
                .chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()),
        "malformed digest {digest}"
    );
    let data = fs::read(layout.join("blobs/sha256").join(hex)).expect("read blob");
    assert_eq!(data.len() as u64, size, "blob {digest}: size");
    assert_eq!(
        image::sha256_hex(&data),
        hex,
        "blob {digest}: content does not match its digest"
    );
    data
}

struct Unpacked {
    config: Value,
    manifest: Value,
    index_entry: Value,
}

/// Unpacks the image tagged `tag` in the layout into `rootfs`.
fn unpack(layout: &Path, tag: &str, rootfs: &Path) -> Unpacked {
    let oci_layout: Value =
        serde_json::from_slice(&fs::read(layout.join("oci-layout")).expect("oci-layout"))
            .expect("JSON");
    assert_eq!(oci_layout["imageLayoutVersion"], "1.0.0");
    let index: Value =
        serde_json::from_slice(&fs::read(layout.join("index.json")).expect("index.json"))
            .expect("JSON");
    assert_eq!(index["schemaVersion"], 2);
    let entry = index["manifests"]
        .as_array()
        .expect("manifests")
        .iter()
        .find(|m| m["annotations"][image::ANNOTATION_REF_NAME] == tag)
        .unwrap_or_else(|| panic!("no manifest tagged {tag} in index.json"))
        .clone();
    assert_eq!(entry["mediaType"], image::MEDIA_MANIFEST);
    let manifest: Value =
        serde_json::from_slice(&read_blob(layout, &entry)).expect("manifest JSON");
    assert_eq!(manifest["schemaVersion"], 2);
    assert_eq!(manifest["config"]["mediaType"], image::MEDIA_CONFIG);
    let config: Value =
        serde_json::from_slice(&read_blob(layout, &manifest["config"])).expect("config JSON");
    let layers = manifest["layers"].as_array().expect("layers");
    let diff_ids = config["rootfs"]["diff_ids"].as_array().expect("diff_ids");
    assert_eq!(layers.len(), diff_ids.len(), "one diff_id per layer");
    for (layer, diff_id) in layers.iter().zip(diff_ids) {
        assert_eq!(layer["mediaType"], image::MEDIA_LAYER_GZIP);
        let compressed = read_blob(layout, layer);
        let mut tar = Vec::new();
        flate2::read::GzDecoder::new(compressed.as_slice())
            .read_to_end(&mut tar)
            .expect("gunzip layer");
        assert_eq!(
            diff_id.as_str(),
            Some(format!("sha256:{}", image::sha256_hex(&tar)).as_str()),
            "diff_id is the uncompressed layer's digest"
        );
        let mut archive = tar::Archive::new(tar.as_slice());
        archive.set_preserve_permissions(true);
        for entry in archive.entries().expect("tar entries") {
            let mut entry = entry.expect("tar entry");
            let path = entry.path().expect("entry path").into_owned();
            assert!(
                !path
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(".wh.")),
                "unexpected whiteout {}",
                path.display()
            );
            // unpack_in refuses paths that leave rootfs.
            assert!(
                entry.unpack_in(rootfs).expect("unpack entry"),
                "{} escapes",
                path.display()
            );
        }
    }
    Unpacked {
        config,
        manifest,
        index_entry: entry,
    }
}

fn chroot(rootfs: &Path, args: &[&str]) -> std::process::Output {
    // Found on the host's PATH: the child's environment (cleared below)
    // is the image's.
    let chroot = xtask::util::which("chroot").expect("chroot (coreutils)");
    Command::new(chroot)
        .arg(rootfs)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/local/bin:/bin")
        .output()
        .expect("run chroot")
}

#[test]
fn image_layout_unpacks_and_runs() {
    assert!(
        xtask::util::is_root(),
        "the image test runs chroot and may install busybox-static: run it with `cargo xtask test` as root"
    );
    let binary = xtask::testenv::switchboard();
    let busybox = image::ensure_busybox().expect("busybox");
    let host_version = Command::new(&binary)
        .arg("--version")
        .output()
        .expect("run switchboard --version");
    let host_version = String::from_utf8_lossy(&host_version.stdout)
        .trim()
        .to_owned();
    assert!(host_version.starts_with("switchboard "), "{host_version}");

    let work = TempDir::new("test");
    let layout = work.0.join("layout");
    let reference = ImageRef::parse("example.test/net/switchboard:e2e").expect("reference");
    let built = image::build_layout(
        &Inputs {
            binary: binary.clone(),
            busybox: Some(busybox),
            reference: Some(reference.clone()),
            source: Some("https://example.test/switchboard".to_owned()),
        },
        &layout,
    )
    .expect("build the layout");
    assert_eq!(built.reference, reference);
    // The image is tagged with the release; the binary also names its
    // git revision after it.
    let release = host_version
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ");
    assert_eq!(format!("switchboard {}", built.version), release);

    let rootfs = work.0.join("rootfs");
    fs::create_dir_all(&rootfs).expect("rootfs");
    let unpacked = unpack(&layout, "e2e", &rootfs);
    assert_eq!(
        unpacked.index_entry["annotations"][image::ANNOTATION_CONTAINERD_NAME],
        "example.test/net/switchboard:e2e"
    );
    assert_eq!(
        unpacked.index_entry["digest"],
        built.manifest_digest.as_str()
    );
    assert_eq!(unpacked.config["os"], "linux");
    assert_eq!(
        unpacked.config["config"]["Entrypoint"][0],
        "/usr/local/bin/switchboard"
    );
    let labels = &unpacked.config["config"]["Labels"];
    assert_eq!(
        labels["org.opencontainers.image.version"],
        built.version.as_str()
    );
    assert_eq!(
        labels["org.opencontainers.image.source"],
        "https://example.test/switchboard"
    );
    assert_eq!(unpacked.manifest["annotations"], *labels);

    // The binary runs in the image's root alone: its libraries and loader are there.
    let out = chroot(&rootfs, &["/usr/local/bin/switchboard", "--version"]);
    assert!(
        out.status.success(),
        "switchboard --version in the image: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), host_version);

    // The DaemonSet's bpffs init step has its shell, grep and mount.
    let out = chroot(
        &rootfs,
        &[
            "/bin/sh",
            "-c",
            "echo 'bpf /sys/fs/bpf bpf rw 0 0' | grep -q ' /sys/fs/bpf bpf ' && test -x /bin/mount && echo ok",
        ],
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "ok",
        "init step tools: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Same inputs, same image: a second build gives the same manifest digest.
    let again = image::build_layout(
        &Inputs {
            binary,
            busybox: image::ensure_busybox().ok(),
            reference: Some(reference),
            source: Some("https://example.test/switchboard".to_owned()),
        },
        &layout,
    )
    .expect("rebuild over the old layout");
    assert_eq!(
        again.manifest_digest, built.manifest_digest,
        "the build is reproducible"
    );
}
