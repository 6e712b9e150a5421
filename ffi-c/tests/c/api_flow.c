/*
 * Frontend flow control from C: a model's queue (lg_monitor_set_flow_control),
 * dispatch at once, blocking with a timeout, with a callback, woken from
 * another thread, refused at its deadline, when full, when asked, with no
 * workers, and bad input.
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"

#include <math.h>
#include <pthread.h>

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

/* What a dispatch callback was told. */
struct told {
    int calls;
    lg_status status;
    lg_dispatch *dispatch;
};

static void on_dispatch(void *user_data, lg_status status, lg_dispatch *dispatch) {
    struct told *t = user_data;
    t->calls++;
    t->status = status;
    t->dispatch = dispatch;
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

void test_flow(void) {
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
    CHECK(t.calls == 0);
    lg_dispatch_complete(d, 10);
    CHECK(t.calls == 1 && t.status == LG_OK && lg_dispatch_worker(t.dispatch) == 1);

    /* A callback refused at its deadline, expired by the host. */
    struct told late = {0, LG_OK, NULL};
    OK(lg_monitor_dispatch_async(m, S("m"), &r, on_dispatch, &late));
    uint64_t ms = 0;
    OK(lg_monitor_next_flow_deadline(m, &ms));
    CHECK(ms <= 200);
    sleep_ms(250);
    size_t expired = 0;
    OK(lg_monitor_expire_flow(m, &expired));
    CHECK(expired == 1 && late.calls == 1 && late.status == LG_QUEUE_DEADLINE);
    CHECK(late.dispatch == NULL);
    OK(lg_monitor_next_flow_deadline(m, &ms));
    CHECK(ms == LG_TIMEOUT_INFINITE);

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
    CHECK(heavy.calls == 1 && heavy.status == LG_QUEUE_FULL);
    CHECK(light.calls == 0);
    lg_dispatch_complete(d2, 0);
    CHECK(light.calls == 1 && light.status == LG_OK);
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
    INVALID(lg_monitor_expire_flow(NULL, NULL));
    INVALID(lg_monitor_next_flow_deadline(m, NULL));
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
    CHECK(joined.calls == 0);
    lg_worker_spec spec = one_rank(100);
    OK(lg_monitor_add_worker(m, S("m"), 9, &spec));
    CHECK(joined.calls == 1 && joined.status == LG_OK && lg_dispatch_worker(joined.dispatch) == 9);
    lg_dispatch_complete(joined.dispatch, 0);
    f.scale_up_limit = 5;
    INVALID(lg_monitor_set_flow_control(m, S("m"), &f));
    lg_monitor_free(m);
}
