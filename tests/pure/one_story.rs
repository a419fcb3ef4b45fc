//! One story in every output (issue 13, item 1): which requests are stuck is the
//! correlator's verdict, computed once. The finding's count and listed ids (logical ids, one
//! per request, not one per hop), the TUI's "(N stuck)" and the report's stuck table must
//! name the same requests (`common/story.rs`), on the committed snapshot fixtures and on
//! every frame of the committed recording of a wedged decode engine. (The lab's wedge and
//! stalled stream are checked the same way in `e2e_lab.rs`.)
#![cfg(feature = "tui")]

use wedgewatch_testkit::story;

use std::path::{Path, PathBuf};
use story::one_story;
use wedgewatch::model::{Snapshot, Thresholds};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

#[test]
fn committed_snapshots_tell_one_story() {
    for (name, stuck) in [("healthy", 0), ("wedged", 2), ("degraded", 0)] {
        let path = fixtures().join("snapshots").join(format!("{name}.json"));
        let s: Snapshot =
            serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("json");
        assert_eq!(one_story(name, &s), stuck, "{name}");
    }
}

#[test]
fn every_frame_of_the_wedged_recording_tells_one_story() {
    let rec = wedgewatch::record::Recording::open(&fixtures().join("recordings/wedged-decode.rec"))
        .expect("recording");
    let text = std::fs::read_to_string(fixtures().join("recordings/short-hang-thresholds.toml"))
        .expect("thresholds");
    let th = Thresholds::from_toml(&text).expect("thresholds");
    let (frames, _) = wedgewatch::attach::replay_frames_counted(&rec, 1000, th).expect("replay");
    assert!(frames.len() > 5, "{} frames", frames.len());
    let mut most = 0;
    for (i, p) in frames.into_iter().enumerate() {
        let s = wedgewatch::snapshot::assemble(p, &Default::default());
        most = most.max(one_story(&format!("frame {i}"), &s));
    }
    assert!(most > 0, "the decode engine's requests end up stuck");
}
