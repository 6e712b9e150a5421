/*
 * The C11 API test (see api.c): the worker admission gate: its settings
 * and the environment, the three ways to admit, tickets, the limit,
 * metrics, closing, the wait limit, queue deadlines and priority classes.
 */
#define _POSIX_C_SOURCE 200809L

#include "check.h"

/* ----- gate --------------------------------------------------------------- */

typedef struct {
    int calls;
    lg_status status;
    lg_permit *permit;
} outcome;

static void record(void *user_data, lg_status status, lg_permit *permit) {
    outcome *o = user_data;
    o->calls++;
    o->status = status;
    o->permit = permit;
}

/* Releases its permit from inside the callback. */
static void release_at_once(void *user_data, lg_status status, lg_permit *permit) {
    record(user_data, status, permit);
    lg_permit_release(permit);
}

void test_gate_config(void) {
    lg_gate_config c;
    lg_gate *g = NULL;
    INVALID(lg_gate_config_default(2, NULL));
    OK(lg_gate_config_default(2, &c));
    CHECK(c.limit == 2 && c.queue == 16 && c.queue_timeout_ms == 0 && !c.adaptive_lifo);
    CHECK(c.metrics_prefix == NULL && c.metrics_prefix_len == 0 && c.wait_limit == 0);
    CHECK(c.classes == NULL && c.class_count == 0);

    c.limit = 0;
    INVALID(lg_gate_new(&c, &g));
    CHECK(last_error_contains("at least 1"));
    c.limit = 1u << 21;
    INVALID(lg_gate_new(&c, &g));
    c.limit = 2;
    c.queue = 1u << 21;
    INVALID(lg_gate_new(&c, &g));
    c.queue = 1;
    c.wait_limit = 1u << 21;
    INVALID(lg_gate_new(&c, &g));
    CHECK(last_error_contains("wait_limit"));
    c.wait_limit = 0;
    c.metrics_prefix = "a-b";
    c.metrics_prefix_len = 3;
    INVALID(lg_gate_new(&c, &g));
    c.metrics_prefix = NULL;
    c.metrics_prefix_len = 1;
    INVALID(lg_gate_new(&c, &g));
    c.metrics_prefix_len = 0;
    INVALID(lg_gate_new(NULL, &g));
    INVALID(lg_gate_new(&c, NULL));
    CHECK(g == NULL);

    /* From the environment: invalid values are errors, never a fallback. */
    setenv("DYN_DYNAMO_REQUEST_QUEUE_LIMIT", "abc", 1);
    INVALID(lg_gate_from_env(4, &g));
    CHECK(last_error_contains("DYN_DYNAMO_REQUEST_QUEUE_LIMIT"));
    setenv("DYN_DYNAMO_REQUEST_QUEUE_LIMIT", " 3 ", 1);
    setenv("DYN_DYNAMO_REQUEST_QUEUE_TIMEOUT_MS", "0", 1);
    INVALID(lg_gate_from_env(4, &g));
    CHECK(last_error_contains("DYN_DYNAMO_REQUEST_QUEUE_TIMEOUT_MS"));
    setenv("DYN_DYNAMO_REQUEST_QUEUE_TIMEOUT_MS", "250", 1);
    setenv("DYN_BACKEND_ADMISSION_ENGINE_WAIT_LIMIT", "0", 1);
    INVALID(lg_gate_from_env(4, &g));
    CHECK(last_error_contains("DYN_BACKEND_ADMISSION_ENGINE_WAIT_LIMIT"));
    setenv("DYN_BACKEND_ADMISSION_ENGINE_WAIT_LIMIT", "2", 1);
    INVALID(lg_gate_from_env(0, &g));
    INVALID(lg_gate_from_env(4, NULL));
    OK(lg_gate_from_env(4, &g));
    lg_gate_stats s;
    OK(lg_gate_get_stats(g, &s));
    CHECK(s.limit == 4 && s.queue_limit == 3 && s.wait_limit == 2 && s.waiting == 0);
    uint64_t wait_ns = 0;
    OK(lg_gate_next_deadline(g, &wait_ns));
    CHECK(wait_ns == LG_TIMEOUT_INFINITE); /* nobody queued */
    lg_gate_free(g);
    unsetenv("DYN_DYNAMO_REQUEST_QUEUE_LIMIT");
    unsetenv("DYN_DYNAMO_REQUEST_QUEUE_TIMEOUT_MS");
    unsetenv("DYN_BACKEND_ADMISSION_ENGINE_WAIT_LIMIT");
    OK(lg_gate_from_env(1, &g));
    OK(lg_gate_get_stats(g, &s));
    CHECK(s.queue_limit == 16 && s.wait_limit == 0);
    lg_gate_free(g);
    lg_gate_free(NULL);
}

