//! Is an agent running for this pin root? The agent lock ([`crate::observe::lock`])
//! names the holder while it lives; the status file's pid is the fallback
//! for agents that predate the lock.
use std::path::Path;

use serde::Serialize;

use crate::observe::status::AgentStatus;

/// The agent of a pin root, as far as can be told.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AgentProcess {
    /// The pid of the running agent, or of the last one that wrote a status.
    pub pid: Option<u32>,
    pub alive: bool,
    /// How it was found: `lock` or `status file`.
    pub evidence: &'static str,
}

/// The agent of `pin_root`: the lock holder if the lock is held, else the
/// status file's writer (alive when its process still runs an `agent`).
pub fn agent_process(pin_root: &Path, status: Option<&AgentStatus>) -> AgentProcess {
    if let Some(pid) = crate::observe::lock::holder(pin_root) {
        return AgentProcess {
            pid: Some(pid),
            alive: true,
            evidence: "lock",
        };
    }
    match status {
        Some(s) => AgentProcess {
            pid: Some(s.pid),
            alive: runs_an_agent(s.pid),
            evidence: "status file",
        },
        None => AgentProcess {
            pid: None,
            alive: false,
            evidence: "none",
        },
    }
}

/// Whether process `pid` exists and runs `... agent ...` (a recycled pid
/// running something else does not count).
fn runs_an_agent(pid: u32) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    cmdline.split(|b| *b == 0).any(|arg| arg == b"agent")
}
