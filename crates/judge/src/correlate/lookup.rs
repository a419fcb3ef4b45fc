//! The topology's answers a socket table asks once per socket (owner of a pid, listener on a
//! port in a namespace, whether an address is a listen address), indexed once per table.

use super::FastMap;
use crate::model::addr::{parse_socket_addr, port_of, split_host_port};
use crate::model::{ChannelKind, Component, Topology};
use std::net::IpAddr;

/// The host of a listen address: an IP, or a name (which cannot be told apart from any
/// address).
#[derive(Debug, Clone, Copy)]
enum ListenHost {
    Ip(IpAddr),
    Name,
}

/// Component indices (into the topology's `components`) by pid and by listen port.
#[derive(Debug, Default)]
pub(super) struct Lookup {
    /// As `Topology::component_of_pid`: the deepest role, the last of equals.
    by_pid: FastMap<i32, usize>,
    /// As `Topology::component_listening_in`: the first component listening there.
    by_port: FastMap<(Option<u64>, u16), usize>,
    /// Each component's listen addresses, parsed.
    listen: Vec<Vec<(ListenHost, u16)>>,
    /// The channels among them (`Component::channels`), by component index and port.
    channels: FastMap<(usize, u16), ChannelKind>,
}

impl Lookup {
    pub(super) fn new(topo: &Topology) -> Lookup {
        let mut l = Lookup::default();
        for (i, c) in topo.components.iter().enumerate() {
            for &pid in &c.pids {
                let deeper = |j: &usize| topo.components[*j].role.depth() <= c.role.depth();
                match l.by_pid.get(&pid) {
                    Some(j) if !deeper(j) => {}
                    _ => {
                        l.by_pid.insert(pid, i);
                    }
                }
            }
            for p in c.listen_ports() {
                l.by_port.entry((c.netns, p)).or_insert(i);
            }
            l.listen.push(listen_addrs(c));
            for ch in &c.channels {
                if let Some(p) = port_of(&ch.addr) {
                    l.channels.insert((i, p), ch.kind);
                }
            }
        }
        l
    }

    /// What component `i`'s listen port `port` is when it is a channel, not a serving port.
    pub(super) fn channel_at(&self, i: usize, port: u16) -> Option<ChannelKind> {
        self.channels.get(&(i, port)).copied()
    }

    /// The component owning `pid`.
    pub(super) fn of_pid(&self, pid: i32) -> Option<usize> {
        self.by_pid.get(&pid).copied()
    }

    /// The component listening on `port` in namespace `netns`.
    pub(super) fn listening_in(&self, netns: Option<u64>, port: u16) -> Option<usize> {
        self.by_port.get(&(netns, port)).copied()
    }

    /// Whether component `i` listens at `local` (`host:port`): a listen address with its
    /// port and an equivalent or wildcard host; a host that is not an address (a name)
    /// cannot be told apart, nor can a `local` that is not an address.
    pub(super) fn listens_at(&self, i: usize, local: &str) -> bool {
        let Some((ip, port)) = parse_socket_addr(local) else {
            return true;
        };
        self.listen.get(i).is_some_and(|ls| {
            ls.iter().any(|(host, p)| {
                *p == port
                    && match host {
                        ListenHost::Ip(h) => {
                            *h == ip || h.is_unspecified() || (h.is_loopback() && ip.is_loopback())
                        }
                        ListenHost::Name => true,
                    }
            })
        })
    }
}

fn listen_addrs(c: &Component) -> Vec<(ListenHost, u16)> {
    c.listen
        .iter()
        .filter_map(|l| split_host_port(l))
        .map(|(host, p)| match host.parse::<IpAddr>() {
            Ok(h) => (ListenHost::Ip(h), p),
            Err(_) => (ListenHost::Name, p),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Role;

    /// What `sockets.rs` asked of every component for every socket before the lookup.
    fn listens_at_by_scan(c: &Component, local: &str) -> bool {
        let Some((ip, port)) = parse_socket_addr(local) else {
            return true;
        };
        c.listen.iter().any(|l| match split_host_port(l) {
            Some((host, p)) if p == port => match host.parse::<IpAddr>() {
                Ok(h) => h == ip || h.is_unspecified() || (h.is_loopback() && ip.is_loopback()),
                Err(_) => true,
            },
            _ => false,
        })
    }

    fn topology() -> Topology {
        let comp = |id: &str, role, pids: &[i32], listen: &[&str], netns| {
            let mut c = Component::new(id, role, "sglang");
            c.pids = pids.to_vec();
            c.listen = listen.iter().map(|s| s.to_string()).collect();
            c.netns = netns;
            c
        };
        Topology {
            components: vec![
                comp("proxy", Role::Proxy, &[10], &["0.0.0.0:8080"], None),
                comp(
                    "router",
                    Role::Router,
                    &[20, 21],
                    &["127.0.0.1:30000"],
                    None,
                ),
                // A scheduler shares its engine's pid list: the deeper role owns the pid.
                comp(
                    "decode",
                    Role::Decode,
                    &[30, 31],
                    &["[::1]:31000", "127.0.0.1:31001"],
                    None,
                ),
                comp("sched", Role::Scheduler, &[31], &[], None),
                comp("sched2", Role::Scheduler, &[31], &[], None),
                // Same port, another namespace; and a second listener on a taken port.
                comp("pod", Role::Engine, &[40], &["10.0.0.5:30000"], Some(7)),
                comp(
                    "late",
                    Role::Engine,
                    &[50],
                    &["127.0.0.2:30000", "name.local:32000"],
                    None,
                ),
                comp("bad", Role::Other, &[60], &["nonsense", ":x"], None),
            ],
            edges: vec![],
        }
    }

    #[test]
    fn answers_what_scanning_the_components_answers() {
        let topo = topology();
        let l = Lookup::new(&topo);
        let id = |i: Option<usize>| i.map(|i| topo.components[i].id.clone());
        for pid in 0..70 {
            assert_eq!(
                id(l.of_pid(pid)),
                topo.component_of_pid(pid).map(|c| c.id.clone()),
                "pid {pid}"
            );
        }
        for netns in [None, Some(7), Some(8)] {
            for port in [8080, 30000, 31000, 31001, 32000, 1] {
                assert_eq!(
                    id(l.listening_in(netns, port)),
                    topo.component_listening_in(netns, port)
                        .map(|c| c.id.clone()),
                    "{netns:?} {port}"
                );
            }
        }
        let locals = [
            "127.0.0.1:8080",
            "10.1.1.1:8080",
            "127.0.0.1:30000",
            "127.0.0.2:30000",
            "10.0.0.5:30000",
            "[::1]:31000",
            "[::ffff:127.0.0.1]:31001",
            "127.0.0.1:31000",
            "1.2.3.4:32000",
            "not-an-address",
            "host:31001",
        ];
        for (i, c) in topo.components.iter().enumerate() {
            for local in locals {
                assert_eq!(
                    l.listens_at(i, local),
                    listens_at_by_scan(c, local),
                    "{} at {local}",
                    c.id
                );
            }
        }
    }
}
