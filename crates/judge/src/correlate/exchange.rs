//! Exchange segmentation: one HTTP request/response on one TCP connection, cut out of the
//! kernel's per-socket byte counters (`tcp_info`) sampled a few times a second.
//!
//! Only the server side of each hop is tracked. Without HTTP framing, "response complete" is
//! known only when the next request arrives or the connection closes; in between the
//! correlator decides (`Correlator::request_states`; "How requests are seen" in
//! docs/findings.md).

use super::probe_units::ProbeUnits;
use crate::clock::Millis;
use crate::model::{Role, SocketEntry, TcpState};
use std::collections::VecDeque;
use std::sync::Arc;

/// Identity of one TCP connection as seen from its server side.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnKey {
    pub netns: Option<u64>,
    /// The server's address (a component's listen address).
    pub local: String,
    /// The client's address.
    pub remote: String,
}

impl ConnKey {
    /// Becomes the key of the server socket `e`, in the buffers it already has.
    pub(crate) fn refill(&mut self, e: &crate::model::SocketEntry) {
        self.netns = e.netns;
        self.local.clear();
        self.local.push_str(&e.local);
        self.remote.clear();
        self.remote.push_str(&e.remote);
    }
}

/// How an exchange ended, when it is known to have ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The next request arrived on the same connection, or the server closed after replying.
    Done(Millis),
    /// The connection closed before any response byte.
    Closed(Millis),
}

/// One HTTP request/response on one connection.
#[derive(Debug, Clone, PartialEq)]
pub struct Exchange {
    /// Stable id within a model (`x<n>`).
    pub id: String,
    /// Its `n`: what the correlator's indexes key on (no string hashed).
    pub num: u64,
    pub conn_id: u64,
    /// Sequence number on its connection (1 = first request seen).
    pub seq: u32,
    pub component: String,
    pub role: Role,
    pub client: String,
    pub server: String,
    pub client_component: Option<String>,
    /// When the connection was first seen.
    pub opened_ms: Millis,
    /// Estimated arrival of the request's bytes (from `last_data_recv`).
    pub request_ms: Millis,
    pub last_request_ms: Millis,
    /// First response byte, when known (for a response first seen under way, `bytes_out`
    /// counts only what we saw).
    pub first_byte_ms: Option<Millis>,
    pub last_out_ms: Option<Millis>,
    pub end: Option<End>,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub(crate) in_base: u64,
    pub(crate) out_base: u64,
    /// Exchanges this one caused at the next hop, by number (the `n` of `x<n>`): cheaper to
    /// follow than an id string.
    pub links: Vec<u64>,
    /// The exchange that caused this one (its number), and how sure we are.
    pub parent: Option<u64>,
    pub parent_confidence: Option<f64>,
    /// The request was already in flight when we started watching (ages are estimates from
    /// the kernel's `last_data_recv`).
    pub seen_mid_flight: bool,
    /// The bytes in and out of one probe this exchange is whole repeats of
    /// ([`Conn::note_repeated_probe`]): not one request but several probes between two samples.
    pub probe_unit: Option<(u64, u64)>,
}

/// Largest response, in bytes, that counts as "status line and headers only" when it answers
/// an inference-sized request and nothing follows: a streaming server's headers before the
/// first token are smaller, any finished answer larger (figures in docs/findings.md).
pub const HEADERS_ONLY_MAX_BYTES: u64 = 240;

/// Smallest response, in bytes, that counts as "status line and headers only"; fewer is a
/// tiny body.
pub const HEADERS_ONLY_MIN_BYTES: u64 = 128;

/// Headers go out in one write: a response whose bytes left over a longer stretch than this
/// is a (slow) body, whatever its size.
pub const HEADERS_BURST_MS: Millis = 500;

/// An answer seen leaving this long after it was first seen under way is a stream, not one
/// write (a probe's answer leaves within milliseconds). Below the sockets period.
pub const STREAM_SPAN_MS: Millis = 200;

impl Exchange {
    pub fn started(&self) -> bool {
        self.first_byte_ms.is_some()
    }

