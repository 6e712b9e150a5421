/*
 * Frontend flow control from C: a model's queue (lg_monitor_set_flow_control),
 * dispatch at once, blocking with a timeout, with a callback (called on the
 * monitor's maintenance thread), woken from another thread, refused at its
 * deadline with no call from the program, when full, when asked, with no
 * workers, and bad input; 20,000 waiting callbacks released by one report
 * (and by one threshold raise) made on a thread with a 256 KiB stack.
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>

/* One worker (id 1) of 100 KV blocks, busy above half, with a queue of
 * `limit` whose requests wait at most 200 ms. */
static lg_monitor *fleet(uint32_t limit) {
    lg_monitor *m = half_line_monitor();
    lg_flow_config f;
    OK(lg_flow_config_default(limit, &f));
    f.deadline_ms = 200;
    OK(lg_monitor_set_flow_control(m, S("m"), &f));
    return m;
}

/* What a dispatch callback was told: `calls` is stored last, with release
 * order, so a thread that reads it with acquire order sees the rest. */
struct told {
    _Atomic int calls;
    lg_status status;
    lg_dispatch *dispatch;
};

static void on_dispatch(void *user_data, lg_status status, lg_dispatch *dispatch) {
    struct told *t = user_data;
    t->status = status;
    t->dispatch = dispatch;
    atomic_fetch_add_explicit(&t->calls, 1, memory_order_release);
}

static int calls(struct told *t) {
    return atomic_load_explicit(&t->calls, memory_order_acquire);
}

/* Waits until the callback was called `n` times in all, for at most
 * WAIT_MS. */
static int await_calls(struct told *t, int n) {
    double deadline = now_ms() + WAIT_MS;
    while (calls(t) < n) {
        if (now_ms() > deadline) {
            return 0;
        }
        sleep_ms(1);
    }
    return calls(t) == n;
}

/* Completes a dispatch after 50 ms, from another thread. */
static void *complete_later(void *arg) {
    sleep_ms(50);
    lg_dispatch_complete(arg, 3);
    return NULL;
}

static void test_flow_config(void) {
    INVALID(lg_flow_config_default(4, NULL));
    lg_monitor *m = fleet(4);
    lg_flow_config f;
    OK(lg_flow_config_default(0, &f));
    INVALID(lg_monitor_set_flow_control(m, S("m"), &f));
    CHECK(last_error_contains("queue_limit"));
    OK(lg_flow_config_default(4, &f));
    f.prompt_weight = NAN;
    INVALID(lg_monitor_set_flow_control(m, S("m"), &f));
    CHECK(last_error_contains("prompt_weight"));
    OK(lg_flow_config_default(4, &f));
    f.policy = 9;
    INVALID(lg_monitor_set_flow_control(m, S("m"), &f));
    OK(lg_flow_config_default(4, &f));
    lg_tenant_weight w = {"gold", 4, 0.0};
    f.tenant_weights = &w;
    f.tenant_weight_count = 1;
    INVALID(lg_monitor_set_flow_control(m, S("m"), &f));
    w.weight = 2.0;
    OK(lg_monitor_set_flow_control(m, S("m"), &f));
    f.tenant_weights = NULL;
    INVALID(lg_monitor_set_flow_control(m, S("m"), &f));
    EXPECT(lg_monitor_set_flow_control(m, S("nope"), NULL), LG_NOT_FOUND);
    INVALID(lg_monitor_set_flow_control(NULL, S("m"), NULL));
    OK(lg_monitor_set_flow_control(m, S("m"), NULL));
    lg_monitor_free(m);
}

/* How many requests a burst releases. */
#define BURST 20000

/* Counts the burst's callbacks, each of which completes its dispatch at
 * once (as the header allows), and the deepest nesting seen. */
static _Atomic int burst_done, burst_depth, burst_deepest;

