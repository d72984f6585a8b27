//! Fuzz target `broker_codec`: the checks of `replay_guard::fuzzing::broker_codec`, which the integration suite
//! also runs on every file in `fuzz/regressions/broker_codec/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    replay_guard::fuzzing::broker_codec(data);
});
