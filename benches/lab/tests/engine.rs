//! The engine emulator against its model: a lone request's timing follows
//! the step-time formula, the mocker's engine times steps as Dynamo's
//! replay does, the batch limits hold, KV exhaustion preempts and
//! the preempted work is redone, and a seed fixes a run.

use loadgate_lab::engine::{Engine, EngineConfig, EngineRequest, StepModel, Token};
use loadgate_lab::workload::WorkloadSpec;

fn config() -> EngineConfig {
    EngineConfig {
        max_num_seqs: 4,
        max_num_batched_tokens: 64,
        block_size: 4,
        num_gpu_blocks: 1000,
        speedup_ratio: 1.0,
        step: StepModel {
            prefill_ms: [2.0, 0.5, 0.001],
            decode_ms: [1.0, 8.0, -2.0],
            decode_floor_ms: 0.5,
        },
    }
}

/// Runs steps until the engine is idle; returns (step end time, tokens)
/// for every step.
fn drain(engine: &mut Engine) -> Vec<(u64, Vec<Token>)> {
    let mut now = 0;
    let mut out = Vec::new();
    while let Some(d) = engine.begin_step() {
        now += d;
        let mut tokens = Vec::new();
        engine.end_step(&mut tokens);
        out.push((now, tokens));
    }
    out
}

fn ms(v: f64) -> u64 {
    (v * 1e6) as u64
}

#[test]
fn a_lone_request_follows_the_step_time_model() {
    let c = config();
    let mut e = Engine::new(c);
    assert!(e.add(EngineRequest {
        id: 1,
        prompt: 100,
        output: 3
    }));
    let steps = drain(&mut e);
    // Prefill in two chunks of the 64-token budget: 64, then 36 (which
    // samples the first token), then two decode steps.
    assert_eq!(steps.len(), 4);
    let s = c.step;
    let capacity = 4000.0;
    let decode = |k: f64| {
        let u = k / capacity;
        (s.decode_ms[0] + s.decode_ms[1] * u + s.decode_ms[2] * u * u).max(s.decode_floor_ms)
    };
    let prefill = |t: f64| s.prefill_ms[0] + s.prefill_ms[1] * t + s.prefill_ms[2] * t * t;
    // Prefill steps have no decoder (the one finishing its prompt is not
    // one); a decode step's context is the prompt and what was generated.
    let (t1, t2) = (prefill(64.0), prefill(36.0));
    let (t3, t4) = (decode(101.0), decode(102.0));
    assert!(steps[0].1.is_empty(), "no token from a partial prefill");
    assert_eq!(steps[1].0, ms(t1) + ms(t2), "TTFT is the two prefill steps");
    assert_eq!(steps[1].1[0].generated, 1);
    assert_eq!(steps[2].0 - steps[1].0, ms(t3), "TPOT is one decode step");
    assert_eq!(steps[3].0 - steps[2].0, ms(t4));
    assert!(steps[3].1[0].finished);
    assert!(e.is_empty());
    assert_eq!(e.signals().kv_used_blocks, 0, "blocks freed at the end");
    assert_eq!(e.totals().computed_tokens, 102);
}

#[test]
fn speedup_divides_every_step() {
    let mut fast = config();
    fast.speedup_ratio = 4.0;
    let one = config().step_nanos(10, 2, 300);
    assert_eq!(fast.step_nanos(10, 2, 300), one / 4);
}