static void on_burst(void *user_data, lg_status status, lg_dispatch *dispatch) {
    (void)user_data;
    int depth = atomic_fetch_add(&burst_depth, 1) + 1;
    int deepest = atomic_load(&burst_deepest);
    while (depth > deepest && !atomic_compare_exchange_weak(&burst_deepest, &deepest, depth)) {
    }
    if (status == LG_OK) {
        lg_dispatch_complete(dispatch, 0);
    }
    atomic_fetch_sub(&burst_depth, 1);
    atomic_fetch_add_explicit(&burst_done, status == LG_OK ? 1 : 1000000, memory_order_release);
}

struct freer {
    lg_monitor *m;
    bool raise;
};

/* Frees the busy worker with one report, or one threshold raise. */
static void *free_worker(void *arg) {
    struct freer *f = arg;
    if (f->raise) {
        lg_threshold_update u;
        memset(&u, 0, sizeof u);
        u.has_active_decode_blocks_threshold = true;
        u.active_decode_blocks_threshold = 1.0;
        OK(lg_monitor_set_thresholds(f->m, S("m"), &u, NULL));
    } else {
        lg_load_report free_now = kv_report(0, BURST * 2);
        OK(lg_monitor_report(f->m, 1, 0, &free_now));
    }
    return NULL;
}

/* BURST requests wait behind one busy worker; one call on a thread with a
 * 256 KiB stack frees it. The call returns, every callback runs once, none
 * inside another, and the worker ends free. */
static void test_flow_burst(bool raise) {
    lg_monitor *m = NULL;
    OK(lg_monitor_new(NULL, &m));
    lg_worker_spec spec = one_rank(BURST * 2);
    OK(lg_monitor_add_worker(m, S("m"), 1, &spec));
    lg_threshold_update u;
    memset(&u, 0, sizeof u);
    u.has_active_decode_blocks_threshold = true;
    u.active_decode_blocks_threshold = 0.5;
    OK(lg_monitor_set_thresholds(m, S("m"), &u, NULL));
    lg_flow_config f;
    OK(lg_flow_config_default(BURST, &f));
    OK(lg_monitor_set_flow_control(m, S("m"), &f));
    lg_load_report busy = kv_report(BURST * 2 - 1, BURST * 2);
    OK(lg_monitor_report(m, 1, 0, &busy));
    lg_dispatch_request r;
    OK(lg_dispatch_request_default(&r));
    r.blocks = 1;
    atomic_store(&burst_done, 0);
    atomic_store(&burst_deepest, 0);
    for (int i = 0; i < BURST; i++) {
        OK(lg_monitor_dispatch_async(m, S("m"), &r, on_burst, NULL));
    }
    CHECK(atomic_load(&burst_done) == 0);
    pthread_attr_t attr;
    CHECK(pthread_attr_init(&attr) == 0);
    CHECK(pthread_attr_setstacksize(&attr, 256 * 1024) == 0);
    struct freer fr = {m, raise};
    pthread_t th;
    CHECK(pthread_create(&th, &attr, free_worker, &fr) == 0);
    CHECK(pthread_join(th, NULL) == 0);
    pthread_attr_destroy(&attr);
    double deadline = now_ms() + WAIT_MS;
    while (atomic_load_explicit(&burst_done, memory_order_acquire) < BURST && now_ms() < deadline) {
        sleep_ms(1);
    }
    CHECK(atomic_load(&burst_done) == BURST);
    CHECK(atomic_load(&burst_deepest) == 1);
    /* Nothing stays booked: the worker is free again. */
    CHECK(await_busy(m, 1, false));
    lg_monitor_free(m);
}

/* Settings before the model exists: the defaults every new model starts
 * with, from the program or from Dynamo's DYN_ACTIVE_* variables. */
