//! The OS-access layer: everything wedgewatch asks of the kernel and the network, above
//! `model` and below `sources`.
//!
//! - [`ProcFs`] (`proc_fs`): every `/proc` read, with a configurable root (fixture trees in
//!   tests), bounded and without following links (built on [`crate::safe_fs`]);
//!   `proc_net` parses its `net/tcp{,6}` tables;
//! - [`sock_diag`]: the [`SockDiag`] trait, its netlink implementation (per network
//!   namespace) and a fake for tests;
//! - [`http`]: the one HTTP client (timed, size-capped GET; connections may be made by a
//!   supplied connector);
//! - [`cgroup`]: the container a process runs in, named from its cgroups;
//! - [`exec`]: whether a path is a program we could run (py-spy);
//! - [`node`]: which node this is (hostname, machine-id, boot-id, addresses) and its clocks;
//! - [`netns`]: connections opened inside another process's network namespace (a
//!   container's), as a [`http::Connector`];
//! - [`alloc`]: the binary's allocator (jemalloc) and its options (the daemon's CPU and RSS);
//! - [`addr`]: the one `host:port` splitter and the endpoint of a [`Url`] (the one URL type,
//!   from the `url` crate).
//!
//! Nothing here knows a component, a profile or a finding.

pub mod addr;
pub mod cgroup;
pub mod exec;
pub mod http;
pub mod netns;
pub mod node;
pub mod proc_fs;
pub mod proc_net;
pub mod sock_diag;

pub use proc_fs::{
    CgroupEntry, Comm, FdScan, MappedFiles, PidEntry, ProcFs, ProcFsError, StatBrief, StatReader,
    MAX_MAPPED_FILES, PROC_ROOT,
};
pub use sock_diag::{Dump, NetlinkSockDiag, SockDiag, SockDiagError};
pub use url::Url;
