//! Randomized tests of the Prometheus parser: garbage, mutated real expositions and
//! generated valid lines. Deterministic (seeded xorshift) so a failure reproduces; the seed
//! and the input are printed on failure.

use std::collections::BTreeMap;
use wedgewatch::prom::{parse, parse_bytes};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const REAL: &str = r#"# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="decode",model_name="meta-llama/Llama-3.1-8B-Instruct",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 162.0
sglang_num_queue_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 2826.0
# TYPE sglang:forward_execution_seconds_total counter
sglang:forward_execution_seconds_total{category="decode"} 12.5
sglang:forward_execution_seconds_created{category="decode"} 1.795963857e+09
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="0.3",model_name="m"} 0.0
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 4.0
vllm:e2e_request_latency_seconds_sum{model_name="m"} 9.5
vllm:e2e_request_latency_seconds_count{model_name="m"} 4.0
smg_worker_requests_active{worker="http://127.0.0.1:31011"} 2
smg_http_inflight_request_age_count{gt="0",le="30"} 0
weird{path="quote\" backslash\\ newline\n end"} NaN 1700000000000
pos +Inf
neg -Inf
"#;

fn sample_lines(text: &str) -> usize {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .count()
}

#[test]
fn real_exposition_parses_exactly() {
    let e = parse(REAL);
    assert_eq!(e.bad_lines, 0);
    assert_eq!(e.series.len(), sample_lines(REAL));
    let w = e.series.iter().find(|s| s.name == "weird").unwrap();
    assert_eq!(w.labels["path"], "quote\" backslash\\ newline\n end");
}

#[test]
fn garbage_never_panics_and_counts_stay_sane() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for round in 0..2000 {
        let len = rng.below(400);
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                // Bias toward the parser's syntax so deep paths are reached.
                const ALPHABET: &[u8] = b"ab_:{}=\",\\ \n#.-+eE0123456789NaInf\t";
                if rng.below(3) == 0 {
                    rng.next() as u8
                } else {
                    ALPHABET[rng.below(ALPHABET.len())]
                }
            })
            .collect();
        let text = String::from_utf8_lossy(&bytes);
        let e = parse(&text);
        let n = sample_lines(&text);
        assert_eq!(
            e.series.len() + e.bad_lines as usize,
            n,
            "round {round}: every non-comment line is a series or a bad line: {text:?}"
        );
        let t = parse_bytes(&bytes, rng.below(2) == 0);
        assert!(t.series.len() + t.bad_lines as usize <= n, "round {round}");
    }
}