/// Step times of Dynamo 1.6.1's offline replay (`dynamo.replay.api.
/// run_synthetic_trace_replay(1024, 4, n, num_workers=1,
/// replay_concurrency=n)`, n prompts of 1024 tokens at once, the mocker's
/// default engine), as docs/overload.md records them.
#[test]
fn the_mocker_engine_times_steps_as_dynamos_replay_does() {
    let ms_of = |ns: u64| ns as f64 / 1e6;
    for (n, ttft, first_gap) in [(1, 32.491, 5.793), (2, 49.363, 5.845), (8, 169.137, 6.161)] {
        let mut e = Engine::new(EngineConfig::mocker());
        for id in 0..n {
            assert!(e.add(EngineRequest {
                id,
                prompt: 1024,
                output: 4
            }));
        }
        let steps = drain(&mut e);
        assert!(
            (ms_of(steps[0].0) - ttft).abs() < 0.001,
            "n {n}: {:?}",
            steps[0].0
        );
        let gap = ms_of(steps[1].0 - steps[0].0);
        assert!((gap - first_gap).abs() < 0.001, "n {n}: {gap}");
    }
    // Nine: eight fill the 8192-token budget; the ninth's prefill rides in
    // the next step with the eight decoding, and the two times add.
    let mut e = Engine::new(EngineConfig::mocker());
    for id in 0..9 {
        e.add(EngineRequest {
            id,
            prompt: 1024,
            output: 4,
        });
    }
    let steps = drain(&mut e);
    assert!((ms_of(steps[0].0) - 169.137).abs() < 0.001);
    assert!(
        (ms_of(steps[1].0) - 207.788).abs() < 0.001,
        "{}",
        ms_of(steps[1].0)
    );
    assert_eq!(steps[1].1.len(), 9, "eight second tokens and one first");
}

#[test]
fn waiting_counts_what_the_last_step_left_waiting_as_vllms_gauge() {
    let mut e = Engine::new(config());
    let request = |id| EngineRequest {
        id,
        prompt: 8,
        output: 50,
    };
    assert!(e.add(request(0)));
    assert!(e.begin_step().is_some());
    // Two arrive during the step: the next step takes them (4 seats), so
    // no scheduler's stats ever show them waiting.
    assert!(e.add(request(1)) && e.add(request(2)));
    assert_eq!(e.signals().num_requests_waiting, 0);
    e.end_step(&mut Vec::new());
    assert!(e.begin_step().is_some());
    assert_eq!(e.signals().num_requests_waiting, 0);
    // Three more: one finds a seat at the next step, two are left waiting
    // and shown from then on.
    for id in 3..6 {
        assert!(e.add(request(id)));
    }
    assert_eq!(e.signals().num_requests_waiting, 0);
    e.end_step(&mut Vec::new());
    assert!(e.begin_step().is_some());
    assert_eq!(e.signals().num_requests_waiting, 2);
    // An abort takes one off at once.
    assert!(e.abort(5));
    assert_eq!(e.signals().num_requests_waiting, 1);
}

#[test]
fn max_num_seqs_and_the_token_budget_hold() {
    let c = config();
    let mut e = Engine::new(c);
    for id in 0..10 {
        assert!(e.add(EngineRequest {
            id,
            prompt: 40,
            output: 5
        }));
    }
    let mut now = 0;
    let mut finished = 0;
    while let Some(d) = e.begin_step() {
        let s = e.signals();
        assert!(s.num_requests_running <= u64::from(c.max_num_seqs));
        assert!(s.num_requests_running + s.num_requests_waiting <= 10);
        now += d;
        let mut tokens = Vec::new();
        e.end_step(&mut tokens);
        finished += tokens.iter().filter(|t| t.finished).count();
    }
    assert_eq!(finished, 10);
    assert!(now > 0);
    // Per step at most the budget: 10 requests of 40 + 5 tokens need at
    // least (10·45 - 10) / 64 steps.
    let t = e.totals();
    assert_eq!(
        t.computed_tokens,
        10 * 44,
        "prompt + output - 1 tokens each"
    );
    assert!(t.steps * 64 >= t.computed_tokens);
    assert_eq!(t.preemptions, 0);
}

#[test]
fn the_budget_is_never_exceeded_in_one_step() {
    let mut c = config();
    c.max_num_seqs = 100;
    let mut e = Engine::new(c);
    for id in 0..30 {
        e.add(EngineRequest {
            id,
            prompt: 17,
            output: 9,
        });
    }
    let mut before = 0;
    while e.begin_step().is_some() {
        let mut tokens = Vec::new();
        e.end_step(&mut tokens);
        let done = e.totals().computed_tokens;
        assert!(done - before <= u64::from(c.max_num_batched_tokens));
        before = done;
    }
    assert!(e.is_empty());
}

