//! Exchange segmentation and hop linking from synthetic tcp_info samples (FakeClock-style
//! explicit timestamps, no sleeps).

// libc calls (tcp_info, rusage, ptys, a counting allocator) that std does not wrap.
#![allow(unsafe_code)]

use correl_common::*;
use wedgewatch::model::{RequestState, Role};
use wedgewatch_testkit::correl as correl_common;

#[test]
fn keep_alive_connection_carries_successive_exchanges() {
    let mut sim = Sim::new(pd_topology());
    let c = sim.connect(None, 31012, 400);
    sim.sample_sockets(); // opened, nothing asked yet
    sim.advance(100);
    sim.request(c, 500);
    sim.run(500, |_| {});
    sim.respond(c, 40);
    sim.run(250, |_| {});
    sim.respond(c, 60);
    sim.run(3000, |_| {});
    // second request on the same connection
    sim.request(c, 300);
    sim.run(250, |_| {});
    sim.respond(c, 1000);
    sim.run(250, |_| {});

    let xs: Vec<_> = sim.model.exchanges().cloned().collect();
    assert_eq!(xs.len(), 2, "{xs:#?}");
    assert_eq!((xs[0].seq, xs[0].bytes_in, xs[0].bytes_out), (1, 500, 100));
    assert_eq!((xs[1].seq, xs[1].bytes_in, xs[1].bytes_out), (2, 300, 1000));
    assert_eq!(
        xs[0].request_ms,
        T0 + 100,
        "request time from last_data_recv"
    );
    let v = sim.model.view(sim.now);
    let st = |id: &str| v.request(id).map(|r| r.state);
    assert_eq!(
        st(&xs[0].id),
        Some(RequestState::Done),
        "next request ends the previous one"
    );
    assert_eq!(st(&xs[1].id), Some(RequestState::Streaming));
    // later: quiet, nothing says it is still open -> done, and the connection is idle
    sim.run(5000, |_| {});
    let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
    let r2 = parts
        .requests
        .iter()
        .find(|r| r.id == xs[1].id)
        .expect("x2");
    assert_eq!(r2.state, RequestState::Done);
    assert!(parts
        .requests
        .iter()
        .any(|r| r.state == RequestState::Idle && r.component == DECODE));
}

#[test]
fn waiting_first_byte_then_closed_by_client() {
    let mut sim = Sim::new(pd_topology());
    let c = sim.connect(None, 31012, 400);
    sim.request(c, 700);
    sim.run(1000, |_| {});
    let v = sim.model.view(sim.now);
    let r = &v.requests[0];
    assert_eq!(r.state, RequestState::WaitingFirstByte);
    assert_eq!(r.age_ms, 1000);
    assert_eq!(r.x.bytes_in, 700);
    sim.close(c);
    sim.run(250, |_| {});
    let v = sim.model.view(sim.now);
    assert_eq!(v.requests[0].state, RequestState::Closed);
}

#[test]
fn first_sight_mid_flight_recovers_age_from_tcp_info() {
    // The tool starts watching 94 s after the request arrived.
    let mut sim = Sim::new(pd_topology());
    let c = sim.connect(None, 31012, 400);
    sim.request(c, 900);
    sim.advance(94_000);
    sim.sample_sockets();
    let v = sim.model.view(sim.now);
    assert_eq!(v.requests.len(), 1);
    assert_eq!(v.requests[0].state, RequestState::WaitingFirstByte);
    assert_eq!(v.requests[0].age_ms, 94_000);
    assert!(v.requests[0].x.seen_mid_flight);
}

