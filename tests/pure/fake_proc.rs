//! A fake `/proc` tree for discovery's tests: each process's `stat`, `comm`, `cmdline` and
//! `environ`, written under a temporary root.

use std::path::Path;

/// One fake process: its `stat` (start time, exec mark), `comm` and `cmdline`.
pub struct P<'a> {
    pub pid: i32,
    pub ppid: i32,
    pub comm: &'a str,
    pub start: u64,
    /// stat's start_code (an exec moves it).
    pub code: u64,
    pub argv: &'a [&'a str],
}

pub fn write(root: &Path, p: &P) {
    let dir = root.join(p.pid.to_string());
    std::fs::create_dir_all(&dir).unwrap();
    let stat = format!(
        "{} ({}) S {} {} {} 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0 {} 204800000 12800 \
         18446744073709551615 {} {} 140000 0 0 0 0 16781312 134234626 0 0 0 17 1 0 0 0 0 0 0 0 \
         0 0 0 0 0 0\n",
        p.pid,
        p.comm,
        p.ppid,
        p.pid,
        p.pid,
        p.start,
        p.code,
        p.code + 1000
    );
    std::fs::write(dir.join("stat"), stat).unwrap();
    std::fs::write(dir.join("comm"), format!("{}\n", p.comm)).unwrap();
    let mut cmdline: Vec<u8> = Vec::new();
    for a in p.argv {
        cmdline.extend_from_slice(a.as_bytes());
        cmdline.push(0);
    }
    std::fs::write(dir.join("cmdline"), cmdline).unwrap();
    let environ = b"CUDA_VISIBLE_DEVICES=3\0VIRTUAL_ENV=/opt/venv\0API_TOKEN=not-kept\0";
    std::fs::write(dir.join("environ"), environ).unwrap();
}

/// A process started at 5000 ticks with the first exec mark.
pub fn base<'a>(pid: i32, ppid: i32, comm: &'a str, argv: &'a [&'a str]) -> P<'a> {
    P {
        pid,
        ppid,
        comm,
        start: 5000,
        code: 4096,
        argv,
    }
}
