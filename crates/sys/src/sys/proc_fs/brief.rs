//! The few `stat` fields discovery reads of every pid on every pass: one `openat` relative to
//! the procfs root, one `read` into a stack buffer, five fields parsed, no allocation (unlike
//! [`ProcFs::stat`]; the cost behind it: docs/performance-log.md).

use super::{ProcFs, ProcFsError, Result};
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::Mode;
use std::os::fd::OwnedFd;

/// Linux's comm is at most 15 bytes (TASK_COMM_LEN - 1); kept lossily decoded, so up to 3
/// bytes per byte read.
const COMM_CAP: usize = 48;
/// A `stat` line is a few hundred bytes; a longer one is not a stat line.
const STAT_BUF: usize = 4096;

/// A process's `comm`, stored inline (no allocation), decoded lossily from its bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Comm {
    len: u8,
    bytes: [u8; COMM_CAP],
}

impl Comm {
    /// `raw` decoded lossily, cut at a character boundary to fit.
    pub fn new(raw: &[u8]) -> Comm {
        let mut c = Comm {
            len: 0,
            bytes: [0; COMM_CAP],
        };
        for ch in String::from_utf8_lossy(raw).chars() {
            let mut enc = [0u8; 4];
            let s = ch.encode_utf8(&mut enc).as_bytes();
            let at = c.len as usize;
            if at + s.len() > COMM_CAP {
                break;
            }
            c.bytes[at..at + s.len()].copy_from_slice(s);
            c.len += s.len() as u8;
        }
        c
    }

    pub fn as_str(&self) -> &str {
        // Built from whole characters of a `str` only.
        std::str::from_utf8(&self.bytes[..self.len as usize]).unwrap_or_default()
    }
}

impl Default for Comm {
    fn default() -> Self {
        Comm::new(b"")
    }
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

impl std::fmt::Display for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a rediscovery pass needs of a process's `stat` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatBrief {
    pub ppid: i32,
    pub comm: Comm,
    /// Start time, in clock ticks after boot.
    pub starttime: u64,
    /// start_code and start_stack: moved by every exec (address space randomization).
    pub startcode: u64,
    pub startstack: u64,
    /// The kernel marks the task a kernel thread (`PF_KTHREAD` in `flags`): exact, unlike
    /// "parent is pid 2", which in a pid namespace is any process's.
    pub kthread: bool,
}

/// The procfs root, opened once: [`StatReader::brief`] opens `<pid>/stat` relative to it.
#[derive(Debug)]
pub struct StatReader {
    proc: ProcFs,
    root: OwnedFd,
}

impl ProcFs {
    /// A reader of brief `stat` lines (opens the root directory).
    pub fn stat_reader(&self) -> Result<StatReader> {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let root = nix::fcntl::open(self.root(), flags, Mode::empty())
            .map_err(|e| ProcFsError::from_io(self.root(), e.into()))?;
        Ok(StatReader {
            proc: self.clone(),
            root,
        })
    }
}

impl StatReader {
    /// The brief `stat` of `pid`: one open (no link followed), one read, five fields.
    pub fn brief(&self, pid: i32) -> Result<StatBrief> {
        let mut name = [0u8; 32];
        let name = stat_name(pid, &mut name);
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let err =
            |e: nix::errno::Errno| ProcFsError::from_io(&self.proc.path(pid, "stat"), e.into());
        let fd = openat(&self.root, name, flags, Mode::empty()).map_err(err)?;
        let mut buf = [0u8; STAT_BUF];
        let mut len = 0;
        while len < buf.len() {
            match nix::unistd::read(&fd, &mut buf[len..]) {
                Ok(0) => break,
                Ok(n) => len += n,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(err(e)),
            }
        }
        parse_brief(&buf[..len]).ok_or_else(|| ProcFsError::Malformed {
            path: self.proc.path(pid, "stat"),
            what: "not a stat line".into(),
        })
    }
}

/// `<pid>/stat` into `buf`, without allocating.
fn stat_name(pid: i32, buf: &mut [u8; 32]) -> &[u8] {
    let mut digits = itoa::Buffer::new();
    let d = digits.format(pid.unsigned_abs()).as_bytes();
    buf[..d.len()].copy_from_slice(d);
    buf[d.len()..d.len() + 5].copy_from_slice(b"/stat");
    &buf[..d.len() + 5]
}

/// Fields counted after the comm's closing parenthesis (state is 0, ppid 1).
const PPID: usize = 1;
const FLAGS: usize = 6;
const STARTTIME: usize = 19;
const STARTCODE: usize = 23;
const STARTSTACK: usize = 25;
/// `PF_KTHREAD` of `include/linux/sched.h`.
const PF_KTHREAD: u64 = 0x0020_0000;

