//! Fuzz target `decode`: the checks of `replay_guard::fuzzing::payload`, which the integration suite
//! also runs on every file in `fuzz/regressions/decode/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    replay_guard::fuzzing::payload(data);
});