#[test]
fn mutated_real_expositions_never_panic() {
    let mut rng = Rng(12345);
    let base = REAL.as_bytes();
    let good = sample_lines(REAL);
    for round in 0..3000 {
        let mut b = base.to_vec();
        for _ in 0..1 + rng.below(8) {
            if b.is_empty() {
                break;
            }
            let i = rng.below(b.len());
            match rng.below(5) {
                0 => b[i] = rng.next() as u8,
                1 => {
                    b.remove(i);
                }
                2 => b.insert(i, b"{}\"\\=, \n"[rng.below(8)]),
                3 => b.truncate(i),
                _ => {
                    let j = rng.below(b.len());
                    b.swap(i, j)
                }
            }
        }
        let text = String::from_utf8_lossy(&b);
        let e = parse(&text);
        assert_eq!(
            e.series.len() + e.bad_lines as usize,
            sample_lines(&text),
            "round {round}: {text:?}"
        );
        // A few byte mutations cannot destroy most of 16 good lines.
        if b.len() == base.len() {
            assert!(
                e.series.len() + 10 >= good,
                "round {round}: {}",
                e.series.len()
            );
        }
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[test]
fn generated_valid_lines_round_trip() {
    let mut rng = Rng(777);
    let first = b"abcXYZ_:";
    let rest = b"abcXYZ_:0129";
    let lfirst = b"abz_";
    let vchars = ['a', '"', '\\', '\n', ' ', '{', '}', ',', '=', 'é', '0'];
    for round in 0..2000 {
        let mut name = String::new();
        name.push(first[rng.below(first.len())] as char);
        for _ in 0..rng.below(12) {
            name.push(rest[rng.below(rest.len())] as char);
        }
        let mut labels = BTreeMap::new();
        for _ in 0..rng.below(4) {
            let mut k = String::new();
            k.push(lfirst[rng.below(lfirst.len())] as char);
            for _ in 0..rng.below(6) {
                k.push(b"az_09"[rng.below(5)] as char);
            }
            let v: String = (0..rng.below(8))
                .map(|_| vchars[rng.below(vchars.len())])
                .collect();
            labels.insert(k, v);
        }
        let value = (rng.next() % 1_000_000) as f64 / 8.0;
        let body: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
            .collect();
        let ts = if rng.below(2) == 0 {
            " 1700000000000"
        } else {
            ""
        };
        let line = if labels.is_empty() && rng.below(2) == 0 {
            format!("{name} {value}{ts}")
        } else {
            format!("{name}{{{}}} {value}{ts}", body.join(","))
        };
        let e = parse(&line);
        assert_eq!(e.bad_lines, 0, "round {round}: {line:?}");
        assert_eq!(e.series.len(), 1, "round {round}: {line:?}");
        assert_eq!(e.series[0].name, name);
        assert_eq!(e.series[0].labels, labels, "round {round}: {line:?}");
        assert_eq!(e.series[0].value, value);
    }
}

/// The bounded parse under tight limits: never more series than the limit, never more
/// unwanted ones than the sample, never a series over the label-byte bound.
#[test]
fn bounded_parse_respects_its_limits_on_garbage() {
    use wedgewatch::prom::{parse_limited, ParseLimits};
    let mut rng = Rng(0xDEAD_BEEF);
    let base = REAL.as_bytes();
    for round in 0..2000 {
        let mut b: Vec<u8> = Vec::new();
        for _ in 0..rng.below(6) {
            b.extend_from_slice(base);
        }
        for _ in 0..rng.below(20) {
            if b.is_empty() {
                break;
            }
            let i = rng.below(b.len());
            const SYNTAX: &[u8] = b"{}\"\\=, \nab:_0";
            b[i] = SYNTAX[rng.below(SYNTAX.len())];
        }
        let limits = ParseLimits {
            max_series: rng.below(40),
            raw_sample: rng.below(10),
            max_label_bytes: rng.below(80),
        };
        let wanted = |n: &str| n.starts_with("sglang");
        let e = parse_limited(&b, rng.below(2) == 0, &limits, &wanted);
        assert!(e.series.len() <= limits.max_series, "round {round}");
        let unwanted = e.series.iter().filter(|s| !wanted(&s.name)).count();
        assert!(unwanted <= limits.raw_sample, "round {round}");
        for s in &e.series {
            let lb: usize = s.labels.iter().map(|(k, v)| k.len() + v.len()).sum();
            assert!(lb <= limits.max_label_bytes, "round {round}: {s:?}");
        }
        assert!(e.types.len() <= limits.max_series && e.help.len() <= limits.max_series);
    }
}

/// The HTTP answer reader on random and mutated answers: never panics, never keeps more than
/// the cap.
#[test]
fn http_answers_never_panic_and_respect_the_cap() {
    use wedgewatch::sys::http::parse_response;
    let mut rng = Rng(42);
    let good = b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
    for round in 0..3000 {
        let mut b = good.to_vec();
        for _ in 0..1 + rng.below(10) {
            if b.is_empty() {
                break;
            }
            let i = rng.below(b.len());
            match rng.below(3) {
                0 => b[i] = rng.next() as u8,
                1 => b.truncate(i),
                _ => b.insert(i, b"\r\n:0f;"[rng.below(6)]),
            }
        }
        let cap = rng.below(64);
        let p = parse_response(&b, cap);
        assert!(p.body.len() <= cap, "round {round}: {b:?}");
    }
}