/// ppid, comm, flags, start time and the exec mark of a `stat` line; None when it is not one. The
/// comm is between the first `(` and the last `)`: it may itself hold parentheses.
pub fn parse_brief(line: &[u8]) -> Option<StatBrief> {
    let open = line.iter().position(|&b| b == b'(')?;
    let close = line.iter().rposition(|&b| b == b')')?;
    if close < open {
        return None;
    }
    let comm = Comm::new(&line[open + 1..close]);
    let rest = line.get(close + 1..)?;
    let mut out = StatBrief {
        ppid: 0,
        comm,
        starttime: 0,
        startcode: 0,
        startstack: 0,
        kthread: false,
    };
    let mut seen = 0;
    for (i, field) in rest
        .split(|b| b.is_ascii_whitespace())
        .filter(|f| !f.is_empty())
        .enumerate()
        .take(STARTSTACK + 1)
    {
        match i {
            PPID => out.ppid = i32::try_from(number(field)?).ok()?,
            FLAGS => out.kthread = number(field)? & PF_KTHREAD != 0,
            STARTTIME => out.starttime = number(field)?,
            STARTCODE => out.startcode = number(field)?,
            STARTSTACK => out.startstack = number(field)?,
            _ => {}
        }
        seen = i;
    }
    (seen == STARTSTACK).then_some(out)
}

/// A decimal field (all of stat's used here are non-negative).
fn number(field: &[u8]) -> Option<u64> {
    if field.is_empty() || field.len() > 20 {
        return None;
    }
    field.iter().try_fold(0u64, |acc, &b| {
        let d = b.checked_sub(b'0').filter(|d| *d < 10)?;
        acc.checked_mul(10)?.checked_add(u64::from(d))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &[u8] =
        b"4242 (sglang::sch (x)) S 4200 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 \
20 0 1 0 98765 204800000 12800 18446744073709551615 94000 95000 140000 0 0 0 0 16781312 \
134234626 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n";

    #[test]
    fn five_fields_of_a_stat_line() {
        let b = parse_brief(LINE).expect("parsed");
        assert_eq!(b.ppid, 4200);
        assert_eq!(b.comm.as_str(), "sglang::sch (x)");
        assert_eq!(b.starttime, 98765);
        assert_eq!((b.startcode, b.startstack), (94000, 140000));
        assert!(!b.kthread, "flags 4194560 are a user process's");
        let kworker = String::from_utf8_lossy(LINE).replace(" 4194560 ", " 69238880 ");
        assert!(parse_brief(kworker.as_bytes()).expect("parsed").kthread);
    }

    #[test]
    fn not_stat_lines() {
        assert!(parse_brief(b"").is_none());
        assert!(parse_brief(b"12 (x) S 1 2").is_none(), "cut short");
        assert!(parse_brief(b"12 )x( S").is_none());
        let bad = String::from_utf8_lossy(LINE).replace("98765", "9x765");
        assert!(parse_brief(bad.as_bytes()).is_none(), "not a number");
    }

    #[test]
    fn comm_is_inline_and_lossy() {
        assert_eq!(Comm::new(b"python3").as_str(), "python3");
        assert_eq!(Comm::new(b"ab\xffcd").as_str(), "ab\u{fffd}cd");
        let long = [0xffu8; 40];
        assert!(Comm::new(&long).as_str().len() <= COMM_CAP);
    }

    #[test]
    fn reads_our_own_stat_like_the_procfs_crate() {
        let proc = ProcFs::real();
        let pid = std::process::id() as i32;
        let full = proc.stat(pid).expect("stat");
        let brief = proc.stat_reader().expect("root").brief(pid).expect("brief");
        assert_eq!(brief.ppid, full.ppid);
        assert_eq!(brief.comm.as_str(), full.comm);
        assert_eq!(brief.starttime, full.starttime);
        assert!(!brief.kthread);
        // pid 2 is kthreadd outside a pid namespace (in one it is anyone's)
        let two = proc.stat_reader().expect("root").brief(2).ok();
        if let Some(b) = two.filter(|b| b.comm.as_str() == "kthreadd") {
            assert!(b.kthread, "{b:?}");
        }
        assert_eq!(
            (brief.startcode, brief.startstack),
            (full.startcode, full.startstack)
        );
        let gone = proc.stat_reader().expect("root").brief(i32::MAX);
        assert!(gone.is_err_and(|e| e.is_vanished()));
    }

    #[test]
    fn stat_names() {
        let mut b = [0u8; 32];
        assert_eq!(stat_name(0, &mut b), b"0/stat");
        assert_eq!(stat_name(4_194_304, &mut b), b"4194304/stat");
    }
}
