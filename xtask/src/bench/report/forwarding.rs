//! The forwarding rate on one core (`sb_bench fwd`).

use std::fmt::Write as _;

use crate::bench::fmt::{fmt_opt, raw};
use crate::bench::results::Fwd;

/// The section (its heading even for a run without the part).
pub fn section(fwd: Option<&Fwd>) -> String {
    let none = Fwd::default();
    let fwd = fwd.unwrap_or(&none);
    let mut md = String::new();
    let meta = &fwd.meta;
    if let Some(why) = &fwd.not_measured {
        let _ = writeln!(md, "\n## Forwarding rate, one core\n\n{why}.");
    } else {
        let _ = writeln!(
            md,
            "\n## Forwarding rate, one core (CPU {})\n\n{}. Frames: {} bytes UDP.\n\n| hook | setup | Mpps | ns/packet | frames reaching the pods |\n|---|---|---|---|---|",
            raw(meta.cpu),
            meta.generator.as_deref().unwrap_or(""),
            raw(meta.frame_bytes)
        );
    }
    for r in &fwd.rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} |",
            r.path.as_deref().unwrap_or(""),
            r.setup.as_deref().unwrap_or(""),
            fmt_opt(r.mpps, 3),
            fmt_opt(r.ns_per_packet, 0),
            match r.reached_pods {
                Some(v) => format!("{v} of {}", raw(r.frames)),
                None => r.note.clone().unwrap_or_default(),
            },
        );
    }
    md.push('\n');
    md
}
