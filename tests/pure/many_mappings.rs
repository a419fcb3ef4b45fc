//! A process mapping ~60k files (issue 34, item 16): reading what it maps is linear and
//! bounded, so its versions read finishes within its deadline, says what it left out, and
//! is therefore kept instead of being retried (and left running) on every pass.

use wedgewatch_testkit::ready_python;

use ready_python::ReadyPython;
use std::collections::BTreeMap;
use wedgewatch::sources::versions;
use wedgewatch::sys::{ProcFs, MAX_MAPPED_FILES};

/// Under `vm.max_map_count` (65530) with room for the interpreter's own mappings.
const FILES: usize = 60_000;

/// A python process that maps `FILES` distinct one-byte files of `dir`, killed on drop.
fn start_mapper(dir: &std::path::Path) -> ReadyPython {
    // libc's mmap, not Python's (which keeps a duplicate fd open per mapping)
    let code = "import ctypes, os, sys, time\n\
            libc = ctypes.CDLL(None, use_errno=True)\n\
            libc.mmap.restype = ctypes.c_void_p\n\
            libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]\n\
            d, n = sys.argv[1], int(sys.argv[2])\n\
            for i in range(n):\n\
            \x20   p = os.path.join(d, 'lib%06d.so' % i)\n\
            \x20   with open(p, 'wb') as f: f.write(b'x')\n\
            \x20   fd = os.open(p, os.O_RDONLY)\n\
            \x20   if libc.mmap(None, 1, 1, 2, fd, 0) in (None, ctypes.c_void_p(-1).value): sys.exit('mmap failed')\n\
            \x20   os.close(fd)\n\
            print('ready', flush=True)\n\
            time.sleep(600)\n";
    let files = FILES.to_string();
    ReadyPython::start(code, &[dir.as_os_str(), files.as_ref()], "map its files")
}

#[test]
fn a_process_mapping_60k_files_is_read_within_the_deadline_and_cut_with_a_reason() {
    let tmp = tempfile::tempdir().expect("tmp");
    let m = start_mapper(tmp.path());
    let pid = m.pid() as i32;
    let proc = ProcFs::real();
    let mapped = proc.mapped_files(pid).expect("maps");
    assert_eq!(mapped.files.len(), MAX_MAPPED_FILES);
    let why = mapped.cut.expect("the cut is said");
    assert!(why.contains("mapped files"), "{why}");
    let argv = vec!["python3".to_string()];
    let r = versions::read(&proc, pid, &argv, &BTreeMap::new(), &["sglang".to_string()]);
    assert!(
        r.complete,
        "timed out: it would be read again every pass: {r:?}"
    );
    assert!(r.cut.is_some(), "{r:?}");
}
