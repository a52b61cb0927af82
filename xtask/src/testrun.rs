//! Runs the workspace's test binaries side by side (`cargo xtask test`).
//!
//! `cargo test` runs one binary after another, and the end-to-end tests spend
//! most of their time waiting on namespaces, agents and timers, so the two
//! cores idle. Here cargo only builds (`--no-run`); the binaries are then run
//! as jobs, several at a time:
//! - an end-to-end test (xtask's integration tests) is a job of its own, so
//!   the long ones spread over the lanes; every sandbox carries a tag unique
//!   to its process and call, so they cannot collide;
//! - the other integration test binaries (the kernel fixtures) run a job per
//!   module: each of their files is a module of one binary;
//! - a unit-test binary is one job;
//! - a test that loads both cores by design (a flood) runs alone, so it
//!   neither slows the others nor is slowed by them.
//!
//! The longest jobs start first, by the durations of the previous run
//! (`target/test-durations.tsv`). Each job's output is printed when it ends,
//! whole, so the log reads one job at a time.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use cargo_metadata::Message;

#[derive(Default, Debug, PartialEq, Eq)]
pub struct Counts {
    pub passed: u64,
    pub failed: u64,
    pub ignored: u64,
}

/// Adds up libtest's `test result: ok. 5 passed; 0 failed; 1 ignored; ...` line.
pub fn add_result_line(counts: &mut Counts, line: &str) -> bool {
    let Some(rest) = line.trim().strip_prefix("test result: ") else {
        return false;
    };
    for part in rest.split(';') {
        let mut words = part.split_whitespace().rev();
        let (Some(kind), Some(n)) = (words.next(), words.next()) else {
            continue;
        };
        let Ok(n) = n.parse::<u64>() else { continue };
        match kind {
            "passed" => counts.passed += n,
            "failed" => counts.failed += n,
            "ignored" => counts.ignored += n,
            _ => {}
        }
    }
    true
}

/// Tests that load the machine by design: each runs with no other job.
const ALONE: &[&str] = &[
    "spoofed_syn_flood",
    "burst_ten_times_the_table",
    "a_flood_of_drops_while_tracing",
];

/// A job that runs longer than this is stopped and fails.
const JOB_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// A test executable cargo built.
#[derive(Debug, Clone)]
pub struct TestBinary {
    /// The package and the binary: xtask/e2e, proxy-user/kernel,
    /// proxy-user/proxy_user (unit tests).
    pub label: String,
    pub path: PathBuf,
    /// The package's directory: cargo runs a package's tests there.
    pub dir: PathBuf,
    /// An integration test of xtask: the netns end-to-end tests.
    pub end_to_end: bool,
    /// An integration test binary (`tests/`), not a crate's unit tests.
    pub integration: bool,
}

/// Builds every test binary of `cmd` (a `cargo test ... --no-run` without the
/// message format) and returns them.
pub fn build(mut cmd: Command) -> Result<Vec<TestBinary>> {
    cmd.arg("--message-format=json-render-diagnostics")
        .stdout(Stdio::piped());
    println!("test: {}", crate::util::show(&cmd));
    let mut child = cmd.spawn().context("starting cargo test --no-run")?;
    let stdout = child.stdout.take().context("cargo's stdout")?;
    let mut binaries = Vec::new();
    for message in Message::parse_stream(std::io::BufReader::new(stdout)) {
        let Message::CompilerArtifact(artifact) = message.context("reading cargo's messages")?
        else {
            continue;
        };
        let Some(executable) = artifact.executable else {
            continue;
        };
        if !artifact.profile.test {
            continue;
        }
        let package = artifact
            .package_id
            .repr
            .rsplit('/')
            .next()
            .and_then(|tail| tail.split(['#', '@']).next())
            .unwrap_or("?")
            .to_owned();
        let dir = artifact
            .manifest_path
            .parent()
            .map(|p| p.as_std_path().to_path_buf())
            .context("a package manifest without a directory")?;
        let is_integration = artifact.target.kind.iter().any(|k| k.to_string() == "test");
        binaries.push(TestBinary {
            label: format!("{}/{}", dir_name(&dir, &package), artifact.target.name),
            path: executable.into_std_path_buf(),
            dir,
            end_to_end: is_integration && package == "xtask",
            integration: is_integration,
        });
    }
    let status = child.wait().context("waiting for cargo test --no-run")?;
    if !status.success() {
        bail!("building the tests failed ({status})");
    }
    Ok(binaries)
}