    /// The server sent only its response headers (one burst, sized between the bounds
    /// above) to an inference-sized request: still waiting on the server, not idle.
    pub fn headers_only(&self) -> bool {
        self.end.is_none()
            && self.started()
            && (HEADERS_ONLY_MIN_BYTES..=HEADERS_ONLY_MAX_BYTES).contains(&self.bytes_out)
            && match (self.first_byte_ms, self.last_out_ms) {
                (Some(first), Some(last)) => last - first <= HEADERS_BURST_MS,
                _ => true,
            }
            && self.bytes_in >= super::MIN_INFERENCE_REQUEST_BYTES
            && self.probe_unit.is_none()
    }

    /// Waiting for the first byte of its answer's body: nothing sent at all yet, or only the
    /// response headers ([`Exchange::headers_only`]).
    pub fn awaiting_body(&self) -> bool {
        self.end.is_none() && (!self.started() || self.headers_only())
    }

    /// A body byte of the answer came (more than headers): the server answered it.
    pub fn answered(&self) -> bool {
        self.started() && !self.headers_only()
    }

    /// First seen with its answer under way (request size unknown), and the answer still
    /// leaving `STREAM_SPAN_MS` later: a streamed body, so an inference request.
    pub fn seen_streaming(&self) -> bool {
        self.seen_mid_flight
            && self.bytes_in == 0
            && self.bytes_out > 0
            && match (self.first_byte_ms, self.last_out_ms) {
                (Some(first), Some(last)) => last - first >= STREAM_SPAN_MS,
                _ => false,
            }
    }

    /// "0 out", or "162 out (response headers only)".
    pub fn out_text(&self) -> String {
        if self.headers_only() {
            format!("{} out (response headers only)", self.bytes_out)
        } else {
            format!("{} out", self.bytes_out)
        }
    }
    pub fn end_ms(&self) -> Option<Millis> {
        match self.end {
            Some(End::Done(t)) | Some(End::Closed(t)) => Some(t),
            None => None,
        }
    }
    /// Last time anything moved on this exchange.
    pub fn last_activity_ms(&self) -> Millis {
        self.last_out_ms
            .unwrap_or(self.last_request_ms)
            .max(self.last_request_ms)
    }
}

/// One tracked server-side connection.
#[derive(Debug, Clone)]
pub struct Conn {
    pub id: u64,
    pub key: ConnKey,
    pub component: String,
    pub role: Role,
    pub client_pid: Option<i32>,
    pub client_component: Option<String>,
    pub first_seen_ms: Millis,
    pub last_seen_ms: Millis,
    pub closed_ms: Option<Millis>,
    pub tcp_state: TcpState,
    pub in_total: u64,
    pub out_total: u64,
    pub last_in_ms: Option<Millis>,
    pub last_out_ms: Option<Millis>,
    /// The number of the newest socket table it was in (tells the connections a table no
    /// longer holds).
    pub(crate) in_table: u64,
    /// Shared with the views built from them; changed through [`Arc::make_mut`].
    pub exchanges: VecDeque<Arc<Exchange>>,
}

/// Most exchanges kept per connection (older finished ones are dropped first).
const MAX_EXCHANGES_PER_CONN: usize = 64;

/// Counters of one observation, out = acknowledged response bytes.
pub(crate) struct Obs {
    pub t: Millis,
    pub state: TcpState,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Estimated time of the last data received / sent (absolute), if the kernel said.
    pub last_in_at: Option<Millis>,
    pub last_out_at: Option<Millis>,
}

impl Obs {
    pub fn from_entry(t: Millis, e: &SocketEntry) -> Option<Obs> {
        let info = e.tcp_info?;
        // A never-used direction reads as a huge "ms since": capped.
        let ago = |ms: u32| -> Option<Millis> {
            if ms >= u32::MAX / 2 {
                None
            } else {
                Some(t - Millis::from(ms))
            }
        };
        let bytes_out = info.bytes_acked.max(if info.bytes_acked == 0 {
            info.bytes_sent
        } else {
            0
        });
        Some(Obs {
            t,
            state: e.state,
            bytes_in: info.bytes_received,
            bytes_out,
            last_in_at: if info.bytes_received > 0 {
                ago(info.last_data_recv_ms)
            } else {
                None
            },
            last_out_at: if bytes_out > 0 {
                ago(info.last_data_sent_ms)
            } else {
                None
            },
        })
    }
}

