//! Fuzzing on the stable toolchain: random and mutated inputs for every
//! decoder of external bytes, as proptest strategies.
//!
//! A fuzz test is a proptest named `fuzz_*` run with [`config`]: a few
//! hundred cases in the normal test run, and as many as
//! `BATON_FUZZ_CASES` asks in `cargo xtask fuzz` (10⁶ per decoder by
//! default). Inputs are arbitrary bytes or text, half of the time a valid
//! sample ([`bytes`]'s seeds) edited a few times (bytes flipped, spans
//! deleted, repeated or replaced), which reaches far deeper into a decoder
//! than noise does. A test asserts that decoding returns a value or a
//! classified error: a panic fails it, and proptest shrinks the input.

use proptest::prelude::*;
use proptest::test_runner::Config;

/// Cases per fuzz test in a normal test run.
const DEFAULT_CASES: u32 = 256;

/// How many cases each fuzz test runs: `BATON_FUZZ_CASES`, else a few hundred.
pub fn cases() -> u32 {
    std::env::var("BATON_FUZZ_CASES")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(DEFAULT_CASES)
}

/// The proptest configuration of a fuzz test: [`cases`] cases, failures
/// persisted beside the test's source like every proptest's.
pub fn config() -> Config {
    Config {
        cases: cases(),
        // Shrinking a failure of a million-case run must not take an hour.
        max_shrink_iters: 4_096,
        ..Config::default()
    }
}

/// One edit of a sample.
#[derive(Clone, Debug)]
enum Edit {
    Flip { at: usize, bit: u8 },
    Delete { at: usize, len: usize },
    Repeat { at: usize, len: usize },
    Replace { at: usize, with: Vec<u8> },
    Truncate { at: usize },
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Edit::Flip { at, bit }),
        (any::<usize>(), 1usize..16).prop_map(|(at, len)| Edit::Delete { at, len }),
        (any::<usize>(), 1usize..16).prop_map(|(at, len)| Edit::Repeat { at, len }),
        (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(at, with)| Edit::Replace { at, with }),
        any::<usize>().prop_map(|at| Edit::Truncate { at }),
    ]
}

fn apply(sample: &mut Vec<u8>, edit: &Edit) {
    if sample.is_empty() {
        return;
    }
    let len = sample.len();
    match edit {
        Edit::Flip { at, bit } => sample[at % len] ^= 1 << bit,
        Edit::Delete { at, len: n } => {
            let at = at % len;
            let end = (at + n).min(len);
            sample.drain(at..end);
        }
        Edit::Repeat { at, len: n } => {
            let at = at % len;
            let end = (at + n).min(len);
            let span = sample[at..end].to_vec();
            sample.splice(end..end, span);
        }
        Edit::Replace { at, with } => {
            let at = at % len;
            let end = (at + with.len()).min(len);
            sample.splice(at..end, with.iter().copied());
        }
        Edit::Truncate { at } => sample.truncate(at % len),
    }
}

/// Arbitrary bytes half of the time, else one of `seeds` edited one to
/// eight times.
pub fn bytes(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    let seeds = if seeds.is_empty() {
        vec![Vec::new()]
    } else {
        seeds
    };
    let count = seeds.len();
    let mutated =
        (0..count, proptest::collection::vec(edit(), 1..8)).prop_map(move |(index, edits)| {
            let mut sample = seeds[index].clone();
            for edit in &edits {
                apply(&mut sample, edit);
            }
            sample
        });
    prop_oneof![proptest::collection::vec(any::<u8>(), 0..512), mutated]
}

/// Text made from [`bytes`] (invalid UTF-8 replaced), for decoders that
/// take `&str`.
pub fn text(seeds: Vec<String>) -> impl Strategy<Value = String> {
    bytes(seeds.into_iter().map(String::into_bytes).collect())
        .prop_map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    use super::*;

    #[test]
    fn samples_are_noise_and_edited_seeds_about_half_each() {
        let seed = br#"{"a":[1,2,3],"b":"some text","c":{"d":null}}"#.to_vec();
        let strategy = bytes(vec![seed.clone()]);
        let mut runner = TestRunner::deterministic();
        let (mut edited, mut unchanged, mut other) = (0, 0, 0);
        for _ in 0..1_000 {
            let sample = strategy.new_tree(&mut runner).expect("a sample").current();
            let shared = sample.iter().zip(&seed).take_while(|(a, b)| a == b).count();
            if sample == seed {
                unchanged += 1;
            } else if shared >= 3 || sample.ends_with(&seed[seed.len() - 3..]) {
                edited += 1;
            } else {
                other += 1;
            }
        }
        assert!(edited > 250, "{edited} edited seeds of 1000");
        assert!(other > 250, "{other} noise samples of 1000");
        assert!(
            unchanged < 100,
            "{unchanged} samples left the seed as it was"
        );
    }
}
