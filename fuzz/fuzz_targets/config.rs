//! Fuzz target `config`: the checks of `replay_guard::fuzzing::config`, which the integration suite
//! also runs on every file in `fuzz/regressions/config/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    replay_guard::fuzzing::config(data);
});
