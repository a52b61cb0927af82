//! What the machine and a process spend while a phase runs: the CPU time
//! by kind (`/proc/stat`) and a process's own (`/proc/PID/stat`), a
//! process's memory (`/proc/PID/status`), and, on request, a `perf record`
//! of the whole machine.

use std::fs;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{anyhow, Context, Result};

/// `SB_BENCH_PERF=DIR`: a `perf record -a -g` of the whole machine over
/// each wrk phase, to `DIR/<path>-<n>.data` (for comparing where two paths
/// spend their CPU with `perf report`); off unless set.
pub struct Profile(Option<std::process::Child>);

impl Profile {
    pub fn start(key: &str, secs: u32) -> Result<Profile> {
        let Some(dir) = std::env::var_os("SB_BENCH_PERF") else {
            return Ok(Profile(None));
        };
        let dir = PathBuf::from(dir);
        fs::create_dir_all(&dir)?;
        let n = (0..)
            .find(|n| !dir.join(format!("{key}-{n}.data")).exists())
            .unwrap_or(0);
        let out = dir.join(format!("{key}-{n}.data"));
        let child = Command::new("perf")
            .args(["record", "-a", "-g", "-F", "499", "-q", "-o"])
            .arg(&out)
            .args(["--", "sleep", &secs.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("starting perf record (SB_BENCH_PERF)")?;
        Ok(Profile(Some(child)))
    }

    pub fn finish(self) -> Result<()> {
        if let Some(mut child) = self.0 {
            child.wait().context("perf record")?;
        }
        Ok(())
    }
}

/// CPU time used, in clock ticks: the machine's, by kind (`/proc/stat`),
/// and the agent's (`/proc/PID/stat`), if there is one.
#[derive(Clone, Copy, Default)]
pub struct CpuUse {
    user: u64,
    system: u64,
    softirq: u64,
    idle: u64,
    agent: Option<u64>,
}

impl CpuUse {
    pub fn read(agent: Option<u32>) -> Result<CpuUse> {
        let stat = fs::read_to_string("/proc/stat").context("read /proc/stat")?;
        let line = stat
            .lines()
            .find(|l| l.starts_with("cpu "))
            .ok_or_else(|| anyhow!("/proc/stat has no cpu line"))?;
        let v: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        let at = |i: usize| v.get(i).copied().unwrap_or(0);
        let agent = match agent {
            Some(pid) => Some(process_ticks(pid)?),
            None => None,
        };
        Ok(CpuUse {
            user: at(0) + at(1),
            system: at(2),
            softirq: at(5) + at(6),
            idle: at(3) + at(4),
            agent,
        })
    }

    pub fn since(&self, before: &CpuUse) -> CpuUse {
        CpuUse {
            user: self.user - before.user,
            system: self.system - before.system,
            softirq: self.softirq - before.softirq,
            idle: self.idle - before.idle,
            agent: self.agent.zip(before.agent).map(|(a, b)| a - b),
        }
    }

    /// The machine's busy time (all CPUs together), in seconds.
    pub fn busy_secs(&self) -> f64 {
        // SAFETY: sysconf only reads a system constant.
        let tck = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
        (self.user + self.system + self.softirq) as f64 / tck as f64
    }

    fn total(&self) -> u64 {
        (self.user + self.system + self.softirq + self.idle).max(1)
    }

    pub fn describe(&self) -> String {
        let pct = |t: u64| t as f64 * 100.0 / self.total() as f64;
        let agent = self
            .agent
            .map(|a| format!(", agent {:.1} %", pct(a)))
            .unwrap_or_default();
        format!(
            "user {:.0} %, system {:.0} %, softirq {:.0} %, idle {:.0} %{agent}",
            pct(self.user),
            pct(self.system),
            pct(self.softirq),
            pct(self.idle)
        )
    }
}

/// User and system clock ticks process `pid` has used.
fn process_ticks(pid: u32) -> Result<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("read /proc/{pid}/stat"))?;
    // The fields after the command name, which is in parentheses.
    let rest = text
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow!("/proc/{pid}/stat: no command name"))?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15, 12 and 13 after the name.
    Ok(tick(11) + tick(12))
}

/// A process's `/proc/PID/status` field, in kB.
pub fn status_kb(pid: u32, key: &str) -> Result<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/status"))?;
    text.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow!("{key} missing from /proc/{pid}/status"))
}