fn dir_name(dir: &Path, fallback: &str) -> String {
    dir.file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(fallback)
        .to_owned()
}

/// One process to run: a whole binary, or some tests of it.
#[derive(Debug, Clone)]
struct Job {
    name: String,
    binary: TestBinary,
    /// Empty: every test of the binary; else only these (`--exact`).
    tests: Vec<String>,
    alone: bool,
}

struct Finished {
    job: Job,
    took: Duration,
    counts: Counts,
    ok: bool,
    output: String,
}

/// What a run found.
#[derive(Debug, Default)]
pub struct Summary {
    pub counts: Counts,
    pub failed_jobs: Vec<String>,
    /// Every job with its duration, the longest first.
    pub durations: Vec<(String, Duration)>,
    pub wall: Duration,
}

/// The tests of `binary` as libtest lists them (`--ignored`: only those).
fn list(binary: &TestBinary, ignored: bool) -> Result<Vec<String>> {
    let mut cmd = Command::new(&binary.path);
    cmd.current_dir(&binary.dir)
        .args(["--list", "--format", "terse"]);
    if ignored {
        cmd.arg("--ignored");
    }
    let out = cmd
        .output()
        .with_context(|| format!("listing the tests of {}", binary.label))?;
    if !out.status.success() {
        bail!(
            "listing the tests of {} failed ({}): {}",
            binary.label,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(str::to_owned)
        .collect())
}

fn jobs(binaries: &[TestBinary]) -> Result<(Vec<Job>, u64)> {
    let mut jobs = Vec::new();
    let mut ignored = 0;
    for binary in binaries {
        if !binary.integration {
            jobs.push(Job {
                name: binary.label.clone(),
                binary: binary.clone(),
                tests: Vec::new(),
                alone: false,
            });
            continue;
        }
        let skipped = list(binary, true)?;
        ignored += skipped.len() as u64;
        let tests: Vec<String> = list(binary, false)?
            .into_iter()
            .filter(|test| !skipped.contains(test))
            .collect();
        if binary.end_to_end {
            jobs.extend(tests.into_iter().map(|test| Job {
                name: format!("{}::{test}", binary.label),
                binary: binary.clone(),
                alone: ALONE.iter().any(|a| test.contains(a)),
                tests: vec![test],
            }));
        } else {
            jobs.extend(by_module(tests).into_iter().map(|(module, tests)| Job {
                name: match module {
                    Some(module) => format!("{}::{module}", binary.label),
                    None => binary.label.clone(),
                },
                binary: binary.clone(),
                alone: false,
                tests,
            }));
        }
    }
    Ok((jobs, ignored))
}

/// Tests grouped by their first path segment (`datapath6::x` → `datapath6`);
/// tests at the binary's root form the group `None`.
fn by_module(tests: Vec<String>) -> BTreeMap<Option<String>, Vec<String>> {
    let mut groups: BTreeMap<Option<String>, Vec<String>> = BTreeMap::new();
    for test in tests {
        let module = test.split_once("::").map(|(module, _)| module.to_owned());
        groups.entry(module).or_default().push(test);
    }
    groups
}

fn durations_file() -> PathBuf {
    crate::util::repo_root().join("target/test-durations.tsv")
}

fn previous_durations() -> BTreeMap<String, f64> {
    let Ok(text) = std::fs::read_to_string(durations_file()) else {
        return BTreeMap::new();
    };
    text.lines()
        .filter_map(|l| l.split_once('\t'))
        .filter_map(|(secs, name)| Some((name.to_owned(), secs.parse().ok()?)))
        .collect()
}

/// Runs every test of `binaries`, `lanes` jobs at a time, with `envs` set.
pub fn run(binaries: &[TestBinary], lanes: usize, envs: &[(&str, &Path)]) -> Result<Summary> {
    let started = Instant::now();
    let (mut pending, ignored) = jobs(binaries)?;
    let previous = previous_durations();
    // Longest first; unknown jobs (new tests) count as long ones.
    let expected = |j: &Job| previous.get(&j.name).copied().unwrap_or(60.0);
    pending.sort_by(|a, b| expected(b).total_cmp(&expected(a)));
    println!(
        "test: {} jobs over {lanes} lanes ({} alone)",
        pending.len(),
        pending.iter().filter(|j| j.alone).count()
    );

    let lanes = lanes.max(1);
    let (tx, rx) = mpsc::channel::<Finished>();
    let mut running: Vec<Job> = Vec::new();
    let mut summary = Summary {
        counts: Counts {
            ignored,
            ..Counts::default()
        },
        ..Summary::default()
    };
    while !pending.is_empty() || !running.is_empty() {
        // Start what fits: a job that must run alone waits for an empty
        // machine, and nothing starts beside it.
        while running.len() < lanes && !running.iter().any(|j| j.alone) {
            let next = if running.is_empty() {
                pending.first().map(|_| 0)
            } else {
                pending.iter().position(|j| !j.alone)
            };
            let Some(at) = next else { break };
            let job = pending.remove(at);
            running.push(job.clone());
            spawn(job, envs, tx.clone());
        }
        let done = rx.recv().context("a test job vanished")?;
        running.retain(|j| j.name != done.job.name);
        report(&done);
        summary.counts.passed += done.counts.passed;
        summary.counts.failed += done.counts.failed;
        summary.counts.ignored += done.counts.ignored;
        if !done.ok {
            summary.failed_jobs.push(done.job.name.clone());
        }
        summary.durations.push((done.job.name.clone(), done.took));
    }
    summary
        .durations
        .sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    summary.wall = started.elapsed();
    let table: String = summary
        .durations
        .iter()
        .map(|(name, took)| format!("{:.2}\t{name}\n", took.as_secs_f64()))
        .collect();
    if let Err(e) = std::fs::write(durations_file(), table) {
        eprintln!("test: writing {}: {e}", durations_file().display());
    }
    Ok(summary)
}

fn spawn(job: Job, envs: &[(&str, &Path)], tx: mpsc::Sender<Finished>) {
    let envs: Vec<(String, PathBuf)> = envs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.to_path_buf()))
        .collect();
    std::thread::spawn(move || {
        let started = Instant::now();
        let result = run_job(&job, &envs);
        let took = started.elapsed();
        let finished = match result {
            Ok((ok, output)) => {
                let mut counts = Counts::default();
                for line in output.lines() {
                    add_result_line(&mut counts, line);
                }
                // A job whose filter matched nothing ran nothing: that is
                // not a pass.
                let ran = counts.passed + counts.failed > 0 || job.tests.is_empty();
                Finished {
                    ok: ok && ran,
                    counts,
                    took,
                    output: if ran {
                        output
                    } else {
                        format!("{output}\n(ran no test)")
                    },
                    job,
                }
            }
            Err(e) => Finished {
                ok: false,
                counts: Counts {
                    failed: 1,
                    ..Counts::default()
                },
                took,
                output: format!("{e:#}"),
                job,
            },
        };
        // The receiver outlives every job (it waits for them all).
        let _ = tx.send(finished);
    });
}

