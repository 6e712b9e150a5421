//! SLO admission's advisory part (`Monitor::set_slo`, docs/behaviour.md):
//! with an SLO set, the bookings' stream hooks observe each rank's steps,
//! the maintenance fits them, and `predict` gives the time to first token
//! and per output token a new request would see there; without one,
//! nothing is observed. On a manual clock, against a known step function.

use std::time::Duration;

mod support;

use loadgate::slo::Slo;
use loadgate::{Booking, ManualClock, Monitor, SloMode, WorkerSpec};
use support::slo_engine::{monitor_with, serve, step, BATCH};

fn monitor() -> (Monitor, std::sync::Arc<ManualClock>) {
    monitor_with(WorkerSpec {
        dp_size: 2,
        kv_total_blocks: Some(10_000),
        max_num_batched_tokens: Some(BATCH),
        ..Default::default()
    })
}

#[test]
fn without_an_slo_nothing_is_observed_or_shown() {
    let (m, clock) = monitor();
    assert_eq!(m.slo("m"), None);
    let mut b = m.book_with_prefill(1, 0, 10, 100).unwrap();
    clock.advance(Duration::from_millis(50));
    b.first_token();
    b.tokens(3);
    m.maintain();
    assert_eq!(m.prediction_errors(1, 0).unwrap(), (1.0, 1.0));
    assert!(!m.metrics_text().contains("frontend_slo_"));
    assert!(!m.predict(1, 0, 100).unwrap().trusted);
}

#[test]
fn the_fit_from_streamed_tokens_predicts_the_engine() {
    let (m, clock) = monitor();
    m.set_slo(
        "m",
        Some(Slo::from_secs(2.0, 0.1).unwrap()),
        SloMode::Advisory,
    )
    .unwrap();
    assert_eq!(
        m.slo("m"),
        Some((Slo::from_secs(2.0, 0.1).unwrap(), SloMode::Advisory))
    );
    let prefill = serve(&m, &clock, 3_000);
    let (fit_error, _) = m.prediction_errors(1, 0).unwrap();
    assert!(fit_error < 0.05, "fit error {fit_error}");
    // A new request of 500 prompt tokens, with 8 on the rank and nothing
    // prefilling: the prediction is the engine's, its first token after
    // its own prefill, its later ones in steps that carry the prefill the
    // rank's steps carried on average.
    let held: Vec<Booking> = (0..8).map(|_| m.book(1, 0, 50).unwrap()).collect();
    let p = m.predict(1, 0, 500).unwrap();
    assert!(p.trusted);
    let load = m.rank_load(1, 0).unwrap();
    let kv = (load.active_decode_blocks * 16) as f64;
    let running = 8.0;
    let want_ttft = step(500.0, running, kv);
    let want_tpot = step(prefill, running + 1.0, kv + 500.0);
    let close = |got: f64, want: f64| (got - want).abs() <= 0.1 * want;
    assert!(close(p.ttft, want_ttft), "ttft {} want {want_ttft}", p.ttft);
    assert!(close(p.tpot, want_tpot), "tpot {} want {want_tpot}", p.tpot);
    // With 5,000 prompt tokens queued ahead, the first token waits for
    // three full batches first.
    let ahead = m.book_with_prefill(1, 0, 0, 5_000).unwrap();
    let queued = m.predict(1, 0, 500).unwrap();
    let want = 2.0 * step(BATCH as f64, 9.0, kv) + step(5_500.0 - 2.0 * BATCH as f64, 9.0, kv);
    assert!(close(queued.ttft, want), "ttft {} want {want}", queued.ttft);
    drop((held, ahead));
    // The other rank saw nothing: untrusted.
    assert!(!m.predict(1, 1, 500).unwrap().trusted);
    let text = m.metrics_text();
    assert!(text.contains("dynamo_frontend_slo_step_fit_trusted{dp_rank=\"0\",worker_id=\"1\"} 1"));
    assert!(text.contains("dynamo_frontend_slo_step_fit_trusted{dp_rank=\"1\",worker_id=\"1\"} 0"));
    assert!(text.contains("dynamo_frontend_slo_observations_lost_total 0"));
}

#[test]
fn first_tokens_that_come_as_predicted_show_a_small_ttft_error() {
    let (m, clock) = monitor();
    m.set_slo(
        "m",
        Some(Slo::from_secs(2.0, 0.1).unwrap()),
        SloMode::Advisory,
    )
    .unwrap();
    serve(&m, &clock, 2_000);
    for _ in 0..200 {
        let p = m.predict(1, 0, 300).unwrap();
        assert!(p.trusted);
        let mut b = m.book_with_prefill(1, 0, 20, 300).unwrap();
        clock.advance(Duration::from_secs_f64(p.ttft));
        b.first_token();
        drop(b);
        m.maintain();
    }
    let (_, ttft_error) = m.prediction_errors(1, 0).unwrap();
    assert!(ttft_error < 0.01, "ttft error {ttft_error}");
}

#[test]
fn the_slo_is_set_per_known_model_and_cleared() {
    let (m, _) = monitor();
    let e = m
        .set_slo(
            "nope",
            Some(Slo::from_secs(1.0, 0.1).unwrap()),
            SloMode::Enforce,
        )
        .unwrap_err();
    assert!(e.to_string().contains("nope"), "{e}");
    m.set_slo(
        "m",
        Some(Slo::from_secs(1.0, 0.05).unwrap()),
        SloMode::Enforce,
    )
    .unwrap();
    m.set_slo("m", None, SloMode::Enforce).unwrap();
    assert_eq!(m.slo("m"), None);
    assert!(!m.metrics_text().contains("frontend_slo_"));
}
