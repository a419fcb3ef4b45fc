//! `--pid` / `--url` targets discovery missed, added last: matched against the profiles
//! when their process is there, else listed as `other@...` so the snapshot says what
//! happened to them.

use super::endpoints::connect_host;
use super::Builder;
use crate::model::addr::host_port;
use crate::model::topology::labels::LABEL_FOUND_BY;
use crate::model::{Component, Role};
use crate::sys::addr::url_endpoint;
use crate::sys::Url;

impl Builder<'_> {
    pub(super) fn extra_pids(&mut self) {
        for &pid in &self.opts.extra_pids {
            if self.topo.components.iter().any(|c| c.pids.contains(&pid)) {
                continue;
            }
            let Some(proc) = self.table.full(pid) else {
                // vanished or hidden: still listed, so the snapshot says what happened
                let mut c = Component::new(format!("other@pid{pid}"), Role::Other, "generic");
                c.profile = "--pid".into();
                c.pids = vec![pid];
                c.main_pid = Some(pid);
                c.labels
                    .insert(LABEL_FOUND_BY.into(), "--pid (not found in procfs)".into());
                self.topo.components.push(c);
                continue;
            };
            let mut c = match self.best_top_level(&proc) {
                Some((ci, m)) => self.build_component(pid, ci, m, None),
                None => self.unmatched_pid(pid),
            };
            c.labels.insert(LABEL_FOUND_BY.into(), "--pid".into());
            self.push_unique(c);
        }
    }

    /// A `--pid` process no profile matches: `other@<first listen address>`.
    fn unmatched_pid(&self, pid: i32) -> Component {
        let listen = self.table.listen_of(pid);
        let id = match listen.first() {
            Some(a) => format!("other@{}", self.table.keyed(pid, &a.to_string())),
            None => format!("other@pid{pid}"),
        };
        let mut c = Component::new(id, Role::Other, "generic");
        c.profile = "--pid".into();
        c.pids = vec![pid];
        c.main_pid = Some(pid);
        c.listen = listen.iter().map(|a| a.to_string()).collect();
        self.table.place(&mut c, pid);
        c
    }

    pub(super) fn extra_urls(&mut self) {
        for raw in &self.opts.extra_urls {
            let parsed = Url::parse(raw).ok();
            let Some((url, (host, port))) =
                parsed.as_ref().and_then(|u| Some((u, url_endpoint(u)?)))
            else {
                let mut c = Component::new(format!("other@{raw}"), Role::Other, "generic");
                c.profile = "--url".into();
                c.labels
                    .insert(LABEL_FOUND_BY.into(), "--url (unparsable)".into());
                self.topo.components.push(c);
                continue;
            };
            let base = format!("{}://{}:{port}", url.scheme(), connect_host(&host));
            if let Some(id) = self.component_at(&host, port) {
                if let Some(c) = self.topo.components.iter_mut().find(|c| c.id == id) {
                    if c.http_url.is_none() {
                        c.http_url = Some(base.clone());
                    }
                    c.labels.insert("url".into(), raw.clone());
                }
                continue;
            }
            let addr = host_port(&host, port);
            let mut c = Component::new(format!("other@{addr}"), Role::Other, "generic");
            c.profile = "--url".into();
            c.listen = vec![addr];
            c.http_url = Some(base.clone());
            let path = url.path();
            c.metrics_url = Some(if path.ends_with("metrics") {
                format!("{base}{path}")
            } else {
                format!("{base}/metrics")
            });
            c.labels.insert(LABEL_FOUND_BY.into(), "--url".into());
            if self.opts.query_endpoints {
                crate::sources::metrics::infer_url_component(&mut c, self.opts.http_timeout);
            }
            self.push_unique(c);
        }
    }
}
