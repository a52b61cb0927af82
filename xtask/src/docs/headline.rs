//! The README's headline figures: a few goals of the latest full benchmark
//! run, named as a user would ask about them, with what each is compared
//! with. The block is generated from `docs/benchmarks/latest.json`
//! (`cargo xtask docs --write` writes it again after a run), and the docs
//! check holds the README to exactly what [`render`] makes.

use std::path::Path;

use anyhow::{bail, Result};

use super::{BenchFigures, Finding, FIGURES_PATH};

pub const OPEN: &str = "<!-- headline-figures: generated from docs/benchmarks/latest.json by `cargo xtask docs --write` -->";
pub const CLOSE: &str = "<!-- /headline-figures -->";

/// One headline: the goal of the run it quotes, and how the README names it.
struct Headline {
    goal: &'static str,
    what: &'static str,
    against: &'static str,
}

const SPREAD: &str =
    "no Service: the same pods, each connection sent to one by the node's multipath route";

const HEADLINES: &[Headline] = &[
    Headline {
        goal: "new TCP connections/s at 10k Services, switchboard socket-LB (pod client) ÷ direct, spread (pod client)",
        what: "new connections/s through a ClusterIP, socket layer, 10k Services",
        against: SPREAD,
    },
    Headline {
        goal: "new TCP connections/s at 10k Services, switchboard (tc, pod client) ÷ direct, spread (pod client)",
        what: "the same through the tc layer",
        against: SPREAD,
    },
    Headline {
        goal: "new TCP connections/s at 10k Services, switchboard socket-LB (pod client) ÷ nftables",
        what: "new connections/s, socket layer, 10k Services",
        against: "kube-proxy's nftables rules, same run",
    },
    Headline {
        goal: "new TCP connections/s at 10k Services, switchboard socket-LB (pod client) ÷ iptables",
        what: "new connections/s, socket layer, 10k Services",
        against: "kube-proxy's iptables rules, same run",
    },
    Headline {
        goal: "sb_from_pod existing flow ÷ empty tc program (100k Services)",
        what: "cost of a packet of a tracked flow on a pod veth, 100k Services",
        against: "an empty tc program",
    },
    Headline {
        goal: "one EndpointSlice change → maps at 100k Services × 10, p99 (incremental model)",
        what: "an endpoint change reaching the maps, p99, 100k Services",
        against: "an absolute target",
    },
    Headline {
        goal: "agent RSS, 10k Services × 10 from the cluster source",
        what: "agent memory, 10k Services × 10 endpoints",
        against: "an absolute target",
    },
];

/// A measured cell reduced to its figure: what comes before its
/// explanation (` (`…) or its second figure (`;`…), without "paired"; a
/// bare number is a ratio, written `0.98 ×`.
fn figure(measured: &str) -> String {
    let end = measured.find([';', '(']).unwrap_or(measured.len());
    let head = measured[..end].trim();
    let head = head.strip_suffix(" paired").unwrap_or(head);
    match head.parse::<f64>() {
        Ok(_) => format!("{head} ×"),
        Err(_) => head.to_owned(),
    }
}

/// The block, markers included, for `figures`.
pub fn render(figures: &BenchFigures) -> Result<String> {
    let mut out = format!(
        "{OPEN}\nMeasured on {}, Linux {} (a shared 2-core machine: read the ratios, \
         not the absolute figures). Every goal, how each is measured and the \
         earlier runs: [docs/benchmarks.md](docs/benchmarks.md).\n\n\
         | what | measured | compared with | target |\n|---|---|---|---|\n",
        figures.machine, figures.kernel
    );
    for h in HEADLINES {
        let Some(goal) = figures.goals.iter().find(|g| g.goal == h.goal) else {
            bail!("headline goal `{}` is not in {FIGURES_PATH}", h.goal);
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} ({}) |\n",
            h.what,
            figure(&goal.measured),
            h.against,
            goal.target,
            goal.verdict
        ));
    }
    out.push_str(CLOSE);
    Ok(out)
}

/// Where the block lies in `text`: the byte range from its opening marker
/// to the end of its closing one.
fn span(text: &str) -> Option<std::ops::Range<usize>> {
    let start = text.find(OPEN)?;
    let end = text[start..].find(CLOSE)? + start + CLOSE.len();
    Some(start..end)
}

/// The findings of `file`'s headline block against `figures`: missing, or
/// not what [`render`] makes.
pub fn check(file: &Path, text: &str, figures: &BenchFigures) -> Vec<Finding> {
    let finding = |line: usize, what: String| Finding {
        file: file.to_path_buf(),
        line,
        what,
    };
    let want = match render(figures) {
        Ok(want) => want,
        Err(e) => return vec![finding(1, format!("{e:#}"))],
    };
    match span(text) {
        None => vec![finding(1, format!("no headline-figures block (`{OPEN}`)"))],
        Some(range) if text[range.clone()] != want => {
            let line = text[..range.start].lines().count() + 1;
            vec![finding(
                line,
                format!("the headline figures differ from {FIGURES_PATH}: run `cargo xtask docs --write`"),
            )]
        }
        Some(_) => Vec::new(),
    }
}

/// `text` with its headline block written again from `figures`.
pub fn write(text: &str, figures: &BenchFigures) -> Result<String> {
    let Some(range) = span(text) else {
        bail!("no headline-figures block to write (`{OPEN}` … `{CLOSE}`)");
    };
    let mut out = text.to_owned();
    out.replace_range(range, &render(figures)?);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::docs::GoalFigure;

    fn figures() -> BenchFigures {
        let goals = HEADLINES
            .iter()
            .map(|h| GoalFigure {
                goal: h.goal.to_owned(),
                target: "≥ 1".to_owned(),
                measured: "0.983 paired (quartiles 0.9–1.0); rounds' medians 0.95".to_owned(),
                verdict: "met".to_owned(),
            })
            .collect();
        BenchFigures {
            run: "r".into(),
            mode: "full".into(),
            commit: "abcdef012345".into(),
            machine: "2 × CPU".into(),
            kernel: "6.18".into(),
            goals,
        }
    }

    #[test]
    fn the_block_is_generated_and_held_to_the_figures() {
        let f = figures();
        let block = render(&f).expect("render");
        assert!(!block.contains("abcdef0"), "no commit in the README");
        assert!(block.contains("| 0.983 × | "), "{block}");
        assert!(block.contains("≥ 1 (met)"), "{block}");
        let readme = format!("# x\n\n{OPEN}\nstale\n{CLOSE}\n\nmore\n");
        assert_eq!(check(Path::new("R.md"), &readme, &f).len(), 1);
        let written = write(&readme, &f).expect("write");
        assert!(check(Path::new("R.md"), &written, &f).is_empty());
        assert!(written.ends_with("\n\nmore\n"));
        let mut other = f.clone();
        other.goals[0].measured = "0.5".into();
        assert_eq!(check(Path::new("R.md"), &written, &other).len(), 1);
        assert_eq!(check(Path::new("R.md"), "# x\n", &f).len(), 1);
    }

    #[test]
    fn figures_lose_their_explanation() {
        assert_eq!(figure("1.55 (66.2 ns ÷ 42.7 ns)"), "1.55 ×");
        assert_eq!(figure("0.17 ms (p50 0.07 ms)"), "0.17 ms");
        assert_eq!(figure("0.974 paired (quartiles 0.925–0.992)"), "0.974 ×");
        assert_eq!(figure("45.7 MiB"), "45.7 MiB");
    }
}
