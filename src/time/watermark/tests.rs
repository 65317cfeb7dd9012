use proptest::prelude::*;

use super::*;

const SEC: i64 = 1_000;
const MIN: i64 = 60_000;
/// The shipped defaults: a 5 s bound, 30 s of lateness and `max_lead = "auto"`
/// (the lateness).
const BOUND: i64 = 5 * SEC;
const LATENESS: i64 = 30 * SEC;
const LEAD: i64 = LATENESS;
const DAY: i64 = 24 * 60 * MIN;

/// Whether a record at `ts` is too late for watermark `w` (one-minute windows):
/// its window's purge line `end - 1 + lateness` is at or below the watermark.
fn too_late(ts: i64, w: i64) -> bool {
    let end = (ts.div_euclid(MIN) + 1) * MIN;
    end - 1 + LATENESS <= w
}

#[test]
fn bounded_out_of_orderness_never_goes_back() {
    let mut w = Watermark::new(5_000, None);
    assert_eq!(w.current(), i64::MIN);
    assert!(w.observe(10_000));
    assert_eq!(w.current(), 5_000);
    assert!(!w.observe(7_000)); // out of order inside the bound
    assert_eq!(w.current(), 5_000);
    assert!(w.observe(69_000));
    assert_eq!(w.current(), 64_000);
}

#[test]
fn monotonous_is_bound_zero_and_force_only_raises() {
    let mut w = Watermark::new(0, None);
    w.observe(100);
    assert_eq!(w.current(), 100);
    assert!(w.force(500));
    assert!(!w.force(200));
    assert_eq!(w.current(), 500);
    w.observe(600);
    assert_eq!(w.current(), 600);
}

/// One producer in twenty leads by `lead`, steadily: the watermark follows the
/// other nineteen, and the leader's records are held, whatever the lead.
#[test]
fn a_steady_minority_ahead_is_held() {
    for lead in [MIN, 2 * MIN, 4 * MIN, 30 * MIN, DAY, 1_000 * 365 * DAY] {
        let mut w = Watermark::new(BOUND, Some(LEAD));
        let mut held = 0;
        for i in 0..20_000i64 {
            let t = 1_000_000 + i * 10;
            if i % 20 == 7 {
                w.observe(t + lead);
                held += 1;
            } else {
                w.observe(t);
            }
            assert!(w.current() <= t, "lead {lead}, record {i}");
        }
        assert_eq!(w.held(), held);
        assert_eq!(w.max_ts(), Some(1_000_000 + 19_999 * 10));
    }
}

/// A burst of `RECENT / 2` consecutive records from a leading host moves
/// nothing; the whole partition moving on is followed after `RECENT / 2 + 1`.
#[test]
fn a_burst_is_held_and_a_majority_ahead_is_a_real_jump() {
    let mut w = Watermark::new(0, Some(LEAD));
    for i in 0..5_000 {
        w.observe(i);
    }
    for i in 0..(RECENT / 2) as i64 {
        w.observe(60 * MIN + i);
    }
    assert_eq!(w.max_ts(), Some(4_999));
    for i in 5_000..5_200 {
        w.observe(i);
    }
    assert_eq!(w.max_ts(), Some(5_199));
    // The whole partition moves an hour on: followed once a majority of RECENT leads.
    let mut moved_at = None;
    for i in 0..RECENT as i64 {
        w.observe(120 * MIN + i);
        if moved_at.is_none() && w.max_ts() > Some(120 * MIN) {
            moved_at = Some(i);
        }
    }
    // The burst's records still among the latest RECENT lead too: they make the
    // majority sooner, but the median reaches the new hour only with RECENT / 2.
    assert_eq!(moved_at, Some(RECENT as i64 / 2));
    // From there on it follows every record again.
    let next = 120 * MIN + RECENT as i64 + 10 * SEC;
    w.observe(next);
    assert_eq!(w.max_ts(), Some(next));
}

/// A jump with nothing else leading in the window takes exactly `RECENT / 2 + 1`
/// records: the bound in records that DESIGN §4.4 states.
#[test]
fn a_real_jump_is_followed_after_half_the_window_and_one() {
    let mut w = Watermark::new(0, Some(LEAD));
    for i in 0..RECENT as i64 {
        w.observe(i);
    }
    let mut n = 0;
    while w.max_ts() < Some(DAY) {
        w.observe(DAY + n);
        n += 1;
    }
    assert_eq!(n, RECENT as i64 / 2 + 1);
}