/// What moved on a connection between the previous sample and this one.
struct Moved {
    /// Bytes in and out since the previous sample.
    din: u64,
    dout: u64,
    /// When the last byte in and out moved, bounded to the interval since the previous sample.
    in_at: Millis,
    out_at: Millis,
    /// The connection's counters at the previous sample.
    old_in: u64,
    old_out: u64,
}

impl Moved {
    fn since(c: &Conn, o: &Obs) -> Moved {
        // Bound estimates to the interval since the previous sample.
        let prev = c.last_seen_ms;
        let est = |at: Option<Millis>| at.unwrap_or(o.t).clamp(prev.min(o.t), o.t);
        Moved {
            din: o.bytes_in.saturating_sub(c.in_total),
            dout: o.bytes_out.saturating_sub(c.out_total),
            in_at: est(o.last_in_at),
            out_at: est(o.last_out_at),
            old_in: c.in_total,
            old_out: c.out_total,
        }
    }
}

/// Whether `bytes_in` / `bytes_out` are k >= 2 requests of `unit` and k or k - 1 of its
/// responses.
fn repeats(bytes_in: u64, bytes_out: u64, (unit_in, unit_out): (u64, u64)) -> bool {
    if unit_in == 0 || !bytes_in.is_multiple_of(unit_in) {
        return false;
    }
    let k = bytes_in / unit_in;
    // Checked: the counters are a stranger's traffic, as large as it likes.
    let times = |n: u64| n.checked_mul(unit_out) == Some(bytes_out);
    k >= 2 && (times(k) || times(k - 1))
}

pub(crate) fn is_open(state: TcpState) -> bool {
    matches!(
        state,
        TcpState::Established | TcpState::SynRecv | TcpState::Unknown
    )
}

impl Conn {
    pub(crate) fn current_mut(&mut self) -> Option<&mut Exchange> {
        self.exchanges
            .back_mut()
            .filter(|x| x.end.is_none())
            .map(Arc::make_mut)
    }

    fn push(&mut self, x: Exchange) {
        if self.exchanges.len() >= MAX_EXCHANGES_PER_CONN {
            self.exchanges.pop_front();
        }
        self.exchanges.push_back(Arc::new(x));
    }

    pub(super) fn new_exchange(
        &self,
        num: u64,
        request_ms: Millis,
        in_base: u64,
        out_base: u64,
    ) -> Exchange {
        Exchange {
            id: super::exchange_id(num),
            num,
            conn_id: self.id,
            seq: self.exchanges.back().map(|x| x.seq + 1).unwrap_or(1),
            component: self.component.clone(),
            role: self.role,
            client: self.key.remote.clone(),
            server: self.key.local.clone(),
            client_component: self.client_component.clone(),
            opened_ms: self.first_seen_ms,
            request_ms,
            last_request_ms: request_ms,
            first_byte_ms: None,
            last_out_ms: None,
            end: None,
            bytes_in: 0,
            bytes_out: 0,
            in_base,
            out_base,
            links: Vec::new(),
            parent: None,
            parent_confidence: None,
            seen_mid_flight: false,
            probe_unit: None,
        }
    }