void test_gate(void) {
    lg_gate_config c;
    lg_gate *g = NULL;
    OK(lg_gate_config_default(2, &c));
    c.queue = 2;
    c.metrics_prefix = "worker";
    c.metrics_prefix_len = 6;
    OK(lg_gate_new(&c, &g));

    /* -- try_admit: immediate only -- */
    lg_permit *p1 = NULL, *p2 = NULL, *p3 = NULL;
    OK(lg_gate_try_admit(g, &p1));
    OK(lg_gate_try_admit(g, &p2));
    CHECK(p1 != NULL && p2 != NULL); /* interchangeable: they may be equal */
    lg_permit *untouched = (lg_permit *)&c;
    EXPECT(lg_gate_try_admit(g, &untouched), LG_WOULD_WAIT);
    CHECK(untouched == (lg_permit *)&c);
    INVALID(lg_gate_try_admit(NULL, &p3));
    INVALID(lg_gate_try_admit(g, NULL));

    /* -- blocking admit with the caller's timeout -- */
    EXPECT(lg_gate_admit(g, 20, &p3), LG_TIMED_OUT);
    INVALID(lg_gate_admit(NULL, 1, &p3));
    INVALID(lg_gate_admit(g, 1, NULL));

    /* -- async admit: two queue, the third is rejected at once -- */
    outcome a = {0, LG_PANIC, NULL}, b = {0, LG_PANIC, NULL}, x = {0, LG_PANIC, NULL};
    lg_ticket *ta = NULL, *tb = NULL;
    OK(lg_gate_admit_async(g, record, &a, &ta));
    OK(lg_gate_admit_async(g, record, &b, &tb));
    CHECK(a.calls == 0 && b.calls == 0);
    bool queued = false;
    OK(lg_ticket_is_queued(ta, &queued));
    CHECK(queued);
    OK(lg_gate_admit_async(g, record, &x, NULL)); /* rejected on this thread, at once */
    CHECK(x.calls == 1 && x.status == LG_AT_CAPACITY && x.permit == NULL);
    EXPECT(lg_gate_admit(g, LG_TIMEOUT_INFINITE, &p3), LG_AT_CAPACITY);
    CHECK(strcmp(lg_last_error_message(), "Server overloaded: worker at capacity") == 0);
    EXPECT(lg_gate_try_admit(g, &p3), LG_WOULD_WAIT);

    lg_gate_stats s;
    OK(lg_gate_get_stats(g, &s));
    CHECK(s.running == 2 && s.queued == 2 && s.limit == 2 && s.queue_limit == 2 && !s.closed);
    CHECK(s.admitted_direct == 2 && s.rejected_at_capacity == 2 && s.cancelled == 1);

    /* Releasing hands the slot to the oldest waiter, whose callback runs here. */
    lg_permit_release(p1);
    CHECK(a.calls == 1 && a.status == LG_OK && a.permit != NULL);
    OK(lg_ticket_is_queued(ta, &queued));
    CHECK(!queued);
    bool cancelled = true;
    OK(lg_ticket_cancel(ta, &cancelled));
    CHECK(!cancelled); /* too late: it already has its permit */
    /* Cancelling a waiter frees its place; its callback never runs. */
    OK(lg_ticket_cancel(tb, &cancelled));
    CHECK(cancelled && b.calls == 0);
    OK(lg_ticket_cancel(tb, &cancelled));
    CHECK(!cancelled);
    INVALID(lg_ticket_cancel(NULL, &cancelled));
    INVALID(lg_ticket_cancel(ta, NULL));
    INVALID(lg_ticket_is_queued(NULL, &queued));
    INVALID(lg_ticket_is_queued(ta, NULL));
    lg_ticket_free(ta);
    lg_ticket_free(tb);
    lg_ticket_free(NULL);
    INVALID(lg_gate_admit_async(g, NULL, &a, NULL));
    INVALID(lg_gate_admit_async(NULL, record, &a, NULL));

    /* A callback may release its permit at once; the next waiter gets it. */
    outcome c1 = {0, LG_PANIC, NULL}, c2 = {0, LG_PANIC, NULL};
    OK(lg_gate_admit_async(g, release_at_once, &c1, NULL));
    OK(lg_gate_admit_async(g, record, &c2, NULL));
    lg_permit_release(a.permit);
    CHECK(c1.calls == 1 && c1.status == LG_OK);
    CHECK(c2.calls == 1 && c2.status == LG_OK && c2.permit != NULL);

    /* -- set_limit: raising grants waiters before returning -- */
    outcome d = {0, LG_PANIC, NULL};
    OK(lg_gate_admit_async(g, record, &d, NULL));
    CHECK(d.calls == 0);
    OK(lg_gate_set_limit(g, 3));
    CHECK(d.calls == 1 && d.status == LG_OK);
    INVALID(lg_gate_set_limit(g, 0));
    INVALID(lg_gate_set_limit(g, 1u << 21));
    INVALID(lg_gate_set_limit(NULL, 3));
    OK(lg_gate_set_limit(g, 1)); /* lowering revokes nothing */
    OK(lg_gate_get_stats(g, &s));
    CHECK(s.running == 3 && s.limit == 1);
    lg_permit_release(d.permit);
    lg_permit_release(c2.permit);
    OK(lg_gate_get_stats(g, &s));
    CHECK(s.running == 1);

    /* -- metrics -- */
    size_t needed = 0;
    EXPECT(lg_gate_metrics(g, NULL, 0, &needed), LG_BUFFER_TOO_SMALL);
    char *text = malloc(needed + 1);
    CHECK(text != NULL);
    OK(lg_gate_metrics(g, text, needed + 1, &needed));
    CHECK(contains(text, "worker_engine_request 1\n"));
    CHECK(contains(text, "worker_rejection_request_total 2\n"));
    CHECK(contains(text, "worker_request_queue_wait_seconds_count"));
    free(text);
    char small[8];
    EXPECT(lg_gate_metrics(g, small, sizeof small, &needed), LG_BUFFER_TOO_SMALL);
    CHECK(strlen(small) == 7);
    INVALID(lg_gate_metrics(NULL, small, sizeof small, &needed));
    INVALID(lg_gate_metrics(g, small, sizeof small, NULL));
    INVALID(lg_gate_metrics(g, NULL, 1, &needed));

    /* -- close: waiters and later admits get LG_CLOSED; permits stay valid -- */
    outcome e = {0, LG_PANIC, NULL};
    OK(lg_gate_admit_async(g, record, &e, NULL));
    CHECK(e.calls == 0);
    OK(lg_gate_close(g));
    CHECK(e.calls == 1 && e.status == LG_CLOSED && e.permit == NULL);
    OK(lg_gate_close(g));
    EXPECT(lg_gate_try_admit(g, &p3), LG_CLOSED);
    EXPECT(lg_gate_admit(g, 10, &p3), LG_CLOSED);
    outcome f = {0, LG_PANIC, NULL};
    OK(lg_gate_admit_async(g, record, &f, NULL));
    CHECK(f.calls == 1 && f.status == LG_CLOSED);
    INVALID(lg_gate_close(NULL));
    OK(lg_gate_get_stats(g, &s));
    CHECK(s.closed && s.rejected_closed >= 3);
    INVALID(lg_gate_get_stats(g, NULL));
    INVALID(lg_gate_get_stats(NULL, &s));

    /* A permit outlives the gate handle. */
    lg_gate_free(g);
    lg_permit_release(p2);
    lg_permit_release(NULL);
}

