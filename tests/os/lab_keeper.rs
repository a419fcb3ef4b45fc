//! The lab's keeper (`tests/lab/keeper.py`) when its test ends without taking the lab down
//! (the test binary killed, a panic past its cleanup): what it adopted is ended with it, so
//! no lab outlives its test and shows up in the next test's discovery.

use std::time::{Duration, Instant};
use wedgewatch_testkit::lab::{self, Keeper};

/// A process's state letter and parent, from its stat (None: gone).
fn state_and_parent(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut after = stat.get(stat.rfind(')')? + 2..)?.split_whitespace();
    let state = after.next()?.chars().next()?;
    Some((state, after.next()?.parse().ok()?))
}

#[test]
fn a_keeper_left_with_live_components_ends_them_when_its_test_ends() {
    let mut keeper = Keeper::start(&lab::repo_root().join("tests/lab")).expect("keeper");
    // A component as `lab.py up` starts one: in a session of its own, its starter gone.
    let start = "import subprocess; \
                 p = subprocess.Popen(['sleep', '300'], start_new_session=True); print(p.pid)";
    let argv = ["python3", "-c", start].map(String::from);
    let out = keeper.run(&argv).expect("the component started");
    let pid: u32 = out.trim().parse().expect("its pid");
    let keeper_pid = keeper.pid();
    assert_eq!(
        state_and_parent(pid).map(|(_, parent)| parent),
        Some(keeper_pid),
        "adopted by the keeper"
    );

    // The test ends: its keeper's stdin closes (the testkit kills the keeper 5 s on).
    drop(keeper);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match state_and_parent(pid) {
            None | Some(('Z', _)) => break,
            Some(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Some(s) => panic!("the component outlived its keeper: {s:?}"),
        }
    }
}
