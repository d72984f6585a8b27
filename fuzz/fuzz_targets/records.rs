//! Fuzz target `records`: the checks of `replay_guard::fuzzing::records`, which the integration suite
//! also runs on every file in `fuzz/regressions/records/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    replay_guard::fuzzing::records(data);
});