/* The wait limit W: admission needs a request slot and a wait slot; the
 * first response frees the wait slot and hands it to the oldest waiter. */
void test_gate_wait_limit(void) {
    lg_gate_config c;
    lg_gate *g = NULL;
    OK(lg_gate_config_default(2, &c));
    c.queue = 1;
    c.wait_limit = 1;
    OK(lg_gate_new(&c, &g));

    lg_permit *p1 = NULL, *p2 = NULL;
    OK(lg_gate_try_admit(g, &p1));
    EXPECT(lg_gate_try_admit(g, &p2), LG_WOULD_WAIT); /* a slot, but no wait slot */
    outcome a = {0, LG_PANIC, NULL}, x = {0, LG_PANIC, NULL};
    OK(lg_gate_admit_async(g, record, &a, NULL));
    OK(lg_gate_admit_async(g, record, &x, NULL));
    CHECK(a.calls == 0 && x.calls == 1 && x.status == LG_AT_CAPACITY);
    lg_gate_stats s;
    OK(lg_gate_get_stats(g, &s));
    CHECK(s.running == 1 && s.waiting == 1 && s.wait_limit == 1 && s.queued == 1);

    /* The first response hands the wait slot to the waiter, on this thread. */
    lg_permit_first_response(&p1);
    CHECK(a.calls == 1 && a.status == LG_OK && a.permit != NULL);
    lg_permit_first_response(&p1); /* idempotent with the updated handle */
    OK(lg_gate_get_stats(g, &s));
    CHECK(s.running == 2 && s.waiting == 1 && s.queued == 0);
    lg_permit_first_response(NULL);
    lg_permit *none = NULL;
    lg_permit_first_response(&none);

    size_t needed = 0;
    EXPECT(lg_gate_metrics(g, NULL, 0, &needed), LG_BUFFER_TOO_SMALL);
    char *text = malloc(needed + 1);
    CHECK(text != NULL);
    OK(lg_gate_metrics(g, text, needed + 1, &needed));
    CHECK(contains(text, "dynamo_backend_admission_engine_wait_count 1\n"));
    CHECK(contains(text, "dynamo_backend_admission_request_receive_total 3\n"));
    free(text);

    /* Releasing a permit that never responded frees both of its slots. */
    lg_permit_release(a.permit);
    lg_permit_release(p1);
    OK(lg_gate_get_stats(g, &s));
    CHECK(s.running == 0 && s.waiting == 0);
    lg_gate_free(g);
}