/// A wild first record (a day ahead, or in microseconds) does not start the
/// partition: the third smallest of the first eight does.
#[test]
fn a_wild_first_record_does_not_start_the_partition() {
    let t0 = 1_767_261_600_000;
    for wild in [t0 + DAY, t0 * 1_000] {
        let mut w = Watermark::new(0, Some(LEAD));
        w.observe(wild);
        for i in 1..START as i64 - 1 {
            w.observe(t0 + i);
            assert_eq!(w.current(), i64::MIN, "started before {START} records");
        }
        for i in START as i64 - 1..1_000 {
            w.observe(t0 + i);
        }
        assert_eq!((w.current(), w.held()), (t0 + 999, 1));
    }
}

/// Idleness moves the reference: records after a forced advance are near it.
#[test]
fn a_forced_advance_moves_the_reference() {
    let mut w = Watermark::new(1_000, Some(5 * MIN));
    for t in [0, 10, 20] {
        w.observe(t);
    }
    w.force(60 * MIN);
    assert!(w.observe(60 * MIN + 2 * MIN));
    assert_eq!(w.held(), 0);
}

#[test]
fn the_lead_state_restores() {
    let mut w = Watermark::new(0, Some(MIN));
    for t in [0, 10, 20, 30, 40, 50, 60, 70, 10 * MIN, 80] {
        w.observe(t);
    }
    let (b, m, f) = w.parts();
    let (recent, held) = w.lead_parts();
    assert_eq!(held, 1);
    let back = Watermark::from_parts(b, m, f)
        .with_lead_state(recent, held)
        .with_max_lead(Some(MIN));
    assert_eq!(back, w);
}

/// One record of the stream: an agreeing producer's (disorder within the bound)
/// or a leading one's.
#[derive(Debug, Clone)]
enum Source {
    Agreeing { disorder: i64 },
    Leading,
}

/// A stream of agreeing records with leaders mixed in, with one lead for the
/// run: interleaved at random (up to 10 %), or one burst of up to 1,000 with
/// every 100th record leading besides (so that no window of RECENT holds a
/// majority of leaders: 1,000 + 11 + the start's 2 at most).
fn streams() -> impl Strategy<Value = (Vec<(i64, Source)>, i64)> {
    let lead = prop_oneof![
        Just(10 * SEC),
        Just(LEAD - 1),
        Just(LEAD),
        Just(MIN),
        Just(2 * MIN),
        Just(4 * MIN),
        Just(30 * MIN),
        Just(DAY),
        (LEAD..10 * DAY),
    ];
    (
        lead,
        1usize..=10,
        prop_oneof![Just(0usize), 1usize..=1_000],
        0usize..3_000,
        1i64..=200,
        proptest::collection::vec((0u32..100, 0i64..=BOUND), 3_000..6_000),
    )
        .prop_map(|(lead, percent, burst, burst_at, step, draws)| {
            let mut out = Vec::new();
            let mut t = 1_767_261_600_000i64;
            for (i, (roll, disorder)) in draws.into_iter().enumerate() {
                if i == burst_at.max(START) {
                    for _ in 0..burst {
                        out.push((t, Source::Leading));
                    }
                }
                t += step;
                // A partition's start needs START_RANK + 1 agreeing records among its
                // first START (DESIGN §4.4): the first ones agree.
                let leads = if burst > 0 {
                    i % 100 == 7
                } else {
                    (roll as usize) < percent
                };
                let src = if i > START_RANK && leads {
                    Source::Leading
                } else {
                    Source::Agreeing { disorder }
                };
                out.push((t, src));
            }
            (out, lead)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// DESIGN §4.4 under the defaults: no agreeing record is ever too late, and a
    /// replay of the same stream computes the same watermarks.
    #[test]
    fn no_leading_minority_makes_an_agreeing_record_late((stream, lead) in streams()) {
        let run = || {
            let mut w = Watermark::new(BOUND, Some(LEAD));
            let mut trail = Vec::with_capacity(stream.len());
            for (t, src) in &stream {
                let ts = match src {
                    Source::Agreeing { disorder } => t - disorder,
                    Source::Leading => t + lead,
                };
                if matches!(src, Source::Agreeing { .. }) {
                    prop_assert!(!too_late(ts, w.current()),
                        "agreeing {ts} late at watermark {} (lead {lead})", w.current());
                }
                w.observe(ts);
                trail.push(w.current());
            }
            Ok(trail)
        };
        prop_assert_eq!(run()?, run()?);
    }
}