/// Runs one job to its end or its timeout; its stdout and stderr together.
fn run_job(job: &Job, envs: &[(String, PathBuf)]) -> Result<(bool, String)> {
    let mut cmd = Command::new(&job.binary.path);
    cmd.current_dir(&job.binary.dir)
        .env("CARGO_MANIFEST_DIR", &job.binary.dir)
        .args(["--test-threads=1"]);
    if !job.tests.is_empty() {
        cmd.arg("--exact").args(&job.tests);
    }
    for (key, value) in envs {
        cmd.env(key, value);
    }
    // One file for both streams keeps their order.
    let log = tempfile(&job.name)?;
    let file =
        std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    cmd.stdout(file.try_clone()?).stderr(file);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", job.binary.path.display()))?;
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if started.elapsed() > JOB_TIMEOUT {
            // The test's own cleanup does not run; the next run's
            // stale-sandbox sweep removes what it left.
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut output = String::new();
    std::fs::File::open(&log)
        .and_then(|mut f| f.read_to_string(&mut output))
        .with_context(|| format!("reading {}", log.display()))?;
    let _ = std::fs::remove_file(&log);
    match status {
        Some(status) => Ok((status.success(), output)),
        None => Ok((
            false,
            format!(
                "{output}\nstopped after {} s (the job timeout)",
                JOB_TIMEOUT.as_secs()
            ),
        )),
    }
}

/// A log file of its own for one job. Two jobs may carry one label (a
/// package's library and binary of the same name, both xtask/xtask), so each
/// file also gets the job's sequence number; a shared name let one job
/// remove the other's log before it was read.
fn tempfile(name: &str) -> Result<PathBuf> {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let dir = crate::util::repo_root().join("target/test-logs");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let file: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(dir.join(format!("{file}-{n}.log")))
}

fn report(done: &Finished) {
    let verdict = if done.ok { "ok    " } else { "FAILED" };
    println!(
        "test: {verdict} {:>6.1} s  {}",
        done.took.as_secs_f64(),
        done.job.name
    );
    if !done.ok {
        println!(
            "---- {} ----\n{}\n---- end of {} ----",
            done.job.name, done.output, done.job.name
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_result_lines() {
        let mut c = Counts::default();
        assert!(add_result_line(
            &mut c,
            "test result: ok. 5 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.00s"
        ));
        assert!(add_result_line(
            &mut c,
            "test result: FAILED. 2 passed; 3 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.2s"
        ));
        assert!(!add_result_line(&mut c, "running 5 tests"));
        assert_eq!(
            c,
            Counts {
                passed: 7,
                failed: 3,
                ignored: 1
            }
        );
    }

    fn binary(label: &str, end_to_end: bool) -> TestBinary {
        TestBinary {
            label: label.into(),
            path: PathBuf::from("/nonexistent"),
            dir: PathBuf::from("/"),
            end_to_end,
            integration: true,
        }
    }

    #[test]
    fn tests_group_by_their_first_module() {
        let groups = by_module(
            [
                "datapath::a",
                "datapath6::b",
                "datapath::c",
                "top",
                "datapath6::m::d",
            ]
            .map(String::from)
            .to_vec(),
        );
        let names: Vec<(Option<&str>, Vec<&str>)> = groups
            .iter()
            .map(|(m, t)| (m.as_deref(), t.iter().map(String::as_str).collect()))
            .collect();
        assert_eq!(
            names,
            [
                (None, vec!["top"]),
                (Some("datapath"), vec!["datapath::a", "datapath::c"]),
                (Some("datapath6"), vec!["datapath6::b", "datapath6::m::d"]),
            ]
        );
    }

    #[test]
    fn a_job_that_runs_no_test_fails() {
        let job = Job {
            name: "x::missing".into(),
            binary: binary("x", true),
            tests: vec!["missing".into()],
            alone: false,
        };
        // /bin/true exits 0 and prints no result line.
        let mut job = job;
        job.binary.path = PathBuf::from("/bin/true");
        let (tx, rx) = mpsc::channel();
        spawn(job, &[], tx);
        let done = rx.recv().expect("a result");
        assert!(!done.ok, "{}", done.output);
        assert!(done.output.contains("ran no test"));
    }
}