#[test]
fn kv_exhaustion_preempts_and_the_work_is_redone() {
    let mut c = config();
    // 3 requests of 20 prompt + 20 output need 10 blocks each at the end; 24
    // blocks hold only two.
    c.num_gpu_blocks = 24;
    c.max_num_seqs = 8;
    let mut e = Engine::new(c);
    for id in 0..3 {
        e.add(EngineRequest {
            id,
            prompt: 20,
            output: 20,
        });
    }
    let steps = drain(&mut e);
    let t = e.totals();
    assert!(t.preemptions >= 1, "{t:?}");
    assert!(t.wasted_tokens > 0);
    // Every request still finishes with all its tokens, in order.
    for id in 0..3 {
        let got: Vec<u32> = steps
            .iter()
            .flat_map(|(_, ts)| ts.iter())
            .filter(|tk| tk.id == id)
            .map(|tk| tk.generated)
            .collect();
        assert_eq!(got, (1..=20).collect::<Vec<_>>(), "request {id}");
    }
    // Computed = useful work + the redone part.
    assert_eq!(t.computed_tokens, 3 * 39 + t.wasted_tokens);
    assert_eq!(e.signals().kv_used_blocks, 0);
}

#[test]
fn abort_frees_blocks_at_once() {
    let mut e = Engine::new(config());
    e.add(EngineRequest {
        id: 7,
        prompt: 30,
        output: 50,
    });
    e.add(EngineRequest {
        id: 8,
        prompt: 30,
        output: 50,
    });
    e.begin_step().expect("work");
    let mut tokens = Vec::new();
    e.end_step(&mut tokens);
    assert!(e.signals().kv_used_blocks > 0);
    assert!(e.abort(7));
    assert!(!e.abort(7), "aborting twice");
    assert!(e.abort(8));
    assert_eq!(e.signals().kv_used_blocks, 0);
    assert!(!e.has_work());
    assert!(e.totals().wasted_tokens >= 30);
}

#[test]
fn a_request_that_can_never_fit_is_refused() {
    let mut c = config();
    c.num_gpu_blocks = 10;
    let mut e = Engine::new(c);
    assert!(!e.add(EngineRequest {
        id: 1,
        prompt: 40,
        output: 1
    }));
    assert!(e.is_empty());
}

#[test]
fn invalid_configurations_are_named() {
    let mut c = config();
    c.max_num_seqs = 0;
    assert_eq!(c.invalid(), Some("max_num_seqs must be at least 1"));
    let mut c = config();
    c.speedup_ratio = f64::NAN;
    assert!(c.invalid().unwrap().contains("speedup_ratio"));
    let mut c = config();
    c.step.decode_floor_ms = -1.0;
    assert!(c.invalid().unwrap().contains("step model"));
    let mut c = config();
    c.step.prefill_ms[1] = f64::INFINITY;
    assert!(c.invalid().unwrap().contains("step model"));
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let spec = WorkloadSpec::steady(50.0, 5.0, 42);
    let a = spec.generate();
    let b = spec.generate();
    assert_eq!(a, b);
    assert!(a.len() > 150 && a.len() < 350, "{} arrivals", a.len());
    let other = WorkloadSpec::steady(50.0, 5.0, 43).generate();
    assert_ne!(a, other);
    let run = |reqs: &[loadgate_lab::workload::RequestSpec]| {
        let mut e = Engine::new(EngineConfig::default());
        for (i, r) in reqs.iter().enumerate() {
            e.add(EngineRequest {
                id: i as u64,
                prompt: r.prompt,
                output: r.output,
            });
        }
        drain(&mut e)
    };
    assert_eq!(run(&a), run(&b));
}
