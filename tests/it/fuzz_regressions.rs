//! Replays the committed fuzz inputs (`fuzz/regressions/TARGET/*`, minimised corpora and the
//! inputs behind each fix) through the same checks the cargo-fuzz targets run
//! (`replay_guard::fuzzing`), so every finding stays fixed in the normal suite.

use std::path::Path;

use replay_guard::fuzzing::TARGETS;

fn inputs(target: &str) -> Vec<std::path::PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/regressions")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "no regression inputs in {}",
        dir.display()
    );
    files
}

fn replay(target: &str) {
    let check = TARGETS
        .iter()
        .find(|(name, _)| *name == target)
        .map(|(_, f)| *f)
        .unwrap();
    for file in inputs(target) {
        let bytes = std::fs::read(&file).unwrap();
        if std::panic::catch_unwind(|| check(&bytes)).is_err() {
            panic!("{target}: {} breaks its invariant", file.display());
        }
    }
}

#[test]
fn every_target_has_committed_regression_inputs() {
    let dirs: Vec<String> =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
    for (name, _) in TARGETS {
        assert!(
            dirs.iter().any(|d| d == name),
            "fuzz/regressions/{name} is missing"
        );
    }
}

#[test]
fn decode_inputs_keep_digests_equal_under_reordering_respacing_and_reescaping() {
    replay("decode");
}

#[test]
fn config_inputs_parse_or_fail_in_one_line() {
    replay("config");
}

#[test]
fn broker_codec_inputs_decode_or_are_refused_without_panicking() {
    replay("broker_codec");
}

#[test]
fn records_inputs_decode_or_are_refused_without_panicking() {
    replay("records");
}

#[test]
fn engine_inputs_decide_as_the_reference_model() {
    replay("engine");
}
