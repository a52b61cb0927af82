//! `switchboard verify`: asks the running agent to compare the pinned maps
//! with its desired state (see [`crate::observe::verify`]) and prints the
//! differences, per frontend. Exits 0 when they match, 1 when they do not
//! or no agent answers.
use std::fmt::Write as _;

use super::{Common, Done, Output};
use crate::observe::verify::{self, Verification};

pub fn run(common: &Common) -> anyhow::Result<Done> {
    let verification = verify::ask(&common.pin_root)?;
    let text = match common.output {
        Output::Json => super::to_json(&verification)?,
        Output::Table => render(&verification),
    };
    Ok(Done {
        text,
        failed: !verification.matches(),
    })
}

pub fn render(v: &Verification) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} frontends desired, {} in the maps, {} backends in the maps",
        v.frontends_desired, v.frontends_in_maps, v.backends_in_maps
    );
    if v.matches() {
        out.push_str("The maps match the agent's desired state.\n");
        return out;
    }
    let mut t = super::table::Table::new(&["FRONTEND", "SERVICE", "PROBLEM", "DETAIL"]);
    for p in &v.problems {
        let dash = |s: &str| {
            if s.is_empty() {
                "-".to_owned()
            } else {
                s.to_owned()
            }
        };
        t.push(vec![
            dash(&p.frontend),
            dash(&p.service),
            p.kind.as_str().to_owned(),
            p.detail.clone(),
        ]);
    }
    let _ = writeln!(out, "\n{} DIFFERENCE(S)", v.problems.len());
    out.push_str(&t.render());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::verify::{Problem, ProblemKind};

    #[test]
    fn a_match_says_so_and_a_difference_is_listed_per_frontend() {
        let mut v = Verification {
            frontends_desired: 2,
            frontends_in_maps: 2,
            backends_in_maps: 3,
            problems: Vec::new(),
        };
        assert!(render(&v).contains("The maps match the agent's desired state."));
        v.problems.push(Problem {
            frontend: "10.96.0.10:80/TCP".into(),
            service: "default/web".into(),
            kind: ProblemKind::WrongBackends,
            detail: "the maps send to 10.244.0.1:80, desired 10.244.0.2:80".into(),
        });
        v.problems.push(Problem {
            frontend: String::new(),
            service: String::new(),
            kind: ProblemKind::OrphanedBackend,
            detail: "backend id 9 (10.244.9.9:80) is named by no slot".into(),
        });
        let text = render(&v);
        assert!(text.contains("2 DIFFERENCE(S)"), "{text}");
        assert!(
            text.contains("10.96.0.10:80/TCP  default/web  wrong-backends"),
            "{text}"
        );
        assert!(
            text.contains("-                  -            orphaned-backend"),
            "{text}"
        );
    }
}
