//! The OS-access layer: everything wedgewatch asks of the kernel and the network. `/proc`
//! ([`ProcFs`], any root, bounded, no links followed), [`sock_diag`], the one [`http`] client,
//! [`cgroup`] names, [`exec`], [`node`] identity and clocks, [`netns`] connections, [`addr`] (a
//! [`Url`]'s endpoint). Nothing here knows a component, a profile or a finding.

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
