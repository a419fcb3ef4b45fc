//! TCP sockets through netlink sock_diag with tcp_info, mapped to processes by inode.
