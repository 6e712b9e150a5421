//! Router-side prefill bookings: a routed request's prompt tokens count in
//! its rank's `active_prefill_tokens` until its prefill is done, so the
//! prefill thresholds work beside workers that never report prefill tokens
//! (Dynamo 1.6.1's leave the field nil).

use loadgate::{LoadReport, Monitor, ThresholdUpdate, WorkerSpec};

const M: &str = "llama";

fn monitor(dp_size: u32, max_num_batched_tokens: Option<u64>) -> Monitor {
    let m = Monitor::new();
    let spec = WorkerSpec {
        dp_size,
        kv_total_blocks: Some(1000),
        max_num_batched_tokens,
        ..Default::default()
    };
    m.add_worker(M, 1, spec).unwrap();
    m
}

fn absolute(n: u64) -> ThresholdUpdate {
    ThresholdUpdate {
        active_prefill_tokens_threshold: Some(n),
        ..Default::default()
    }
}

#[test]
fn prompt_tokens_count_until_prefill_is_done_and_blocks_until_release() {
    let m = monitor(1, None);
    m.set_thresholds(M, &absolute(100)).unwrap();
    let mut a = m.book_with_prefill(1, 0, 4, 60).unwrap();
    assert_eq!(m.rank_load(1, 0).unwrap().active_prefill_tokens, Some(60));
    assert!(!m.is_busy(1).unwrap(), "60 is not above 100");
    let b = m.book_with_prefill(1, 0, 3, 50).unwrap();
    assert_eq!(m.rank_load(1, 0).unwrap().active_prefill_tokens, Some(110));
    assert!(m.is_busy(1).unwrap(), "110 > 100");
    a.prefill_done();
    assert_eq!(a.prefill_tokens(), 0);
    assert_eq!(m.rank_load(1, 0).unwrap().active_prefill_tokens, Some(50));
    assert!(!m.is_busy(1).unwrap(), "the first token frees the prompt");
    assert_eq!(
        m.rank_load(1, 0).unwrap().active_decode_blocks,
        7,
        "blocks stay"
    );
    a.prefill_done();
    assert_eq!(
        m.rank_load(1, 0).unwrap().active_prefill_tokens,
        Some(50),
        "prefill_done twice frees once"
    );
    drop(b);
    assert_eq!(m.rank_load(1, 0).unwrap().active_prefill_tokens, Some(0));
    assert_eq!(m.rank_load(1, 0).unwrap().active_decode_blocks, 4);
    a.release();
    assert_eq!(m.rank_load(1, 0).unwrap().active_decode_blocks, 0);
}

#[test]
fn a_booking_without_prefill_leaves_an_unreported_rank_out_of_the_prefill_check() {
    let m = monitor(1, None);
    m.set_thresholds(M, &absolute(0)).unwrap();
    let booking = m.book(1, 0, 5).unwrap();
    assert_eq!(m.rank_load(1, 0).unwrap().active_prefill_tokens, None);
    assert!(
        !m.is_busy(1).unwrap(),
        "a rank with no prefill count is never prefill-busy"
    );
    drop(booking);
    let booking = m.book_with_prefill(1, 0, 5, 1).unwrap();
    assert!(m.is_busy(1).unwrap(), "1 > 0 once booked");
    drop(booking);
    assert_eq!(
        m.rank_load(1, 0).unwrap().active_prefill_tokens,
        Some(0),
        "a booked rank stays counted, at zero"
    );
    assert!(!m.is_busy(1).unwrap());
}

#[test]
fn the_fractional_threshold_reads_the_booked_tokens() {
    let m = monitor(1, Some(1000));
    m.set_thresholds(
        M,
        &ThresholdUpdate {
            active_prefill_tokens_threshold_frac: Some(1.5),
            ..Default::default()
        },
    )
    .unwrap();
    let a = m.book_with_prefill(1, 0, 1, 1500).unwrap();
    assert!(
        !m.is_busy(1).unwrap(),
        "1500 is not above floor(1.5 · 1000)"
    );
    let b = m.book_with_prefill(1, 0, 1, 1).unwrap();
    assert!(m.is_busy(1).unwrap());
    drop((a, b));
    assert!(!m.is_busy(1).unwrap());
}

#[test]
fn a_worker_is_prefill_busy_only_when_every_rank_is() {
    let m = monitor(2, None);
    m.set_thresholds(M, &absolute(10)).unwrap();
    let a = m.book_with_prefill(1, 0, 1, 20).unwrap();
    assert!(!m.is_busy(1).unwrap(), "rank 1 has no prefill count: free");
    let mut b = m.book_with_prefill(1, 1, 1, 20).unwrap();
    assert!(m.is_busy(1).unwrap());
    b.prefill_done();
    assert!(!m.is_busy(1).unwrap());
    drop(a);
}

#[test]
fn absurd_token_counts_saturate_and_unwind() {
    let m = monitor(1, None);
    m.set_thresholds(M, &absolute(u64::MAX - 2)).unwrap();
    let a = m.book_with_prefill(1, 0, 0, u64::MAX).unwrap();
    let b = m.book_with_prefill(1, 0, 0, u64::MAX).unwrap();
    let load = m.rank_load(1, 0).unwrap().active_prefill_tokens;
    assert_eq!(
        load,
        Some(u64::MAX - 1),
        "stops below the unreported marker"
    );
    assert!(m.is_busy(1).unwrap());
    drop(a);
    drop(b);
    assert_eq!(m.rank_load(1, 0).unwrap().active_prefill_tokens, Some(0));
    assert!(!m.is_busy(1).unwrap());
}

#[test]
fn a_report_overwrites_the_booked_count_and_releases_stop_at_zero() {
    let m = monitor(1, None);
    m.set_thresholds(M, &absolute(100)).unwrap();
    let booking = m.book_with_prefill(1, 0, 0, 150).unwrap();
    assert!(m.is_busy(1).unwrap());
    let report = LoadReport {
        active_prefill_tokens: Some(40),
        ..Default::default()
    };
    m.report(1, 0, &report).unwrap();
    assert!(!m.is_busy(1).unwrap(), "the report is the newer count");
    drop(booking);
    assert_eq!(m.rank_load(1, 0).unwrap().active_prefill_tokens, Some(0));
}

#[test]
fn unknown_workers_and_ranks_are_refused() {
    let m = monitor(1, None);
    assert!(m.book_with_prefill(9, 0, 1, 1).is_err());
    assert!(m.book_with_prefill(1, 3, 1, 1).is_err());
    assert_eq!(m.rank_load(1, 0).unwrap().active_prefill_tokens, None);
}
