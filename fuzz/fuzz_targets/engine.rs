//! Fuzz target `engine`: the checks of `replay_guard::fuzzing::engine`, which the integration suite
//! also runs on every file in `fuzz/regressions/engine/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    replay_guard::fuzzing::engine(data);
});