/// client -> proxy -> router -> prefill + decode, with the forwarded request a few ms later
/// at each hop. Returns (sim, [proxy conn, router conn, prefill conn, decode conn]).
pub fn pd_request(sim: &mut Sim) -> [usize; 4] {
    let a = sim.connect(None, 8000, 100);
    let b = sim.connect(Some(100), 30000, 200);
    let p = sim.connect(Some(200), 31011, 300);
    let d = sim.connect(Some(200), 31012, 400);
    sim.request(a, 800);
    sim.advance(20);
    sim.request(b, 830);
    sim.advance(25);
    sim.request(p, 950);
    sim.request(d, 950);
    [a, b, p, d]
}

#[test]
fn hop_links_follow_proxy_router_prefill_and_decode() {
    let mut sim = Sim::new(pd_topology());
    // Background noise: an earlier, finished request on another router connection.
    let [_, _, p, _] = pd_request(&mut sim);
    sim.run(250, |_| {});
    sim.respond(p, 200);
    sim.run(2000, |_| {});
    let ids_before: usize = sim.model.exchanges().count();
    let [a, b, p2, d2] = pd_request(&mut sim);
    let _ = (a, b);
    sim.run(250, |_| {});
    sim.respond(p2, 120);
    sim.run(1000, |_| {});
    let _ = d2;

    let xs: Vec<_> = sim.model.exchanges().cloned().collect();
    assert_eq!(xs.len(), ids_before + 4);
    let at = |comp: &str| {
        xs.iter()
            .filter(|x| x.component == comp)
            .max_by_key(|x| x.request_ms)
            .cloned()
            .expect(comp)
    };
    let (px, rx, fx, dx) = (at(PROXY), at(ROUTER), at(PREFILL), at(DECODE));
    // Exact: the router's inbound connection is the proxy's outbound one reversed.
    assert_eq!(rx.client_component.as_deref(), Some(PROXY));
    assert_eq!(fx.client_component.as_deref(), Some(ROUTER));
    assert_eq!(px.client_component, None);
    assert_eq!(px.links, vec![rx.num]);
    let mut rl = rx.links.clone();
    rl.sort();
    let mut want = vec![fx.num, dx.num];
    want.sort();
    assert_eq!(rl, want, "PD: the same request goes to both legs");
    assert_eq!(dx.parent, Some(rx.num));
    let conf = dx.parent_confidence.expect("confidence");
    assert!(conf > 0.5 && conf <= 1.0, "{conf}");
    // The earlier request's exchanges are not linked to the new ones.
    let first_router = xs.iter().find(|x| x.component == ROUTER).expect("r1");
    assert!(!first_router.links.contains(&dx.num));

    let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
    let rr = parts
        .requests
        .iter()
        .find(|r| r.id == rx.id)
        .expect("router request");
    assert_eq!(rr.state, RequestState::WaitingFirstByte);
    assert_eq!(rr.role, Some(Role::Router));
    assert!(rr.link_confidence.is_some());
    let pr = parts
        .requests
        .iter()
        .find(|r| r.id == fx.id)
        .expect("prefill");
    assert_eq!(pr.state, RequestState::Streaming);
}

#[test]
fn own_metrics_scrapes_are_not_requests() {
    let mut sim = Sim::new(pd_topology());
    sim.model.ignore_client_pids = vec![999];
    let c = sim.connect(Some(999), 31012, 400);
    sim.request(c, 100);
    sim.run(500, |_| {});
    assert_eq!(sim.model.exchanges().count(), 0);
}

#[test]
fn socket_counts_and_process_identity_reach_the_parts() {
    let mut sim = Sim::new(pd_topology());
    let c = sim.connect(Some(200), 31012, 400);
    sim.request(c, 10);
    sim.run(250, |_| {});
    let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
    let ex = parts.extras.get(DECODE).expect("decode extras");
    assert_eq!(ex.sockets.get("ESTABLISHED"), Some(&1));
    assert_eq!(ex.sockets.get("LISTEN"), Some(&1));
    assert_eq!(
        parts.sources[&wedgewatch::model::SourceKind::Sockets].status,
        wedgewatch::model::Status::Ok
    );
    assert_eq!(
        parts.sources[&wedgewatch::model::SourceKind::Gpu].status,
        wedgewatch::model::Status::Unavailable
    );
}