static void test_model_defaults(void) {
    lg_monitor *m = NULL;
    OK(lg_monitor_new(NULL, &m));
    lg_threshold_update u;
    memset(&u, 0, sizeof u);
    u.has_active_decode_blocks_threshold = true;
    u.active_decode_blocks_threshold = 0.5;
    lg_thresholds t;
    OK(lg_monitor_set_default_thresholds(m, &u, &t));
    CHECK(t.has_active_decode_blocks_threshold && t.active_decode_blocks_threshold == 0.5);
    lg_flow_config f;
    OK(lg_flow_config_default(4, &f));
    OK(lg_monitor_set_default_flow_control(m, &f));
    /* The model comes with its first worker: thresholds and queue are there. */
    lg_worker_spec spec = one_rank(100);
    OK(lg_monitor_add_worker(m, S("new"), 1, &spec));
    lg_load_report busy = kv_report(90, 100);
    OK(lg_monitor_report(m, 1, 0, &busy));
    CHECK(await_busy(m, 1, true));
    lg_dispatch_request r;
    OK(lg_dispatch_request_default(&r));
    lg_dispatch *d = NULL;
    EXPECT(lg_monitor_dispatch(m, S("new"), &r, 0, &d), LG_TIMED_OUT); /* it waited */
    /* A refused default changes nothing. */
    u.active_decode_blocks_threshold = 2.0;
    INVALID(lg_monitor_set_default_thresholds(m, &u, NULL));
    CHECK(last_error_contains("active_decode_blocks_threshold"));
    f.queue_limit = 0;
    INVALID(lg_monitor_set_default_flow_control(m, &f));
    OK(lg_monitor_set_default_flow_control(m, NULL));
    INVALID(lg_monitor_set_default_thresholds(NULL, &u, NULL));
    INVALID(lg_monitor_set_default_thresholds(m, NULL, NULL));
    lg_monitor_free(m);

    lg_monitor_config c;
    OK(lg_monitor_config_default(&c));
    CHECK(!c.dynamo_env);
    c.dynamo_env = true;
    CHECK(setenv("DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD", "0.25", 1) == 0);
    OK(lg_monitor_new(&c, &m));
    OK(lg_monitor_add_worker(m, S("m"), 1, &spec));
    OK(lg_monitor_get_thresholds(m, S("m"), &t));
    CHECK(t.has_active_decode_blocks_threshold && t.active_decode_blocks_threshold == 0.25);
    lg_monitor_free(m);
    CHECK(setenv("DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD", "lots", 1) == 0);
    m = NULL;
    INVALID(lg_monitor_new(&c, &m));
    CHECK(m == NULL);
    CHECK(last_error_contains("DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD"));
    CHECK(last_error_contains("lots"));
    CHECK(unsetenv("DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD") == 0);
}

/* A worker's refusal handed back: without flow control to the other worker
 * once (the refuser leased), then LG_OVERLOADED; with flow control back into
 * the queue, sent again when the refuser's next report ends its lease. */
