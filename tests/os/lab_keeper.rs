//! The lab's keeper (`tests/lab/keeper.py`) when its test ends without taking the lab down
//! (the test binary killed, a panic past its cleanup): what it adopted is ended with it, so
//! no lab outlives its test and shows up in the next test's discovery.

use std::time::{Duration, Instant};
use wedgewatch::sys::ProcFs;
use wedgewatch_testkit::lab::{self, Keeper};

/// A process's state letter and parent (None: gone).
fn state_and_parent(pid: i32) -> Option<(char, i32)> {
    let stat = ProcFs::real().stat(pid).ok()?;
    Some((stat.state, stat.ppid))
}

#[test]
fn a_keeper_left_with_live_components_ends_them_when_its_test_ends() {
    let mut keeper = Keeper::start(&lab::repo_root().join("tests/lab")).expect("keeper");
    // A component as `lab.py up` starts one: in a session of its own, its starter gone.
    let start = "import subprocess; \
                 p = subprocess.Popen(['sleep', '300'], start_new_session=True); print(p.pid)";
    let argv = ["python3", "-c", start].map(String::from);
    let out = keeper.run(&argv).expect("the component started");
    let pid: i32 = out.trim().parse().expect("its pid");
    let keeper_pid = i32::try_from(keeper.pid()).expect("a pid");
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
