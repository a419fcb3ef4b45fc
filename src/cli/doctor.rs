//! `wedgewatch doctor`: what can be sampled here and why not. Exit 0 when sampling can
//! work (warnings included), 3 when it cannot at all (no procfs).

use super::exit::code;
use super::options::Targets;
use clap::Args;
use wedgewatch::doctor;

const EXAMPLES: &str = "\
Examples:
  wedgewatch doctor
  wedgewatch doctor --py-spy /opt/venv/bin/py-spy --url http://127.0.0.1:30000
  wedgewatch doctor --json | jq '.checks[] | select(.status != \"ok\")'

Exit status: 0 sampling works here (warnings say what is missing), 2 usage error,
3 nothing can be sampled here.";

#[derive(Debug, Args)]
#[command(after_help = EXAMPLES)]
pub struct DoctorArgs {
    /// Print the checks as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub targets: Targets,
}

pub fn run(top: Targets, a: DoctorArgs) -> anyhow::Result<i32> {
    let t = Targets::merge(top, a.targets);
    t.check_pids()?;
    let probes = t.probes()?;
    let report = doctor::run(
        &probes,
        &doctor::DoctorOptions {
            proc_root: t.proc_root(),
            nvml_lib: t.nvml_lib(),
            py_spy: t.py_spy.clone(),
            discover: t.discover_options(),
        },
    );
    if a.json {
        let mut v = serde_json::json!({
            "schema": "wedgewatch.doctor/1",
            "fatal": report.fatal(),
            "checks": report.checks,
        });
        // doctor quotes host facts (paths, process names): no live control sequences
        wedgewatch::redact::control::json(&mut v);
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        // the same for the text
        print!("{}", wedgewatch::redact::control::text(&report.render()));
    }
    Ok(if report.fatal() {
        code::UNSAMPLED
    } else {
        code::OK
    })
}