static void test_redispatch(void) {
    lg_monitor_config c;
    OK(lg_monitor_config_default(&c));
    CHECK(c.reroutes == 1 && c.routing == LG_POLICY_ROUND_ROBIN);
    c.reroutes = 17;
    lg_monitor *m = NULL;
    INVALID(lg_monitor_new(&c, &m));
    CHECK(last_error_contains("reroutes"));
    c.reroutes = 1;
    OK(lg_monitor_new(&c, &m));
    lg_worker_spec spec = one_rank(100);
    OK(lg_monitor_add_worker(m, S("m"), 1, &spec));
    OK(lg_monitor_add_worker(m, S("m"), 2, &spec));
    lg_dispatch_request r;
    OK(lg_dispatch_request_default(&r));
    r.blocks = 10;
    lg_dispatch *d = NULL, *again = NULL;
    OK(lg_monitor_dispatch(m, S("m"), &r, 0, &d));
    uint64_t refuser = lg_dispatch_worker(d);
    OK(lg_monitor_redispatch(m, d, 0, &again));
    CHECK(lg_dispatch_worker(again) != refuser);
    bool leased = false;
    OK(lg_monitor_is_leased(m, refuser, &leased));
    CHECK(leased);
    struct told t = {0, LG_OK, NULL};
    OK(lg_monitor_redispatch_async(m, again, on_dispatch, &t));
    CHECK(calls(&t) == 1 && t.status == LG_OVERLOADED && t.dispatch == NULL);
    /* Reports that show the workers free end their leases. Bad input takes
     * the dispatch all the same. */
    lg_load_report idle = kv_report(0, 100);
    OK(lg_monitor_report(m, 1, 0, &idle));
    OK(lg_monitor_report(m, 2, 0, &idle));
    OK(lg_monitor_dispatch(m, S("m"), &r, 0, &d));
    INVALID(lg_monitor_redispatch(NULL, d, 0, &again));
    INVALID(lg_monitor_redispatch(m, NULL, 0, &again));
    OK(lg_monitor_dispatch(m, S("m"), &r, 0, &d));
    INVALID(lg_monitor_redispatch_async(m, d, NULL, NULL));
    lg_monitor_free(m);

    m = fleet(4);
    r.blocks = 60;
    OK(lg_monitor_dispatch(m, S("m"), &r, 0, &d));
    struct told back = {0, LG_OK, NULL};
    OK(lg_monitor_redispatch_async(m, d, on_dispatch, &back));
    sleep_ms(20);
    CHECK(calls(&back) == 0); /* waits while the refuser is leased */
    lg_load_report free_now = kv_report(0, 100);
    OK(lg_monitor_report(m, 1, 0, &free_now));
    CHECK(await_calls(&back, 1));
    CHECK(back.status == LG_OK && lg_dispatch_worker(back.dispatch) == 1);
    lg_dispatch_complete(back.dispatch, 0);
    lg_monitor_free(m);
}