    /// First sight of a connection: reconstruct what is outstanding from the counters and
    /// the kernel's "ms since last data" fields.
    pub(crate) fn first_observation(&mut self, o: &Obs, next_num: &mut dyn FnMut() -> u64) {
        self.in_total = o.bytes_in;
        self.out_total = o.bytes_out;
        self.last_in_ms = o.last_in_at;
        self.last_out_ms = o.last_out_at;
        self.tcp_state = o.state;
        if o.bytes_in == 0 {
            return; // opened, nothing asked yet
        }
        let req_at = o.last_in_at.unwrap_or(o.t).min(o.t);
        let mut x = self.new_exchange(next_num(), req_at, 0, o.bytes_out);
        x.seen_mid_flight = true;
        x.opened_ms = self.first_seen_ms.min(req_at);
        match (o.last_in_at, o.last_out_at) {
            // Nothing sent yet, or the request came after the last response byte: a request
            // is waiting for its first byte. Only on a fresh connection do we know its size.
            (_, None) => {
                x.in_base = 0;
                x.bytes_in = o.bytes_in;
            }
            (Some(i), Some(s)) if i > s => {
                x.in_base = o.bytes_in;
                x.bytes_in = 0;
            }
            // The latest movement was response bytes: a response was (or is) under way.
            (_, Some(s)) => {
                x.in_base = o.bytes_in;
                x.first_byte_ms = Some(s);
                x.last_out_ms = Some(s);
                // One inference-sized request answered with headers only: keep its sizes,
                // so it reads as waiting.
                if (HEADERS_ONLY_MIN_BYTES..=HEADERS_ONLY_MAX_BYTES).contains(&o.bytes_out)
                    && o.bytes_in >= super::MIN_INFERENCE_REQUEST_BYTES
                {
                    x.in_base = 0;
                    x.out_base = 0;
                    x.bytes_in = o.bytes_in;
                    x.bytes_out = o.bytes_out;
                }
            }
        }
        self.push(x);
        if !is_open(o.state) {
            self.close(o.t);
        }
    }

    /// A later observation: cut the byte deltas into exchanges.
    pub(crate) fn observe(
        &mut self,
        o: &Obs,
        next_num: &mut dyn FnMut() -> u64,
        known: &mut ProbeUnits,
    ) {
        if self.closed_ms.is_some() {
            self.observe_half_closed(o);
            return;
        }
        let m = Moved::since(self, o);
        if m.din > 0 {
            self.bytes_came_in(o, &m, next_num);
        } else if m.dout > 0 {
            self.bytes_went_out(&m, next_num);
        }
        self.settle(o, &m);
        self.note_repeated_probe(known);
    }

    /// Probes faster than the socket table are cut as one exchange of k probes' bytes, which
    /// can look like an inference request answered with headers only. When this one's bytes
    /// are whole multiples of a known probe (this connection's previous one, else one in
    /// `known`), it is marked a repeat of that probe.
    pub(crate) fn note_repeated_probe(&mut self, known: &mut ProbeUnits) {
        let n = self.exchanges.len();
        let single = |x: &Exchange| {
            (x.bytes_in > 0 && x.bytes_in < super::MIN_INFERENCE_REQUEST_BYTES && x.bytes_out > 0)
                .then_some((x.bytes_in, x.bytes_out))
        };
        let prev = n
            .checked_sub(2)
            .and_then(|i| self.exchanges.get(i))
            .and_then(|p| p.probe_unit.or(single(p)));
        let Some(x) = self.exchanges.back_mut().map(Arc::make_mut) else {
            return;
        };
        if let Some(u) = single(x) {
            known.learn(u);
        }
        if let Some(u) = prev {
            known.learn(u);
        }
        x.probe_unit = prev
            .into_iter()
            .chain(known.iter())
            .find(|&u| repeats(x.bytes_in, x.bytes_out, u));
    }

    /// Half-closed (CLOSE_WAIT, FIN_WAIT...): bytes still moving are the tail of the last
    /// exchange, never a new request.
    fn observe_half_closed(&mut self, o: &Obs) {
        let dout = o.bytes_out.saturating_sub(self.out_total);
        if let Some(x) = self.exchanges.back_mut().map(Arc::make_mut) {
            if dout > 0 && x.started() {
                x.bytes_out = o.bytes_out.saturating_sub(x.out_base);
            }
        }
        self.in_total = o.bytes_in;
        self.out_total = o.bytes_out;
        self.tcp_state = o.state;
        self.last_seen_ms = o.t;
    }

    /// Request bytes came in since the previous sample: the waiting request goes on, or was
    /// answered and followed by the next, or a new request starts.
    fn bytes_came_in(&mut self, o: &Obs, m: &Moved, next_num: &mut dyn FnMut() -> u64) {
        let waiting = self
            .exchanges
            .back()
            .is_some_and(|x| x.end.is_none() && !x.started());
        // Answered and the next request came, between two samples (a keep-alive
        // connection reused faster than we sample): close the answered one.
        let answered_then_asked = waiting && m.dout > 0 && m.in_at >= m.out_at;
        if answered_then_asked {
            self.answered_then_asked(o, m, next_num);
        } else if waiting {
            if let Some(x) = self.current_mut() {
                x.last_request_ms = m.in_at;
                if m.dout > 0 {
                    x.first_byte_ms = Some(m.out_at);
                    x.last_out_ms = Some(m.out_at);
                }
            }
        } else {
            self.next_request(o, m, next_num);
        }
    }

