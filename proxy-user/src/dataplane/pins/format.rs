//! What a pin root says of itself: the format version of its layout (which
//! maps, under which names and with which entry layouts), and the pins in it
//! that this version does not use.
//!
//! The format is a symbolic link `<pin root>/SB_FORMAT` whose target is the
//! version number (bpffs holds BPF objects, directories and symbolic links,
//! no regular files). `readlink` reads it without any BPF privilege, and an
//! older binary's `switchboard cleanup`, which removes every `SB_` name,
//! removes it too.
//!
//! An agent refuses a pin root of a newer format than its own: that agent's
//! maps may have layouts this one would misread, and its programs would be
//! left attached beside this one's. Over an older format, or a pin root
//! without a stamp, it adopts the maps of its own layout (a map's name
//! stands for its layout), creates the others and records its format; the
//! `SB_` pins it does not know stay where they are, read by nothing, and
//! `status` and `doctor` list them until they are removed (`switchboard
//! cleanup` removes every `SB_` pin).
use std::{
    fs, io,
    path::{Path, PathBuf},
};

use proxy_common::names;

use crate::dataplane::pins::resize;

/// This version's pin root format. Raise it with every change of a pinned
/// map's name, type or entry layout (the names are in
/// `proxy_common::names::ALL`; the test `the_format_follows_the_map_names`
/// fails until this is raised when they change).
pub const FORMAT: u32 = 9;

/// Where the agent pins its maps unless told otherwise.
pub const DEFAULT_PIN_ROOT: &str = "/sys/fs/bpf/switchboard";

/// The name of the format stamp in the pin root.
pub const FORMAT_PIN: &str = "SB_FORMAT";
/// Where a new stamp is made before it is moved over the old one (bpffs
/// refuses names with a dot).
const FORMAT_PIN_NEW: &str = "SB_FORMAT_new";

#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("pin root {} is of format {found}, newer than this switchboard's (format {FORMAT}): a newer version's agent ran there, and its maps may not read as this version expects; run that version's binary, or remove everything with `switchboard cleanup --pin-root {}` (every tracked connection is reset) and start again", .pin_root.display(), .pin_root.display())]
    Newer { pin_root: PathBuf, found: u32 },
    #[error("pin root {}: the format stamp {} reads {text:?}, which is no format version (this switchboard's is {FORMAT}); remove the stamp if it is not switchboard's, or clean up with `switchboard cleanup --pin-root {}`", .pin_root.display(), .path.display(), .pin_root.display())]
    Unreadable {
        pin_root: PathBuf,
        path: PathBuf,
        text: String,
    },
    #[error("reading the format stamp {}", .path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("recording format {FORMAT} in {}", .path.display())]
    Write { path: PathBuf, source: io::Error },
}

/// The format recorded in `pin_root`: `None` when there is no stamp (an
/// empty pin root, or one whose stamp was removed).
pub fn read_format(pin_root: &Path) -> Result<Option<u32>, FormatError> {
    let path = pin_root.join(FORMAT_PIN);
    let target = match fs::read_link(&path) {
        Ok(target) => target,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        // Something else under that name (not a symbolic link).
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            return Err(FormatError::Unreadable {
                pin_root: pin_root.to_owned(),
                path,
                text: "(not a symbolic link)".into(),
            })
        }
        Err(source) => return Err(FormatError::Read { path, source }),
    };
    let text = target.to_string_lossy().into_owned();
    match text.trim().parse() {
        Ok(version) => Ok(Some(version)),
        Err(_) => Err(FormatError::Unreadable {
            pin_root: pin_root.to_owned(),
            path,
            text,
        }),
    }
}

/// Before an agent touches `pin_root`: refuses one of a newer (or
/// unreadable) format; returns the format found.
pub fn check_format(pin_root: &Path) -> Result<Option<u32>, FormatError> {
    let found = read_format(pin_root)?;
    match found {
        Some(found) if found > FORMAT => Err(FormatError::Newer {
            pin_root: pin_root.to_owned(),
            found,
        }),
        _ => Ok(found),
    }
}