void test_gate_deadline(void) {
    lg_gate_config c;
    lg_gate *g = NULL;
    OK(lg_gate_config_default(1, &c));
    c.queue = 4;
    /* Long enough that the checks before it runs out take far less, even
     * under valgrind on a busy machine; the test then waits for it. */
    c.queue_timeout_ms = 1000;
    c.adaptive_lifo = true;
    OK(lg_gate_new(&c, &g));

    lg_permit *held = NULL;
    OK(lg_gate_try_admit(g, &held));
    outcome o = {0, LG_PANIC, NULL};
    OK(lg_gate_admit_async(g, record, &o, NULL));
    uint64_t wait_ns = 0;
    OK(lg_gate_next_deadline(g, &wait_ns));
    CHECK(wait_ns <= 1000u * 1000000u);
    INVALID(lg_gate_next_deadline(g, NULL));
    INVALID(lg_gate_next_deadline(NULL, &wait_ns));

    size_t expired = 99;
    OK(lg_gate_expire(g, &expired));
    CHECK(expired == 0 && o.calls == 0);
    /* Wait until the deadline has passed (a generous limit, not a timing). */
    for (int i = 0; i < 3000; i++) {
        OK(lg_gate_next_deadline(g, &wait_ns));
        if (wait_ns == 0)
            break;
        sleep_ms(10);
    }
    CHECK(wait_ns == 0); /* overdue */
    OK(lg_gate_expire(g, &expired));
    CHECK(expired == 1 && o.calls == 1 && o.status == LG_QUEUE_TIMEOUT);
    OK(lg_gate_expire(g, NULL));
    INVALID(lg_gate_expire(NULL, &expired));

    /* A blocking waiter enforces the deadline itself. */
    lg_permit *p = NULL;
    EXPECT(lg_gate_admit(g, LG_TIMEOUT_INFINITE, &p), LG_QUEUE_TIMEOUT);
    CHECK(p == NULL);
    lg_gate_stats s;
    OK(lg_gate_get_stats(g, &s));
    CHECK(s.expired == 2 && s.queued == 0);

    lg_permit_release(held);
    OK(lg_gate_admit(g, 1000, &p));
    lg_permit_release(p);
    lg_gate_free(g);
}

/* A class that may fill the whole queue, with no deadline and no reserved
 * slots. */
static lg_gate_class plain_class(uint32_t queue) {
    lg_gate_class k;
    memset(&k, 0, sizeof k);
    k.queue = queue;
    return k;
}

/* A gate of `limit` slots, a queue of `queue` and `count` classes. */
static lg_gate *class_gate(uint32_t limit, uint32_t queue, const lg_gate_class *classes,
                           size_t count) {
    lg_gate_config c;
    lg_gate *g = NULL;
    OK(lg_gate_config_default(limit, &c));
    c.queue = queue;
    c.classes = classes;
    c.class_count = count;
    OK(lg_gate_new(&c, &g));
    return g;
}

