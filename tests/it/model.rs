//! Reference-model property test: random multi-source feeds with exact replays, re-serialised
//! resends, conflicts, reorders, epoch bumps, malformed bytes and a small window that forces
//! eviction, run through the real store (files on disk) and compared with the in-memory model
//! in `replay_guard::fuzzing::model`, which the `engine` fuzz target shares.

use proptest::prelude::*;
use replay_guard::fuzzing::model::{Case, Op, run_case};
use replay_guard::store::{Backend, Store};

pub fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..4, prop::bool::weighted(0.05)).prop_map(|(src, bump)| Op::Fresh { src, bump }),
        2 => any::<usize>().prop_map(Op::Exact),
        1 => any::<usize>().prop_map(Op::Reserialise),
        1 => any::<usize>().prop_map(Op::Conflict),
        1 => prop::collection::vec(any::<u8>(), 0..40).prop_map(Op::Malformed),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn engine_matches_the_reference_model_and_never_applies_twice_or_loses_an_event(
        ops in prop::collection::vec(op(), 1..160),
        swaps in prop::collection::vec(any::<usize>(), 0..20),
        batch_sizes in prop::collection::vec(1usize..24, 1..6),
        steps_ms in prop::collection::vec(0u64..3_000, 1..6),
        max_entries in 1u64..24,
        window_secs in 1u64..10,
        quarantine_late in prop::bool::weighted(0.3),
    ) {
        let case = Case { ops, swaps, batch_sizes, steps_ms, max_entries, window_secs, quarantine_late };
        let dir = tempfile::tempdir().unwrap();
        let mut n = 0;
        let mut open = |opts| {
            n += 1;
            Store::open(&dir.path().join(format!("m{n}.redb")), opts, 1_000).map(Backend::Redb)
        };
        run_case(&case, &mut open).map_err(TestCaseError::fail)?;
    }
}
