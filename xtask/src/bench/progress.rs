//! The run's progress lines: `bench [3/17 0:42] …` for each step, with the
//! step count the run announced ([`set_steps`]), and indented notes of
//! what a step measured.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

static STEP: AtomicUsize = AtomicUsize::new(0);
static TOTAL: AtomicUsize = AtomicUsize::new(0);
static STARTED: OnceLock<Instant> = OnceLock::new();

/// Starts the clock and sets the number of steps the run will print.
pub fn set_steps(total: usize) {
    STARTED.get_or_init(Instant::now);
    TOTAL.store(total, Ordering::SeqCst);
}

/// The next step's line.
pub fn progress(msg: &str) {
    let step = STEP.fetch_add(1, Ordering::SeqCst) + 1;
    let total = TOTAL.load(Ordering::SeqCst);
    let secs = STARTED.get_or_init(Instant::now).elapsed().as_secs();
    println!(
        "bench [{step}/{total} {}:{:02}] {msg}",
        secs / 60,
        secs % 60
    );
}

/// A figure or a remark within the current step.
pub fn note(msg: &str) {
    println!("bench        {msg}");
}