void test_flow(void) {
    test_model_defaults();
    test_redispatch();
    test_flow_config();
    CHECK(contains(lg_status_str(LG_QUEUE_FULL), "queue is full"));
    CHECK(strcmp(lg_status_reason(LG_QUEUE_DEADLINE), "queue_deadline") == 0);
    CHECK(lg_status_http(LG_QUEUE_FULL) == lg_overload_status());

    lg_monitor *m = fleet(4);
    lg_dispatch_request r;
    INVALID(lg_dispatch_request_default(NULL));
    OK(lg_dispatch_request_default(&r));
    r.tenant = "a";
    r.tenant_len = 1;
    r.prompt_tokens = 32;
    r.blocks = 60; /* one request makes the worker busy */

    /* At once. */
    lg_dispatch *d = NULL, *d2 = NULL;
    OK(lg_monitor_dispatch(m, S("m"), &r, LG_TIMEOUT_INFINITE, &d));
    CHECK(lg_dispatch_worker(d) == 1);
    CHECK(lg_dispatch_dp_rank(d) == 0);
    OK(lg_dispatch_add_output_blocks(d, 2));
    OK(lg_dispatch_report_output(d, 5));
    OK(lg_dispatch_prefill_done(d));

    /* Busy: our own timeout, then the opt-out. */
    EXPECT(lg_monitor_dispatch(m, S("m"), &r, 20, &d2), LG_TIMED_OUT);
    r.queue = false;
    EXPECT(lg_monitor_dispatch(m, S("m"), &r, 0, &d2), LG_OVERLOADED);
    r.queue = true;

    /* A callback: queued, then sent when the running request completes. */
    struct told t = {0, LG_OK, NULL};
    OK(lg_monitor_dispatch_async(m, S("m"), &r, on_dispatch, &t));
    CHECK(calls(&t) == 0);
    lg_dispatch_complete(d, 10);
    CHECK(await_calls(&t, 1));
    CHECK(t.status == LG_OK && lg_dispatch_worker(t.dispatch) == 1);

    /* A callback refused at its deadline (200 ms), with no call from us. */
    struct told late = {0, LG_OK, NULL};
    OK(lg_monitor_dispatch_async(m, S("m"), &r, on_dispatch, &late));
    CHECK(await_calls(&late, 1));
    CHECK(late.status == LG_QUEUE_DEADLINE && late.dispatch == NULL);

    /* A blocking dispatch woken by a completion on another thread. */
    pthread_t th;
    CHECK(pthread_create(&th, NULL, complete_later, t.dispatch) == 0);
    OK(lg_monitor_dispatch(m, S("m"), &r, 5000, &d2));
    CHECK(pthread_join(th, NULL) == 0);
    CHECK(lg_dispatch_worker(d2) == 1);

    /* Full (a queue of 1): the heavy tenant's waiting request is shed for a
     * light one. */
    lg_flow_config f;
    OK(lg_flow_config_default(1, &f));
    OK(lg_monitor_set_flow_control(m, S("m"), &f));
    struct told heavy = {0, LG_OK, NULL}, light = {0, LG_OK, NULL};
    r.tenant = "heavy";
    r.tenant_len = 5;
    r.prompt_tokens = 1000;
    OK(lg_monitor_dispatch_async(m, S("m"), &r, on_dispatch, &heavy));
    r.tenant = "light";
    r.prompt_tokens = 1;
    OK(lg_monitor_dispatch_async(m, S("m"), &r, on_dispatch, &light));
    CHECK(await_calls(&heavy, 1) && heavy.status == LG_QUEUE_FULL);
    CHECK(calls(&light) == 0);
    lg_dispatch_complete(d2, 0);
    CHECK(await_calls(&light, 1) && light.status == LG_OK);
    lg_dispatch_complete(light.dispatch, 0);

    /* Bad input. */
    char long_tenant[300];
    memset(long_tenant, 'x', sizeof long_tenant);
    r.tenant = long_tenant;
    r.tenant_len = sizeof long_tenant;
    INVALID(lg_monitor_dispatch(m, S("m"), &r, 0, &d2));
    r.tenant = NULL;
    r.tenant_len = 3;
    INVALID(lg_monitor_dispatch(m, S("m"), &r, 0, &d2));
    r.tenant_len = 0;
    INVALID(lg_monitor_dispatch(NULL, S("m"), &r, 0, &d2));
    INVALID(lg_monitor_dispatch(m, S("m"), NULL, 0, &d2));
    INVALID(lg_monitor_dispatch(m, S("m"), &r, 0, NULL));
    INVALID(lg_monitor_dispatch_async(m, S("m"), &r, NULL, NULL));
    INVALID(lg_dispatch_report_output(NULL, 1));
    INVALID(lg_dispatch_prefill_done(NULL));
    INVALID(lg_dispatch_add_output_blocks(NULL, 1));
    CHECK(lg_dispatch_worker(NULL) == 0);
    CHECK(lg_dispatch_dp_rank(NULL) == 0);
    lg_dispatch_complete(NULL, 0);

    /* No workers: refused with 503's status. */
    OK(lg_monitor_remove_worker(m, 1));
    EXPECT(lg_monitor_dispatch(m, S("m"), &r, 0, &d2), LG_UNAVAILABLE);

    /* Unless it may wait for a worker to join. */
    OK(lg_flow_config_default(4, &f));
    f.scale_up_limit = 1;
    OK(lg_monitor_set_flow_control(m, S("m"), &f));
    struct told joined = {0, LG_OK, NULL};
    OK(lg_monitor_dispatch_async(m, S("m"), &r, on_dispatch, &joined));
    EXPECT(lg_monitor_dispatch(m, S("m"), &r, 0, &d2), LG_UNAVAILABLE);
    CHECK(calls(&joined) == 0);
    lg_worker_spec spec = one_rank(100);
    OK(lg_monitor_add_worker(m, S("m"), 9, &spec));
    CHECK(await_calls(&joined, 1));
    CHECK(joined.status == LG_OK && lg_dispatch_worker(joined.dispatch) == 9);
    lg_dispatch_complete(joined.dispatch, 0);
    f.scale_up_limit = 5;
    INVALID(lg_monitor_set_flow_control(m, S("m"), &f));
    lg_monitor_free(m);

    test_flow_burst(false);
    test_flow_burst(true);
}