/// Records this version's format in `pin_root` (atomically: a new link
/// moved over the old one). Returns whether it changed.
pub fn stamp(pin_root: &Path) -> Result<bool, FormatError> {
    if read_format(pin_root).ok().flatten() == Some(FORMAT) {
        return Ok(false);
    }
    let path = pin_root.join(FORMAT_PIN);
    let fresh = pin_root.join(FORMAT_PIN_NEW);
    let write = || -> io::Result<()> {
        match fs::remove_file(&fresh) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        std::os::unix::fs::symlink(FORMAT.to_string(), &fresh)?;
        fs::rename(&fresh, &path)
    };
    write().map_err(|source| FormatError::Write { path, source })?;
    Ok(true)
}

/// Removes the format stamp (with the pins, on a failed first start).
pub fn remove_stamp(pin_root: &Path) -> io::Result<()> {
    for name in [FORMAT_PIN, FORMAT_PIN_NEW] {
        match fs::remove_file(pin_root.join(name)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Whether `name` (an entry of the pin root) is the format stamp.
pub fn is_stamp(name: &str) -> bool {
    name == FORMAT_PIN || name == FORMAT_PIN_NEW
}

/// The maps of this version pinned under `pin_root`, by name.
pub fn current_pins(pin_root: &Path) -> Vec<String> {
    entries(pin_root)
        .into_iter()
        .filter(|name| names::ALL.contains(&name.as_str()))
        .collect()
}

/// The entries of `pin_root`, by name (sorted; none when it cannot be read).
fn entries(pin_root: &Path) -> Vec<String> {
    let Ok(dir) = fs::read_dir(pin_root) else {
        return Vec::new();
    };
    let mut names: Vec<String> = dir
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// What `status` and `doctor` say of a pin root's layout.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Layout {
    /// The recorded format (`None`: no stamp).
    pub format: Option<u32>,
    /// Why the stamp cannot be read, when it cannot.
    pub format_error: Option<String>,
    /// Whether any map of this version is pinned.
    pub maps_pinned: bool,
    /// `SB_` pins this version does not know (another version's layout).
    pub unknown: Vec<String>,
    /// Staging pins of a resize that did not finish.
    pub staging: Vec<String>,
}

/// Reads the layout of `pin_root`.
pub fn layout(pin_root: &Path) -> Layout {
    let (format, format_error) = match read_format(pin_root) {
        Ok(format) => (format, None),
        Err(e) => (None, Some(format!("{:#}", anyhow::Error::from(e)))),
    };
    let mut layout = Layout {
        format,
        format_error,
        ..Layout::default()
    };
    for name in entries(pin_root) {
        if names::ALL.contains(&name.as_str()) {
            layout.maps_pinned = true;
        } else if name.ends_with(resize::STAGING_SUFFIX) {
            layout.staging.push(name);
        } else if name.starts_with("SB_") && !is_stamp(&name) {
            layout.unknown.push(name);
        }
    }
    layout
}

/// Something wrong with a pin root's layout, and what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub what: String,
    pub fix: String,
}

/// The problems `status` and `doctor` list for `layout` of `pin_root`.
pub fn problems(layout: &Layout, pin_root: &Path) -> Vec<Problem> {
    let root = pin_root.display();
    let mut found = Vec::new();
    if let Some(error) = &layout.format_error {
        found.push(Problem {
            what: error.clone(),
            fix: "see above; an agent refuses to start on this pin root".into(),
        });
    }
    match layout.format {
        Some(format) if format > FORMAT => found.push(Problem {
            what: format!("pin root {root} is of format {format}, newer than this switchboard's (format {FORMAT}): a newer version wrote it, and this binary may misread its maps (an agent of this version refuses to start there)"),
            fix: format!("use the newer version's binary; or `switchboard cleanup --pin-root {root}` and start again (every tracked connection is reset)"),
        }),
        Some(format) if format < FORMAT => found.push(Problem {
            what: format!("pin root {root} is of format {format}, older than this switchboard's (format {FORMAT})"),
            fix: "start this version's agent: it adopts the maps of its layout and records its format".into(),
        }),
        None if layout.maps_pinned && layout.format_error.is_none() => found.push(Problem {
            what: format!("pin root {root} holds maps but no format stamp ({FORMAT_PIN}; this switchboard's format is {FORMAT})"),
            fix: "start this version's agent: it adopts the maps and records its format".into(),
        }),
        _ => {}
    }
    if !layout.unknown.is_empty() {
        found.push(Problem {
            what: format!(
                "pins this version does not use (another version's layout): {}; nothing reads or expires them",
                layout.unknown.join(", ")
            ),
            fix: format!("once no agent of that version runs, remove them (`rm {root}/<NAME>`), or start over with `switchboard cleanup --pin-root {root}`"),
        });
    }
    if !layout.staging.is_empty() {
        found.push(Problem {
            what: format!(
                "staging pins of a resize that did not finish: {} (each a whole map held in kernel memory), unless an agent is resizing right now",
                layout.staging.join(", ")
            ),
            fix: format!("start the agent again (it removes them at start), or remove them (`rm {root}/<NAME>_resize`)"),
        });
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("sb-pinroot-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("mkdir");
        dir
    }

    /// Pins (plain files stand in for them off bpffs).
    fn pin(root: &Path, names: &[&str]) {
        for name in names {
            fs::write(root.join(name), "").expect("pin");
        }
    }

    #[test]
    fn a_stamp_is_recorded_once_and_read_back() {
        let root = scratch("stamp");
        assert_eq!(read_format(&root).expect("read"), None);
        assert!(stamp(&root).expect("stamp"));
        assert_eq!(read_format(&root).expect("read"), Some(FORMAT));
        assert!(!stamp(&root).expect("again"), "unchanged");
        assert_eq!(
            fs::read_link(root.join(FORMAT_PIN))
                .expect("link")
                .to_string_lossy(),
            FORMAT.to_string()
        );
        // An older stamp is replaced.
        fs::remove_file(root.join(FORMAT_PIN)).expect("rm");
        std::os::unix::fs::symlink("0", root.join(FORMAT_PIN)).expect("old stamp");
        assert_eq!(check_format(&root).expect("older is fine"), Some(0));
        assert!(stamp(&root).expect("restamp"));
        assert_eq!(read_format(&root).expect("read"), Some(FORMAT));
        remove_stamp(&root).expect("remove");
        assert_eq!(read_format(&root).expect("read"), None);
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn a_newer_format_is_refused_naming_both_versions_and_the_way_out() {
        let root = scratch("newer");
        let newer = FORMAT + 1;
        std::os::unix::fs::symlink(newer.to_string(), root.join(FORMAT_PIN)).expect("stamp");
        let err = check_format(&root).expect_err("newer");
        assert!(
            matches!(err, FormatError::Newer { found, .. } if found == newer),
            "{err}"
        );
        let text = err.to_string();
        assert!(text.contains(&format!("format {newer}")), "{text}");
        assert!(text.contains(&format!("(format {FORMAT})")), "{text}");
        assert!(text.contains("switchboard cleanup --pin-root"), "{text}");
        assert!(text.contains("that version's binary"), "{text}");
        let found = problems(&layout(&root), &root);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].what.contains("newer than this switchboard's"),
            "{found:?}"
        );
        // Junk under the stamp's name is refused too.
        fs::remove_file(root.join(FORMAT_PIN)).expect("rm");
        std::os::unix::fs::symlink("two", root.join(FORMAT_PIN)).expect("junk");
        assert!(matches!(
            check_format(&root),
            Err(FormatError::Unreadable { .. })
        ));
        fs::remove_file(root.join(FORMAT_PIN)).expect("rm");
        fs::write(root.join(FORMAT_PIN), "1").expect("a file");
        assert!(matches!(
            check_format(&root),
            Err(FormatError::Unreadable { .. })
        ));
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn pins_of_other_layouts_and_staging_pins_are_problems() {
        let root = scratch("layout");
        // An empty pin root: nothing to say.
        assert!(problems(&layout(&root), &root).is_empty());
        // An agent of this version: no problem.
        pin(&root, &names::ALL);
        fs::create_dir(root.join("links")).expect("links");
        stamp(&root).expect("stamp");
        assert!(
            problems(&layout(&root), &root).is_empty(),
            "{:?}",
            problems(&layout(&root), &root)
        );
        // Pins of other layouts (an older map name, a newer one), a stale
        // resize.
        pin(&root, &["SB_CT_V4", "SB_FE_V9"]);
        pin(
            &root,
            &[&format!("{}{}", names::CONNTRACK, resize::STAGING_SUFFIX)],
        );
        let found = layout(&root);
        assert_eq!(found.unknown, ["SB_CT_V4", "SB_FE_V9"]);
        assert_eq!(found.staging, [format!("{}_resize", names::CONNTRACK)]);
        let what: Vec<String> = problems(&found, &root)
            .into_iter()
            .map(|p| p.what)
            .collect();
        assert_eq!(what.len(), 2, "{what:?}");
        assert!(
            what[0].contains("SB_CT_V4, SB_FE_V9") && what[0].contains("does not use"),
            "{what:?}"
        );
        assert!(what[1].contains("_resize"), "{what:?}");
        // An older format: the agent adopts and restamps.
        fs::remove_file(root.join(FORMAT_PIN)).expect("rm");
        std::os::unix::fs::symlink((FORMAT - 1).to_string(), root.join(FORMAT_PIN))
            .expect("older stamp");
        let older = problems(&layout(&root), &root);
        assert!(
            older[0].what.contains("older than this switchboard's")
                && older[0].fix.contains("records its format"),
            "{older:?}"
        );
        // Maps without a stamp.
        remove_stamp(&root).expect("unstamp");
        let what: Vec<String> = problems(&layout(&root), &root)
            .into_iter()
            .map(|p| p.what)
            .collect();
        assert!(what[0].contains("no format stamp"), "{what:?}");
        let _ = fs::remove_dir_all(&root);
    }

    /// The names of the pinned maps are part of the format: changing them
    /// without raising [`FORMAT`] fails here. (Raise FORMAT, then record the
    /// new list.)
    #[test]
    fn the_format_follows_the_map_names() {
        let recorded: (u32, &[&str]) = (
            9,
            &[
                "SB_FE_V1",
                "SB_BE_V1",
                "SB_CT_V5",
                "SB_RNAT_V1",
                "SB_SVC_STATS_V1",
                "SB_STATS_V5",
                "SB_AFFINITY_V1",
                "SB_SOCK_V1",
                "SB_SOCK_AFFINITY_V1",
                "SB_CONFIG_V1",
                "SB_UPLINK_V1",
                "SB_MAGLEV_V1",
                "SB_FRAG_V1",
                "SB_FE6_V1",
                "SB_BE6_V1",
                "SB_CT6_V1",
                "SB_RNAT6_V1",
                "SB_AFFINITY6_V1",
                "SB_SOCK6_V1",
                "SB_FRAG6_V1",
                "SB_TAIL6_V1",
                "SB_UPLINK6_V1",
                "SB_XDP_TAIL6_V1",
                "SB_SRC_RANGE_V1",
                "SB_SRC_RANGE6_V1",
                "SB_SVC_DENIED_V1",
                "SB_FE_FILTER_V3",
                "SB_QUIET_V2",
                "SB_QUIET_GEN_V1",
                "SB_CT_GEN_V1",
                "SB_SOCK_CONN_V2",
                "SB_SOCK_CONN6_V2",
            ],
        );
        assert_eq!(
            (FORMAT, names::ALL.as_slice()),
            recorded,
            "the pinned maps changed: raise pinroot::FORMAT and record the new names here"
        );
    }
}
