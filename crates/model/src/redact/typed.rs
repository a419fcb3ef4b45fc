//! The exchanges and logical requests of a snapshot, redacted typed (they are most of a big
//! node's snapshot, too many for a JSON tree). Each text field goes through
//! [`Redactor::text_cow`] and each list of ids through [`Redactor::args`], exactly as the JSON
//! walk treats them; their enums and numbers hold no text.

use super::Redactor;
use crate::model::{LogicalRequest, Request};

/// A request's text fields. Every field is named: a text field added to `Request` must be
/// placed here or among the skipped, or this does not build (typed redaction must not miss
/// what the JSON walk would have seen).
fn texts(r: &Request) -> [Option<&String>; 8] {
    let Request {
        id,
        component,
        client,
        server,
        client_component,
        started_at,
        request,
        leg,
        links: _, // a list: `learn_list`
        state: _,
        age_ms: _,
        bytes_in: _,
        bytes_out: _,
        idle_out_ms: _,
        role: _,
        link_confidence: _,
    } = r;
    [
        Some(id),
        Some(component),
        Some(client),
        Some(server),
        client_component.as_ref(),
        started_at.as_ref(),
        request.as_ref(),
        leg.as_ref(),
    ]
}

fn texts_mut(r: &mut Request) -> [Option<&mut String>; 8] {
    let Request {
        id,
        component,
        client,
        server,
        client_component,
        started_at,
        request,
        leg,
        links: _,
        state: _,
        age_ms: _,
        bytes_in: _,
        bytes_out: _,
        idle_out_ms: _,
        role: _,
        link_confidence: _,
    } = r;
    [
        Some(id),
        Some(component),
        Some(client),
        Some(server),
        client_component.as_mut(),
        started_at.as_mut(),
        request.as_mut(),
        leg.as_mut(),
    ]
}

/// A logical request's text fields (every field named, as in [`texts`]).
fn logical_texts(l: &LogicalRequest) -> [Option<&String>; 5] {
    let LogicalRequest {
        id,
        component,
        stuck_leg,
        stuck_at,
        waiting_leg,
        legs: _, // a list: `learn_list`
        verdict: _,
        age_ms: _,
        probe: _,
        stuck_role: _,
        stuck_kind: _,
        waiting_reason: _,
    } = l;
    [
        Some(id),
        Some(component),
        stuck_leg.as_ref(),
        stuck_at.as_ref(),
        waiting_leg.as_ref(),
    ]
}

fn logical_texts_mut(l: &mut LogicalRequest) -> [Option<&mut String>; 5] {
    let LogicalRequest {
        id,
        component,
        stuck_leg,
        stuck_at,
        waiting_leg,
        legs: _,
        verdict: _,
        age_ms: _,
        probe: _,
        stuck_role: _,
        stuck_kind: _,
        waiting_reason: _,
    } = l;
    [
        Some(id),
        Some(component),
        stuck_leg.as_mut(),
        stuck_at.as_mut(),
        waiting_leg.as_mut(),
    ]
}

impl Redactor {
    /// Learns the secrets of exchanges and logical requests without changing them.
    pub fn learn_requests(&mut self, requests: &[Request], logical: &[LogicalRequest]) {
        for r in requests {
            texts(r).into_iter().flatten().for_each(|s| {
                self.text_cow(s);
            });
            self.learn_list(&r.links);
        }
        for l in logical {
            logical_texts(l).into_iter().flatten().for_each(|s| {
                self.text_cow(s);
            });
            self.learn_list(&l.legs);
        }
    }

    /// Redacts exchanges and logical requests in place (as [`Redactor::redact_json`] would
    /// their JSON), scrubbing every value learned so far.
    pub fn redact_requests(&mut self, requests: &mut [Request], logical: &mut [LogicalRequest]) {
        for r in requests.iter_mut() {
            texts_mut(r)
                .into_iter()
                .flatten()
                .for_each(|s| self.text_in_place(s));
            self.list_in_place(&mut r.links);
        }
        for l in logical.iter_mut() {
            logical_texts_mut(l)
                .into_iter()
                .flatten()
                .for_each(|s| self.text_in_place(s));
            self.list_in_place(&mut l.legs);
        }
    }

    fn learn_list(&mut self, list: &[String]) {
        if !list.is_empty() {
            self.args(list);
        }
    }

    /// A list of strings, which the JSON walk takes for a possible command line.
    fn list_in_place(&mut self, list: &mut Vec<String>) {
        if list.is_empty() {
            return;
        }
        let redacted = self.args(list);
        if redacted != *list {
            *list = redacted;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{RequestState, Role, Verdict};

    fn request(text: &str) -> Request {
        Request {
            id: format!("x1 {text}"),
            component: format!("decode {text}"),
            client: format!("127.0.0.1:1 {text}"),
            server: format!("127.0.0.1:2 {text}"),
            state: RequestState::Streaming,
            age_ms: 1.0,
            bytes_in: 1,
            bytes_out: 2,
            idle_out_ms: 3.0,
            links: vec!["--api-key".into(), text.into(), format!("x2 {text}")],
            role: Some(Role::Decode),
            client_component: Some(format!("router {text}")),
            link_confidence: Some(0.5),
            started_at: Some(format!("2026-12-02T00:00:00Z {text}")),
            request: Some(format!("r1 {text}")),
            leg: Some(format!("r1@decode {text}")),
        }
    }

    fn logical(text: &str) -> LogicalRequest {
        LogicalRequest {
            id: format!("r1 {text}"),
            legs: vec![format!("x1 {text}"), "Bearer".into(), text.into()],
            verdict: Verdict::Stuck,
            component: format!("proxy {text}"),
            age_ms: 1.0,
            probe: false,
            stuck_leg: Some(format!("r1@decode {text}")),
            stuck_at: Some(format!("decode {text}")),
            stuck_role: Some(Role::Decode),
            stuck_kind: None,
            waiting_reason: None,
            waiting_leg: Some(format!("r1@proxy {text}")),
        }
    }

    /// The typed pass learns and removes exactly what the JSON walk does, field by field:
    /// secrets by structure, by shape, after a secret flag or `Bearer` in a list, and values
    /// learned elsewhere.
    #[test]
    fn typed_requests_are_redacted_as_their_json_is() {
        for text in [
            "token=typed-secret-1",
            "hf_abcdefghijklmnopqrstuvwxyz0123456789",
            "plain-words only",
            "learned-elsewhere-1",
        ] {
            let (mut rs, mut ls) = (vec![request(text)], vec![logical(text)]);
            let json = serde_json::json!({"requests": rs.clone(), "logical": ls.clone()});
            let seed = serde_json::json!({"env": {"DB_PASS": "learned-elsewhere-1"}});

            let mut by_json = Redactor::new();
            by_json.learn_json(&seed);
            by_json.learn_json(&json);
            let mut want = json.clone();
            by_json.redact_json(&mut want);

            let mut typed = Redactor::new();
            typed.learn_json(&seed);
            typed.learn_requests(&rs, &ls);
            typed.redact_requests(&mut rs, &mut ls);
            let got = serde_json::json!({"requests": rs, "logical": ls});
            assert_eq!(got, want, "{text}");
            assert_eq!(
                typed.secrets().collect::<Vec<_>>(),
                by_json.secrets().collect::<Vec<_>>()
            );
        }
    }
}