/// Real kernel counters: a real TCP connection on 127.0.0.1, its server side's tcp_info read
/// with getsockopt(TCP_INFO), fed to the correlator. Checks the assumptions the exchange
/// segmentation makes about bytes_received / bytes_acked / last_data_recv.
#[test]
fn real_tcp_info_counters_segment_like_the_synthetic_ones() {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use wedgewatch::clock::{Clock, SystemClock};
    use wedgewatch::model::*;

    fn tcp_info(s: &std::net::TcpStream) -> TcpInfo {
        let mut ti: libc::tcp_info = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        let rc = unsafe {
            libc::getsockopt(
                s.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                (&mut ti as *mut libc::tcp_info).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0, "getsockopt(TCP_INFO)");
        TcpInfo {
            bytes_acked: ti.tcpi_bytes_acked,
            bytes_received: ti.tcpi_bytes_received,
            bytes_sent: 0,
            last_data_sent_ms: ti.tcpi_last_data_sent,
            last_data_recv_ms: ti.tcpi_last_data_recv,
            last_ack_recv_ms: ti.tcpi_last_ack_recv,
            rtt_us: ti.tcpi_rtt,
            retransmits: u32::from(ti.tcpi_retransmits),
            unacked: ti.tcpi_unacked,
        }
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let mut client = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let (mut server, peer) = listener.accept().expect("accept");
    let me = std::process::id() as i32;
    let mut topo = Topology::default();
    let mut c = Component::new(format!("decode@127.0.0.1:{port}"), Role::Decode, "sglang");
    c.pids = vec![me];
    c.main_pid = Some(me);
    c.listen = vec![format!("127.0.0.1:{port}")];
    topo.components.push(c);
    let mut model = wedgewatch::correlate::Correlator::default();
    model.ignore_client_pids.clear();
    model.set_topology(topo);
    let clock = SystemClock;
    let sample = |model: &mut wedgewatch::correlate::Correlator, server: &std::net::TcpStream| {
        let t = clock.now_ms();
        let entry = SocketEntry {
            local: format!("127.0.0.1:{port}"),
            remote: peer.to_string(),
            state: TcpState::Established,
            rx_queue: 0,
            tx_queue: 0,
            inode: 1,
            uid: 0,
            pid: Some(me),
            netns: None,
            tcp_info: Some(tcp_info(server)),
        };
        model.ingest(&Sample {
            t_ms: t,
            status: SourceStatus::ok(),
            took_ms: 1,
            payload: Payload::Sockets(SocketTable {
                sockets: vec![entry],
                notes: vec![],
            }),
        });
        t
    };
    let mut buf = [0u8; 4096];

    client.write_all(&[b'a'; 500]).expect("request 1");
    std::thread::sleep(std::time::Duration::from_millis(300));
    server.read_exact(&mut buf[..500]).expect("read 1");
    let t1 = sample(&mut model, &server);
    let v = model.view(t1);
    assert_eq!(v.requests.len(), 1, "{:?}", v.requests);
    assert_eq!(v.requests[0].state, RequestState::WaitingFirstByte);
    assert_eq!(v.requests[0].x.bytes_in, 500);
    // Seen 300 ms after the request arrived: the age comes from last_data_recv.
    assert!(
        (250..2000).contains(&v.requests[0].age_ms),
        "age {}",
        v.requests[0].age_ms
    );

    server.write_all(&[b'b'; 100]).expect("response 1");
    client.read_exact(&mut buf[..100]).expect("client read 1");
    std::thread::sleep(std::time::Duration::from_millis(50));
    let t2 = sample(&mut model, &server);
    let v = model.view(t2);
    assert_eq!(v.requests[0].state, RequestState::Streaming);
    assert_eq!(
        v.requests[0].x.bytes_out, 100,
        "bytes_acked counts the response"
    );

    client.write_all(&[b'c'; 300]).expect("request 2");
    std::thread::sleep(std::time::Duration::from_millis(50));
    server.read_exact(&mut buf[..300]).expect("read 2");
    let t3 = sample(&mut model, &server);
    let xs: Vec<_> = model.exchanges().cloned().collect();
    assert_eq!(xs.len(), 2, "keep-alive: a second exchange");
    assert_eq!((xs[1].seq, xs[1].bytes_in, xs[1].bytes_out), (2, 300, 0));
    assert!(xs[1].request_ms >= t2 && xs[1].request_ms <= t3);
    let v = model.view(t3);
    assert_eq!(
        v.request(&xs[0].id).map(|r| r.state),
        Some(RequestState::Done)
    );
    assert_eq!(
        v.request(&xs[1].id).map(|r| r.state),
        Some(RequestState::WaitingFirstByte)
    );
}

/// Measurement, not a check: correlator cost per sockets sample and per `parts` with 1000
/// open connections (30 % of them moving). Debug build numbers are an upper bound.
/// `cargo test --test correlate measure_ingest_cost -- --ignored --nocapture`
#[test]
#[ignore]
fn measure_ingest_cost() {
    let mut sim = Sim::new(pd_topology());
    let conns: Vec<usize> = (0..1000)
        .map(|_| sim.connect(Some(200), 31012, 400))
        .collect();
    let mut ingest_total = std::time::Duration::ZERO;
    let n = 120;
    for i in 0..n {
        sim.advance(250);
        for (j, c) in conns.iter().enumerate() {
            if (j + i) % 10 < 3 {
                sim.request(*c, 10);
                sim.respond(*c, 40);
            }
        }
        let s = wedgewatch::model::Sample {
            t_ms: sim.now,
            status: wedgewatch::model::SourceStatus::ok(),
            took_ms: 1,
            payload: wedgewatch::model::Payload::Sockets(sim.socket_table()),
        };
        let t = std::time::Instant::now();
        sim.model.ingest(&s);
        ingest_total += t.elapsed();
    }
    let t = std::time::Instant::now();
    let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
    let parts_time = t.elapsed();
    println!(
        "ingest: {:.2} ms per sockets sample (1000 conns, {} exchanges); parts: {:.1} ms ({} requests)",
        ingest_total.as_secs_f64() * 1000.0 / n as f64,
        sim.model.exchanges().count(),
        parts_time.as_secs_f64() * 1000.0,
        parts.requests.len()
    );
}

#[test]
fn half_closed_connection_never_starts_a_new_exchange() {
    let mut sim = Sim::new(pd_topology());
    let c = sim.connect(Some(200), 31012, 400);
    sim.request(c, 300);
    sim.run(250, |_| {});
    sim.respond(c, 100);
    sim.run(250, |_| {});
    // The client half-closes; the server still flushes the rest of its answer.
    sim.conns[c].state = wedgewatch::model::TcpState::CloseWait;
    sim.run(250, |_| {});
    sim.respond(c, 400);
    sim.run(500, |_| {});
    let xs: Vec<_> = sim.model.exchanges().cloned().collect();
    assert_eq!(xs.len(), 1, "{xs:#?}");
    assert_eq!(xs[0].bytes_out, 500);
    let v = sim.model.view(sim.now);
    assert_eq!(v.requests[0].state, RequestState::Done);
}

/// Sampled once a second (as recordings are), a keep-alive connection can carry a whole
/// answer and the next question between two samples. The answered request is done; the
/// new one waits for its first byte, aged from tcp_info's last_data_recv.
#[test]
fn answer_and_next_request_between_two_samples_leaves_the_new_one_waiting() {
    let mut sim = Sim::new(pd_topology());
    let c = sim.connect(None, 31012, 400);
    sim.request(c, 800);
    sim.advance(100);
    sim.sample_sockets(); // the first request waits
    sim.advance(300);
    sim.respond(c, 6000); // answered...
    sim.advance(200);
    sim.request(c, 1300); // ...and asked again, all within one second
    let asked_at = sim.now;
    sim.advance(500);
    sim.sample_sockets();
    sim.advance(9000);
    sim.sample_sockets();

    let xs: Vec<_> = sim.model.exchanges().cloned().collect();
    assert_eq!(xs.len(), 2, "{xs:#?}");
    assert_eq!(xs[0].bytes_out, 6000);
    assert_eq!(xs[1].bytes_out, 0);
    assert_eq!(xs[1].request_ms, asked_at);
    let v = sim.model.view(sim.now);
    let st = |id: &str| v.request(id).map(|r| (r.state, r.age_ms));
    assert_eq!(st(&xs[0].id).map(|s| s.0), Some(RequestState::Done));
    assert_eq!(
        st(&xs[1].id),
        Some((RequestState::WaitingFirstByte, 9500)),
        "the second request has waited since it came in"
    );
}

/// A busy node (issue 15): every unfinished request is listed, only the newest finished
/// ones are, and what was left out is counted.
#[test]
fn a_busy_snapshot_lists_unfinished_requests_and_the_newest_finished_ones() {
    use wedgewatch::correlate::MAX_DONE_LISTED;
    use wedgewatch::model::Verdict;
    let mut sim = Sim::new(pd_topology());
    let waiting = sim.connect(None, 31012, 400);
    sim.request(waiting, 700);
    let mut open: Vec<usize> = Vec::new();
    for _ in 0..70 {
        for c in open.drain(..) {
            sim.respond(c, 300);
            sim.close(c);
        }
        for _ in 0..10 {
            let c = sim.connect(None, 31012, 400);
            sim.request(c, 500);
            open.push(c);
        }
        sim.run(250, |_| {});
    }
    sim.run(500, |_| {});
    let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
    let done = parts
        .logical_requests
        .iter()
        .filter(|l| l.verdict == Verdict::Done)
        .count();
    assert_eq!(done, MAX_DONE_LISTED, "the newest finished ones");
    let elided = parts.elided.expect("finished requests were left out");
    assert_eq!(elided.kept_done, MAX_DONE_LISTED as u64);
    assert!(elided.done_requests >= 150, "{elided:?}");
    assert_eq!(elided.exchanges, elided.done_requests, "one leg each");
    assert!(
        parts
            .logical_requests
            .iter()
            .any(|l| l.verdict != Verdict::Done),
        "the unfinished request is listed"
    );
    // every listed leg is in `requests`, and nothing else of a left-out request is
    let ids: std::collections::BTreeSet<&str> =
        parts.requests.iter().map(|r| r.id.as_str()).collect();
    for l in &parts.logical_requests {
        for leg in &l.legs {
            assert!(ids.contains(leg.as_str()), "{leg} of {} is listed", l.id);
        }
    }
    let finished = parts
        .requests
        .iter()
        .filter(|r| matches!(r.state, RequestState::Done | RequestState::Closed))
        .count();
    assert_eq!(finished, MAX_DONE_LISTED, "no leg of a left-out request");
}

/// A big node's socket dump takes hundreds of ms on a loaded host, and each socket's request
/// time is counted from the sample's stamp: the proxy's leg can look younger than the router's
/// by up to the dump's length. Linked when the dump was that slow; not when it was quick (a
/// parent that much younger is no parent then).
#[test]
fn a_slow_dump_widens_the_link_slack_by_its_length() {
    let run = |dump_ms: u64| {
        let mut sim = Sim::new(pd_topology());
        let client = sim.connect(None, 8000, 100);
        let hop = sim.connect(Some(100), 30000, 200);
        // As the dump saw them: the router's bytes 300 ms before the proxy's.
        sim.request(hop, 42_000);
        sim.advance(300);
        sim.request(client, 42_000);
        sim.advance(100);
        for _ in 0..4 {
            let table = sim.socket_table();
            sim.model.ingest(&wedgewatch::model::Sample {
                t_ms: sim.now,
                status: wedgewatch::model::SourceStatus::ok(),
                took_ms: dump_ms,
                payload: wedgewatch::model::Payload::Sockets(table),
            });
            sim.advance(250);
        }
        let xs: Vec<_> = sim.model.exchanges().cloned().collect();
        let at = |comp: &str| {
            xs.iter()
                .find(|x| x.component == comp)
                .cloned()
                .expect(comp)
        };
        let (px, rx) = (at(PROXY), at(ROUTER));
        rx.parent == Some(px.num)
    };
    assert!(
        run(400),
        "a 400 ms dump: the router's leg is the proxy's child"
    );
    assert!(!run(3), "a 3 ms dump: 300 ms is too far for a link");
}

/// A wedged PD request two minutes old: its prefill leg ended long before the view's window
/// (and its scope's margin), yet the view still shows the chain whole, prefill included.
#[test]
fn a_chain_is_shown_whole_though_a_leg_ended_long_before_the_window() {
    let mut sim = Sim::new(pd_topology());
    let [a, b, p, d] = pd_request(&mut sim);
    sim.run(250, |_| {});
    sim.respond(p, 200);
    sim.run(250, |_| {});
    sim.close(p);
    sim.run(120_000, |_| {});
    let v = sim.model.view(sim.now);
    let id_of = |conn: usize| {
        let client = &sim.conns[conn].client;
        v.requests
            .iter()
            .find(|r| &r.x.client == client)
            .unwrap_or_else(|| panic!("no exchange of conn {conn} in the view"))
    };
    let (prefill, decode) = (id_of(p), id_of(d));
    assert_eq!(prefill.state, RequestState::Done);
    assert!(
        wedgewatch::correlate::View::is_outstanding(decode),
        "{:?}",
        decode.state
    );
    assert_eq!(
        prefill.request, decode.request,
        "one logical request: {} / {}",
        prefill.leg, decode.leg
    );
    let _ = (a, b);
}

/// One of the router's health checks on connection `c` in a second of its own: asked (120
/// bytes) half way, answered (111 bytes) 5 ms later.
fn health_check(sim: &mut Sim, c: usize) {
    sim.advance(500);
    sim.request(c, 120);
    sim.advance(5);
    sim.respond(c, 111);
    sim.advance(495);
}

/// A router health-checks an engine every second over one keep-alive connection (120 bytes
/// in, 111 out) while the socket table is read every 2 s: two checks arrive as one exchange
/// of 240 in and 222 out, which looks like an inference request answered with headers only.
/// It is a repeat of the probe before it, not a request waiting on the engine (on the lab this
/// read as "GPU idle with a request open" on a quiet stack).
#[test]
fn probes_faster_than_the_socket_table_are_probes_not_a_waiting_request() {
    let mut sim = Sim::new(pd_topology());
    let c = sim.connect(Some(200), 31012, 400);
    sim.sample_sockets();
    // one check between two tables: a probe
    health_check(&mut sim, c);
    sim.advance(1000);
    sim.sample_sockets();
    // two checks between the next two tables
    health_check(&mut sim, c);
    health_check(&mut sim, c);
    sim.sample_sockets();
    for _ in 0..2 {
        sim.advance(1000);
        sim.sample_sockets();
    }
    assert_two_checks_are_one_probe(&sim);
}

/// The router forwards requests and health-checks over the same keep-alive connections: a
/// connection whose exchange before was an inference request (or a fresh one) has no probe of
/// its own to compare two merged checks with. The size its server answered on another
/// connection marks them (on the big lab this read as "GPU idle with request x67226 (240 B
/// in, 222 B out) open for 3051 ms" at a prefill).
#[test]
fn merged_probes_after_a_request_are_known_from_the_servers_other_connections() {
    let mut sim = Sim::new(pd_topology());
    let (a, b) = (
        sim.connect(Some(200), 31012, 400),
        sim.connect(Some(200), 31012, 400),
    );
    sim.sample_sockets();
    // a: one health check between two tables, a single probe of 120 in, 111 out
    sim.advance(500);
    sim.request(a, 120);
    // b: an inference request, answered at length
    sim.request(b, 2_600);
    sim.advance(5);
    sim.respond(a, 111);
    sim.respond(b, 4_000);
    sim.advance(1495);
    sim.sample_sockets();
    // b: two health checks between the next two tables
    health_check(&mut sim, b);
    health_check(&mut sim, b);
    sim.sample_sockets();
    for _ in 0..3 {
        sim.advance(1000);
        sim.sample_sockets();
    }
    assert_two_checks_are_one_probe(&sim);
}

/// The view's exchange of two 120/111-byte health checks cut as one (240 in) is a repeat of
/// that probe: probe-sized, not waiting, its logical request a probe.
fn assert_two_checks_are_one_probe(sim: &Sim) {
    let v = sim.model.view(sim.now);
    let merged = v
        .requests
        .iter()
        .find(|r| r.x.bytes_in == 240)
        .expect("the two checks as one exchange");
    assert_eq!(merged.x.probe_unit, Some((120, 111)));
    assert!(wedgewatch::correlate::is_probe_sized(&merged.x));
    assert!(
        !matches!(
            merged.state,
            RequestState::WaitingFirstByte | RequestState::Stalled
        ),
        "{:?}",
        merged.state
    );
    assert!(v.logical_of(merged).probe);
}

/// Counters as large as a stranger's connection makes them never overflow the repeat check.
#[test]
fn huge_counters_after_a_probe_are_no_repeat_and_no_panic() {
    let mut sim = Sim::new(pd_topology());
    let c = sim.connect(Some(200), 31012, 400);
    sim.sample_sockets();
    sim.advance(500);
    sim.request(c, 100);
    sim.advance(5);
    sim.respond(c, u64::MAX / 4);
    sim.advance(1495);
    sim.sample_sockets();
    sim.advance(500);
    sim.request(c, 100 * 1_000_000);
    sim.advance(5);
    sim.respond(c, 1);
    sim.advance(1495);
    sim.sample_sockets();
    let v = sim.model.view(sim.now);
    assert!(v.requests.iter().all(|r| r.x.probe_unit.is_none()));
}

/// A sample handed over (`ingest_owned`, the daemon's and the one-shot's way) leaves the
/// model as one read from a borrowed sample: the same parts, the same stack sockets kept
/// (a socket of no component's left out of both, and said so).
#[test]
fn a_sample_handed_over_reads_like_one_lent() {
    let mut sim = Sim::new(pd_topology());
    let mut owned = wedgewatch::correlate::Correlator::default();
    owned.ignore_client_pids.clear();
    owned.set_topology(pd_topology());
    let wedged = sim.connect(Some(200), 31012, 400);
    let done = sim.connect(None, 8000, 100);
    let foreign = sim.connect(None, 5432, 999);
    sim.request(wedged, 900);
    for i in 0..40 {
        sim.advance(250);
        if i == 4 {
            sim.request(done, 700);
            sim.request(foreign, 300);
        }
        if i == 8 {
            sim.respond(done, 4_000);
        }
        let sample = wedgewatch::model::Sample {
            t_ms: sim.now,
            status: wedgewatch::model::SourceStatus::ok(),
            took_ms: 3,
            payload: wedgewatch::model::Payload::Sockets(sim.socket_table()),
        };
        sim.model.ingest(&sample);
        owned.ingest_owned(sample);
    }
    let lent = wedgewatch::pipeline::parts(&sim.model, sim.now);
    let handed = wedgewatch::pipeline::parts(&owned, sim.now);
    let json = |p| serde_json::to_string(p).expect("json");
    assert_eq!(json(&handed), json(&lent));
    let (Some((_, a)), Some((_, b))) = (sim.model.latest_sockets(), owned.latest_sockets()) else {
        panic!("no socket table kept");
    };
    assert_eq!(a, b);
    assert!(!a.sockets.iter().any(|e| e.local.ends_with(":5432")));
    // both ends of the foreign connection
    let note = "2 sockets not of the stack omitted";
    assert!(a.notes.iter().any(|n| n.starts_with(note)), "{:?}", a.notes);
    assert!(!lent.requests.is_empty());
}

/// The demo's fourth hung request (issue 37): its proxy leg waits while its own legs below
/// ended (the router answered, decode closed without a byte), and another request is stuck
/// at decode. It is not judged stuck, and the reason recorded is the rule that kept it out
/// (its proxy still has requests open downstream), never "young" or "a busy engine"; a
/// request 5 s old is young. The report says so and its title counts the hanging one.
#[test]
fn a_waiting_request_carries_the_rule_that_kept_it_from_stuck() {
    use wedgewatch::model::{Verdict, WaitReason};
    let mut sim = Sim::new(pd_topology());
    let [_, _, p1, _] = pd_request(&mut sim);
    sim.run(250, |_| {});
    sim.respond(p1, 200); // prefill answers; decode never does
    sim.run(250, |_| {});
    sim.close(p1);
    sim.run(1000, |_| {});
    let [a2, b2, p2, d2] = pd_request(&mut sim);
    sim.run(250, |_| {});
    sim.respond(p2, 200);
    sim.close(p2);
    sim.respond(b2, 5000); // the router answered on its connection...
    sim.close(d2); // ...decode closed without a byte, and the proxy never answered
    sim.run(33_000, |_| {});
    let [a3, ..] = pd_request(&mut sim);
    sim.run(5_000, |_| {});
    let _ = (a2, a3);

    let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
    let by_verdict = |v: Verdict| -> Vec<&wedgewatch::model::LogicalRequest> {
        parts
            .logical_requests
            .iter()
            .filter(|l| l.verdict == v && !l.probe)
            .collect()
    };
    let stuck = by_verdict(Verdict::Stuck);
    assert_eq!(stuck.len(), 1, "{:#?}", parts.logical_requests);
    assert_eq!(stuck[0].stuck_role, Some(Role::Decode));
    let waiting = by_verdict(Verdict::Waiting);
    let reasons: Vec<_> = waiting
        .iter()
        .map(|l| (l.waiting_reason, l.waiting_leg.as_deref().unwrap_or("")))
        .collect();
    assert_eq!(reasons.len(), 2, "{:#?}", parts.logical_requests);
    assert!(
        reasons
            .iter()
            .any(|(w, leg)| *w == Some(WaitReason::DownstreamOpen) && leg.ends_with("@proxy")),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|(w, _)| *w == Some(WaitReason::Young)),
        "{reasons:?}"
    );

    let snap = wedgewatch::snapshot::assemble(parts, &Default::default());
    let md = wedgewatch::report::render(&snap);
    let title = md.lines().next().unwrap_or_default();
    assert!(
        title.starts_with("# wedged_request at decode: 1 request accepted and forgotten")
            && title.ends_with(", 1 more waiting up to 38 s (not judged stuck)"),
        "{title}"
    );
    let line = md
        .lines()
        .find(|l| l.contains("other requests open downstream"))
        .unwrap_or_else(|| panic!("{md}"));
    assert!(
        line.contains("at proxy") && line.contains("decode closed (0 B out)"),
        "{line}"
    );
    assert!(!md.contains("busy engine"), "{md}");
    assert!(
        md.contains("- 1 young (not yet waiting for the wedge threshold)"),
        "{md}"
    );
}