    /// The waiting request was answered and the next one asked between two samples.
    fn answered_then_asked(&mut self, o: &Obs, m: &Moved, next_num: &mut dyn FnMut() -> u64) {
        if let Some(cur) = self.current_mut() {
            cur.first_byte_ms = Some(m.out_at);
            cur.last_out_ms = Some(m.out_at);
            cur.bytes_out = o.bytes_out.saturating_sub(cur.out_base);
            cur.end = Some(End::Done(m.out_at));
        }
        let mut x = self.new_exchange(next_num(), m.in_at.min(o.t), m.old_in, o.bytes_out);
        // How the bytes in split between the two requests is not known.
        x.seen_mid_flight = true;
        self.push(x);
    }

    /// A new request on a connection with no request waiting: the current exchange ends.
    fn next_request(&mut self, o: &Obs, m: &Moved, next_num: &mut dyn FnMut() -> u64) {
        // Response bytes that came before the new request belong to the old one.
        let out_to_old = m.dout > 0 && m.out_at <= m.in_at;
        if let Some(cur) = self.current_mut() {
            if out_to_old {
                cur.last_out_ms = Some(m.out_at);
                cur.bytes_out = o.bytes_out.saturating_sub(cur.out_base);
            }
            let end_at = cur.last_activity_ms();
            cur.end = Some(End::Done(end_at));
        }
        // The new request's start: no earlier than the previous sample.
        let start = m.in_at.min(o.t);
        let out_base = if out_to_old { o.bytes_out } else { m.old_out };
        let mut x = self.new_exchange(next_num(), start, m.old_in, out_base);
        if m.dout > 0 && !out_to_old {
            x.first_byte_ms = Some(m.out_at);
            x.last_out_ms = Some(m.out_at);
        }
        self.push(x);
    }

    /// Only response bytes went out since the previous sample.
    fn bytes_went_out(&mut self, m: &Moved, next_num: &mut dyn FnMut() -> u64) {
        match self.current_mut() {
            Some(x) => {
                if x.first_byte_ms.is_none() {
                    x.first_byte_ms = Some(m.out_at);
                }
                x.last_out_ms = Some(m.out_at);
            }
            None => {
                // Bytes out with no request seen (server push, or an exchange that
                // started before a counter wrap): account them to a new exchange.
                let mut x = self.new_exchange(next_num(), m.out_at, m.old_in, m.old_out);
                x.first_byte_ms = Some(m.out_at);
                x.last_out_ms = Some(m.out_at);
                self.push(x);
            }
        }
    }

    /// After the exchanges are cut: the current one's sizes and the connection's counters.
    fn settle(&mut self, o: &Obs, m: &Moved) {
        if let Some(x) = self.current_mut() {
            x.bytes_in = o.bytes_in.saturating_sub(x.in_base);
            x.bytes_out = o.bytes_out.saturating_sub(x.out_base);
        }
        if m.din > 0 {
            self.last_in_ms = Some(m.in_at);
        }
        if m.dout > 0 {
            self.last_out_ms = Some(m.out_at);
        }
        self.in_total = o.bytes_in;
        self.out_total = o.bytes_out;
        self.tcp_state = o.state;
        self.last_seen_ms = o.t;
        if !is_open(o.state) {
            self.close(o.t);
        }
    }

    /// The connection closed (or the client half-closed: CLOSE_WAIT and friends).
    pub(crate) fn close(&mut self, t: Millis) {
        if self.closed_ms.is_none() {
            self.closed_ms = Some(t);
        }
        if let Some(x) = self.current_mut() {
            x.end = Some(if x.started() {
                End::Done(x.last_activity_ms())
            } else {
                End::Closed(t)
            });
        }
    }
}
