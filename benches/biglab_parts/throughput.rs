//! Section 1 of the biglab bench: the harness's throughput with the daemon and without it,
//! side by side in ONE harness run.
//!
//! Why one run, cut into short blocks: on 2 cores the lab's throughput wanders. Measured
//! with no daemon at all (one 600 s run, 200 streams), the requests completed in a 60 s block
//! differ by 1.9 % from the next block's (standard deviation): a drift, not only noise that
//! averages away, and a fresh harness per block added its own start (200 streams connecting
//! at once) on top. The daemon's cost is about 1 % of the machine, so two pairs of 60 s
//! blocks, as before, read anywhere from 0.96 to 1.03. Now one harness runs throughout and
//! counts aloud every second; the bench stops (SIGSTOP) and continues (SIGCONT) the daemon
//! on the harness's own clock, in many short blocks ordered without/with, with/without, ...
//! (the daemon changes state every other block, and a steady drift cancels within two
//! pairs). The ratio is the pooled one: the mean rate of the blocks with the daemon over the
//! mean of those without; its standard error comes from the pairs' spread. The goal is
//! judged on chunks streamed a second, which flow evenly (neighbouring 10 s blocks differ by
//! 1.2 % with no daemon), and requests a second are printed beside it (see [`Outcome`]).

use crate::daemon_proc::{loadavg, Daemon};
use crate::lab::{Lab, Progress};
use crate::proc_stat::live_children;

/// How the section runs.
pub struct Plan {
    pub streams: u32,
    pub max_tokens: u32,
    /// The daemon runs under the load this long first, not counted.
    pub warm_secs: f64,
    pub block_secs: f64,
    pub pairs: usize,
}

/// One throughput measure, with the daemon and without.
pub struct Ratio {
    /// Mean rate with the daemon over mean rate without.
    pub ratio: f64,
    /// The pooled ratio's standard error, from the pairs' own ratios.
    pub std_error: f64,
    pub with_rate: f64,
    pub without_rate: f64,
    pub pair_ratios: Vec<f64>,
}

/// What it measured: chunks streamed a second (the goal's measure) and requests completed a
/// second. Both count the same work; requests complete in beats (all 200 agents' requests
/// take one reply's time), so a block's count depends on where its ends fall in a beat: 2-3 %
/// between neighbouring 10-20 s blocks with no daemon at all, against 1.2 % for chunks.
pub struct Outcome {
    pub chunks: Ratio,
    pub requests: Ratio,
    pub bad_requests: u64,
}

/// Whether the daemon runs through block `k`: pair p is [without, with] for an even p,
/// [with, without] for an odd one.
fn running_in(k: usize) -> bool {
    let (pair, first) = (k / 2, k.is_multiple_of(2));
    pair.is_multiple_of(2) != first
}

/// Runs the section on `d` (started, running); leaves it running. `None` (with the reason
/// printed) when the harness or the signals failed.
pub fn measure(lab: &Lab, d: &Daemon, plan: &Plan) -> Option<Outcome> {
    let blocks = 2 * plan.pairs;
    let secs = plan.warm_secs + blocks as f64 * plan.block_secs + 2.0;
    let mut run = lab
        .steady_load_progress(plan.streams, secs, plan.max_tokens, 1.0)
        .map_err(|e| println!("  harness: {e}"))
        .ok()?;
    let mut lines = run.progress()?;
    let mut marks: Vec<Progress> = Vec::with_capacity(blocks + 1);
    while marks.len() <= blocks {
        let due = plan.warm_secs + marks.len() as f64 * plan.block_secs;
        let Some(p) = lines.by_ref().find(|p| p.t >= due - 0.01) else {
            println!(
                "  the harness stopped counting after {} blocks",
                marks.len()
            );
            let _ = pause(d, false);
            return None;
        };
        if marks.is_empty() {
            println!(
                "  daemon warmed for {:.0} s under the load ({:.2} req/s, not counted)",
                p.t,
                p.completed as f64 / p.t
            );
        }
        marks.push(p);
        if marks.len() <= blocks && !pause(d, !running_in(marks.len() - 1)) {
            println!("  could not stop or continue the daemon: no throughput figure");
            let _ = pause(d, false); // a stopped daemon would only go at SIGKILL
            return None;
        }
    }
    let _ = pause(d, false);
    // Read on to the end: a closed pipe would fail the harness's last progress writes.
    lines.for_each(drop);
    let report = run.wait().map_err(|e| println!("  harness: {e}")).ok()?;
    let bad = ["hung_requests", "errored_requests"]
        .iter()
        .map(|k| report[*k].as_u64().unwrap_or(0))
        .sum();
    Some(outcome(&marks, bad))
}