/* Priority classes: configuration checks, the most important class served
 * first, displacement from a full queue, reserved slots, sheddable classes,
 * per-class deadlines and per-class stats. */
void test_gate_classes(void) {
    lg_gate_config c;
    lg_gate *g = NULL;
    lg_gate_class k[LG_MAX_CLASSES + 1];
    for (size_t i = 0; i < LG_MAX_CLASSES + 1; i++) {
        k[i] = plain_class(4);
    }

    /* -- configuration: checked by lg_gate_new(), the message says why -- */
    OK(lg_gate_config_default(2, &c));
    c.queue = 4;
    c.classes = k;
    c.class_count = LG_MAX_CLASSES + 1;
    INVALID(lg_gate_new(&c, &g));
    CHECK(last_error_contains("classes = 9") && last_error_contains("at most 8"));
    c.class_count = 2;
    k[1].queue = 5; /* above the whole queue Q */
    INVALID(lg_gate_new(&c, &g));
    CHECK(last_error_contains("class 1") && last_error_contains("queue = 5"));
    k[1].queue = 4;
    k[1].reserved = 3; /* above the limit N */
    INVALID(lg_gate_new(&c, &g));
    CHECK(last_error_contains("class 1") && last_error_contains("reserved = 3"));
    k[1].reserved = 2; /* the whole limit may be reserved */
    c.classes = NULL; /* NULL with a count */
    INVALID(lg_gate_new(&c, &g));
    CHECK(last_error_contains("classes"));
    CHECK(g == NULL);
    c.classes = k;
    OK(lg_gate_new(&c, &g));
    size_t n = 0;
    OK(lg_gate_classes(g, &n));
    CHECK(n == 2);
    INVALID(lg_gate_classes(NULL, &n));
    INVALID(lg_gate_classes(g, NULL));
    lg_gate_free(g);
    k[1].reserved = 0;
    c.class_count = LG_MAX_CLASSES;
    OK(lg_gate_new(&c, &g));
    OK(lg_gate_classes(g, &n));
    CHECK(n == LG_MAX_CLASSES);
    lg_gate_stats s;
    OK(lg_gate_get_stats(g, &s));
    CHECK(s.class_count == LG_MAX_CLASSES && s.classes[LG_MAX_CLASSES - 1].queue_limit == 4);
    lg_gate_free(g);
    /* Without classes (count 0; the pointer is then not read): one class,
     * the whole queue. */
    c.class_count = 0;
    OK(lg_gate_new(&c, &g));
    OK(lg_gate_classes(g, &n));
    CHECK(n == 1);
    OK(lg_gate_get_stats(g, &s));
    CHECK(s.class_count == 1 && s.classes[0].queue_limit == 4 && s.classes[1].queue_limit == 0);
    CHECK(s.displaced == 0);
    lg_gate_free(g);

    /* -- a freed slot goes to class 0 before an older class-1 waiter -- */
    k[0] = plain_class(4);
    k[1] = plain_class(4);
    g = class_gate(1, 4, k, 2);
    lg_permit *held = NULL, *p = NULL;
    OK(lg_gate_try_admit_at(g, 1, &held));
    outcome low = {0, LG_PANIC, NULL}, high = {0, LG_PANIC, NULL}, last = {0, LG_PANIC, NULL};
    OK(lg_gate_admit_async_at(g, 1, record, &low, NULL));
    OK(lg_gate_admit_async_at(g, 0, record, &high, NULL));
    OK(lg_gate_admit_async_at(g, 200, record, &last, NULL)); /* past the last: class 1 */
    EXPECT(lg_gate_try_admit_at(g, 0, &p), LG_WOULD_WAIT);
    EXPECT(lg_gate_admit_at(g, 0, 10, &p), LG_TIMED_OUT);
    CHECK(p == NULL);
    OK(lg_gate_get_stats(g, &s));
    CHECK(s.class_count == 2 && s.queued == 3);
    CHECK(s.classes[0].queued == 1 && s.classes[1].queued == 2);
    CHECK(low.calls == 0 && high.calls == 0 && last.calls == 0);
    lg_permit_release(held);
    CHECK(high.calls == 1 && high.status == LG_OK && high.permit != NULL);
    CHECK(low.calls == 0 && last.calls == 0);
    lg_permit_release(high.permit);
    CHECK(low.calls == 1 && low.status == LG_OK && last.calls == 0); /* FIFO within a class */
    lg_permit_release(low.permit);
    CHECK(last.calls == 1 && last.status == LG_OK);
    lg_permit_release(last.permit);
    INVALID(lg_gate_try_admit_at(NULL, 0, &p));
    INVALID(lg_gate_try_admit_at(g, 0, NULL));
    INVALID(lg_gate_admit_at(NULL, 0, 1, &p));
    INVALID(lg_gate_admit_at(g, 0, 1, NULL));
    INVALID(lg_gate_admit_async_at(g, 1, NULL, &low, NULL));
    INVALID(lg_gate_admit_async_at(NULL, 1, record, &low, NULL));
    /* Blocking admits at a class, a slot free: at once. */
    OK(lg_gate_admit_at(g, 1, LG_TIMEOUT_INFINITE, &p));
    lg_permit_release(p);
    lg_gate_free(g);

    /* -- a full queue: a class-0 arrival displaces the newest class-1 waiter -- */
    k[0] = plain_class(2);
    k[1] = plain_class(2);
    g = class_gate(1, 2, k, 2);
    OK(lg_gate_try_admit_at(g, 0, &held));
    outcome old1 = {0, LG_PANIC, NULL}, new1 = {0, LG_PANIC, NULL}, top = {0, LG_PANIC, NULL};
    outcome more = {0, LG_PANIC, NULL};
    lg_ticket *t_new1 = NULL;
    OK(lg_gate_admit_async_at(g, 1, record, &old1, NULL));
    OK(lg_gate_admit_async_at(g, 1, record, &new1, &t_new1));
    OK(lg_gate_admit_async_at(g, 0, record, &top, NULL)); /* runs new1's callback here */
    CHECK(new1.calls == 1 && new1.status == LG_DISPLACED && new1.permit == NULL);
    CHECK(old1.calls == 0 && top.calls == 0);
    CHECK(lg_status_http(new1.status) == 429); /* the overload status main() set */
    CHECK(strcmp(lg_status_reason(new1.status), "displaced") == 0);
    CHECK(contains(lg_status_str(new1.status), "Server overloaded"));
    bool cancelled = true;
    OK(lg_ticket_cancel(t_new1, &cancelled));
    CHECK(!cancelled); /* already told */
    lg_ticket_free(t_new1);
    /* Nobody below class 1: a class-1 arrival is rejected, not queued. */
    OK(lg_gate_admit_async_at(g, 1, record, &more, NULL));
    CHECK(more.calls == 1 && more.status == LG_AT_CAPACITY);
    EXPECT(lg_gate_admit_at(g, 1, LG_TIMEOUT_INFINITE, &p), LG_AT_CAPACITY);
    OK(lg_gate_get_stats(g, &s));
    CHECK(s.running == 1 && s.queued == 2); /* N + Q exact */
    CHECK(s.displaced == 1 && s.classes[1].displaced == 1 && s.classes[0].displaced == 0);
    CHECK(s.classes[1].rejected_at_capacity == 2 && s.rejected_at_capacity == 2);
    CHECK(s.classes[0].queued == 1 && s.classes[1].queued == 1);
    size_t needed = 0;
    EXPECT(lg_gate_metrics(g, NULL, 0, &needed), LG_BUFFER_TOO_SMALL);
    char *text = malloc(needed + 1);
    CHECK(text != NULL);
    OK(lg_gate_metrics(g, text, needed + 1, &needed));
    CHECK(contains(text,
                   "dynamo_request_rejection_by_class_total{class=\"1\",reason=\"displaced\"} 1\n"));
    CHECK(contains(text, "dynamo_request_queue_by_class{class=\"0\"} 1\n"));
    free(text);
    lg_permit_release(held);
    CHECK(top.calls == 1 && top.status == LG_OK);
    lg_permit_release(top.permit);
    CHECK(old1.calls == 1 && old1.status == LG_OK);
    lg_permit_release(old1.permit);
    lg_gate_free(g);

    /* -- reserved slots: the last of N = 2 is for class 0 only -- */
    k[0].reserved = 1;
    g = class_gate(2, 2, k, 2);
    lg_permit *p1 = NULL, *p0 = NULL;
    OK(lg_gate_try_admit_at(g, 1, &p1));
    EXPECT(lg_gate_try_admit_at(g, 1, &p), LG_WOULD_WAIT); /* a slot, but reserved */
    OK(lg_gate_try_admit_at(g, 0, &p0));
    lg_permit_release(p0);
    outcome w1 = {0, LG_PANIC, NULL};
    OK(lg_gate_admit_async_at(g, 1, record, &w1, NULL));
    CHECK(w1.calls == 0); /* waits with a slot free: not class 1's */
    OK(lg_gate_get_stats(g, &s));
    CHECK(s.running == 1 && s.classes[1].queued == 1);
    OK(lg_gate_try_admit_at(g, 0, &p0)); /* class 0 passes the less important waiter */
    lg_permit_release(p1);
    CHECK(w1.calls == 0); /* the free slot is still the reserved one */
    lg_permit_release(p0);
    CHECK(w1.calls == 1 && w1.status == LG_OK);
    lg_permit_release(w1.permit);
    OK(lg_gate_get_stats(g, &s));
    CHECK(s.running == 0 && s.classes[1].rejected_at_capacity == 0); /* WOULD_WAIT is no rejection */
    lg_gate_free(g);
    k[0].reserved = 0;

    /* -- a class that never waits is shed, with the queue not full -- */
    k[1] = plain_class(0);
    g = class_gate(1, 4, k, 2);
    OK(lg_gate_try_admit_at(g, 0, &held));
    outcome shed = {0, LG_PANIC, NULL};
    OK(lg_gate_admit_async_at(g, 1, record, &shed, NULL));
    CHECK(shed.calls == 1 && shed.status == LG_AT_CAPACITY);
    OK(lg_gate_get_stats(g, &s));
    CHECK(s.queued == 0 && s.classes[1].queue_limit == 0 && s.classes[1].rejected_at_capacity == 1);
    lg_permit_release(held);
    lg_gate_free(g);

    /* -- each class has its own deadline; the gate's is not used -- */
    k[0] = plain_class(4);
    k[1] = plain_class(4);
    k[1].queue_timeout_ms = 20;
    OK(lg_gate_config_default(1, &c));
    c.queue = 4;
    c.queue_timeout_ms = 1; /* replaced by the classes' own */
    c.classes = k;
    c.class_count = 2;
    OK(lg_gate_new(&c, &g));
    OK(lg_gate_try_admit_at(g, 0, &held));
    outcome slow = {0, LG_PANIC, NULL}, fast = {0, LG_PANIC, NULL}, shut = {0, LG_PANIC, NULL};
    OK(lg_gate_admit_async_at(g, 0, record, &slow, NULL));
    OK(lg_gate_admit_async_at(g, 1, record, &fast, NULL));
    sleep_ms(30);
    size_t expired = 0;
    OK(lg_gate_expire(g, &expired));
    CHECK(expired == 1 && fast.calls == 1 && fast.status == LG_QUEUE_TIMEOUT);
    CHECK(slow.calls == 0);
    uint64_t wait_ns = 0;
    OK(lg_gate_next_deadline(g, &wait_ns));
    CHECK(wait_ns == LG_TIMEOUT_INFINITE); /* class 0 has none */
    /* -- close: each class's waiters are rejected and counted -- */
    OK(lg_gate_admit_async_at(g, 1, record, &shut, NULL));
    OK(lg_gate_close(g));
    CHECK(slow.calls == 1 && slow.status == LG_CLOSED);
    CHECK(shut.calls == 1 && shut.status == LG_CLOSED);
    EXPECT(lg_gate_try_admit_at(g, 1, &p), LG_CLOSED); /* not counted: it never queues */
    EXPECT(lg_gate_admit_at(g, 0, 10, &p), LG_CLOSED);
    outcome after = {0, LG_PANIC, NULL};
    OK(lg_gate_admit_async_at(g, 1, record, &after, NULL));
    CHECK(after.calls == 1 && after.status == LG_CLOSED);
    OK(lg_gate_get_stats(g, &s));
    CHECK(s.classes[0].expired == 0 && s.classes[1].expired == 1 && s.expired == 1);
    CHECK(s.classes[0].rejected_closed == 2 && s.classes[1].rejected_closed == 2);
    CHECK(s.rejected_closed == 4 && s.queued == 0);
    lg_permit_release(held);
    lg_gate_free(g);
}