fn outcome(marks: &[Progress], bad_requests: u64) -> Outcome {
    Outcome {
        chunks: ratio(marks, |p| p.chunks),
        requests: ratio(marks, |p| p.completed),
        bad_requests,
    }
}

fn ratio(marks: &[Progress], count: impl Fn(&Progress) -> u64) -> Ratio {
    let rates: Vec<f64> = marks
        .windows(2)
        .map(|w| count(&w[1]).saturating_sub(count(&w[0])) as f64 / (w[1].t - w[0].t))
        .collect();
    let mean_of = |on: bool| {
        let v: Vec<f64> = (0..rates.len())
            .filter(|&k| running_in(k) == on)
            .map(|k| rates[k])
            .collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    };
    let (with_rate, without_rate) = (mean_of(true), mean_of(false));
    let pair_ratios: Vec<f64> = (0..rates.len() / 2)
        .map(|p| {
            let (with, without) = if running_in(2 * p) {
                (2 * p, 2 * p + 1)
            } else {
                (2 * p + 1, 2 * p)
            };
            rates[with] / rates[without]
        })
        .collect();
    let n = pair_ratios.len() as f64;
    let mean = pair_ratios.iter().sum::<f64>() / n;
    let var = pair_ratios.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1.0);
    Ratio {
        ratio: with_rate / without_rate,
        std_error: (var / n).sqrt(),
        with_rate,
        without_rate,
        pair_ratios,
    }
}

/// Prints the outcome; returns whether the goal (chunks a second >= 0.98) is met.
pub fn report(o: &Outcome, plan: &Plan) -> bool {
    let per_line = 10;
    for (i, chunk) in o.chunks.pair_ratios.chunks(per_line).enumerate() {
        let list: Vec<String> = chunk.iter().map(|r| format!("{r:.3}")).collect();
        println!(
            "  pairs {:2}-{:2}, chunks/s with/without: {}",
            i * per_line,
            i * per_line + chunk.len() - 1,
            list.join(" ")
        );
    }
    println!(
        "  {} pairs of {:.0} s blocks ({} hung or failed requests), load {}",
        o.chunks.pair_ratios.len(),
        plan.block_secs,
        o.bad_requests,
        loadavg()
    );
    line("requests/s", &o.requests, "(printed, not judged)");
    let ok = o.chunks.ratio >= 0.98;
    line(
        "chunks/s",
        &o.chunks,
        &format!("goal >= 0.98 {}", if ok { "OK" } else { "MISSED" }),
    );
    ok
}

fn line(what: &str, r: &Ratio, tail: &str) {
    println!(
        "throughput with/without daemon, {what}: {:.1} / {:.1} = {:.3} (standard error {:.3}) {tail}",
        r.with_rate, r.without_rate, r.ratio, r.std_error
    );
}

/// Stops (SIGSTOP) or continues (SIGCONT) the daemon and its live children: a stopped daemon
/// takes no CPU, so a block without it needs no fresh daemon and a block with it sees one
/// past its start. Its children too: a py-spy dump begun in a block with the daemon would
/// otherwise run on into the next block without it, and its cost count there. (py-spy runs
/// `--nonblocking`: stopping it does not stop the process it reads.) The daemon is stopped
/// first, so it starts no child meanwhile, and continued last.
pub fn pause(d: &Daemon, stopped: bool) -> bool {
    use nix::sys::signal::{kill, Signal};
    let signal = |pid: u32, sig| kill(nix::unistd::Pid::from_raw(pid as i32), sig).is_ok();
    if stopped {
        let ok = signal(d.pid(), Signal::SIGSTOP);
        for c in live_children(d.pid()) {
            signal(c, Signal::SIGSTOP);
        }
        ok
    } else {
        for c in live_children(d.pid()) {
            signal(c, Signal::SIGCONT);
        }
        signal(d.pid(), Signal::SIGCONT)
    }
}
