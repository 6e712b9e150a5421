/*
 * Calls every function of loadgate.h, on its success path and on every
 * error path: NULL handles and out-parameters, bad lengths, unknown
 * workers, invalid thresholds (NaN, negative, > 1), buffers too small.
 * The cross-machine load reports (lg_reporter_*, lg_monitor_subscribe_nats,
 * lg_nats_options_*) are checked on their error paths always, and end to
 * end through a real nats-server when LG_NATS_URL names one, and one that
 * wants a user and password when LG_NATS_AUTH_URL does
 * (ffi-c/tests/run.sh starts both).
 *
 * Built as C11 with -Wall -Wextra -Wpedantic -Werror and run plain, under
 * valgrind memcheck and with ASan+UBSan by ffi-c/tests/run.sh. Exits 0 when
 * every check passed; prints the failing check and the last error message
 * otherwise.
 */
#define _POSIX_C_SOURCE 200809L

#include <loadgate.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static int checks;

#define CHECK(cond)                                                                        \
    do {                                                                                   \
        checks++;                                                                          \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n", __FILE__,        \
                    __LINE__, #cond, lg_last_error_message());                             \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

/* Expects `call` to return `want`; on an error, also that the last error
 * message is non-empty. */
#define EXPECT(call, want)                                                                 \
    do {                                                                                   \
        lg_status got_ = (call);                                                           \
        checks++;                                                                          \
        if (got_ != (want)) {                                                              \
            fprintf(stderr, "%s:%d: %s returned %d (%s), expected %s (last error: %s)\n",  \
                    __FILE__, __LINE__, #call, (int)got_, lg_status_str((int)got_), #want, \
                    lg_last_error_message());                                              \
            exit(1);                                                                       \
        }                                                                                  \
        if (got_ != LG_OK && lg_last_error_message()[0] == '\0') {                         \
            fprintf(stderr, "%s:%d: %s failed without a message\n", __FILE__, __LINE__,    \
                    #call);                                                                \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

#define OK(call) EXPECT(call, LG_OK)
#define INVALID(call) EXPECT(call, LG_INVALID_ARGUMENT)

/* A string literal as pointer and length. */
#define S(lit) (lit), (sizeof(lit) - 1)

static int contains(const char *haystack, const char *needle) {
    return strstr(haystack, needle) != NULL;
}

static int last_error_contains(const char *needle) {
    return contains(lg_last_error_message(), needle);
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static lg_load_report kv_report(uint64_t used, uint64_t total) {
    lg_load_report r;
    memset(&r, 0, sizeof r);
    r.has_kv_used_blocks = true;
    r.kv_used_blocks = used;
    r.has_kv_total_blocks = true;
    r.kv_total_blocks = total;
    return r;
}

/* ----- version, status, last error -------------------------------------- */

static void *other_thread_last_error(void *arg) {
    (void)arg;
    /* Another thread's failures are not visible here. */
    return (void *)(lg_last_error_message()[0] == '\0' ? "empty" : NULL);
}

static void test_version_and_status(void) {
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", LOADGATE_VERSION_MAJOR, LOADGATE_VERSION_MINOR,
             LOADGATE_VERSION_PATCH);
    CHECK(strcmp(lg_version(), want) == 0);

    CHECK(strcmp(lg_last_error_message(), "") == 0);

    const lg_status all[] = {LG_OK,          LG_OVERLOADED,       LG_UNAVAILABLE,
                             LG_WORKER_OVERLOADED, LG_AT_CAPACITY, LG_QUEUE_TIMEOUT,
                             LG_CLOSED,      LG_WOULD_WAIT,       LG_TIMED_OUT,
                             LG_DISPLACED,
                             LG_INVALID_ARGUMENT, LG_NOT_FOUND,   LG_BUFFER_TOO_SMALL,
                             LG_ALREADY_EXISTS, LG_MODEL_FULL,    LG_TRANSPORT_ERROR,
                             LG_PANIC};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        CHECK(lg_status_str((int)all[i]) != NULL);
        CHECK(strcmp(lg_status_str((int)all[i]), "unknown status") != 0);
        CHECK(lg_status_http((int)all[i]) >= 200);
    }
    CHECK(strcmp(lg_status_str(-1), "unknown status") == 0);
    CHECK(strcmp(lg_status_str(LG_OVERLOADED), "All workers are busy, please retry later") == 0);
    CHECK(strcmp(lg_status_str(LG_AT_CAPACITY), "Server overloaded: worker at capacity") == 0);

    /* The overload status comes from DYN_HTTP_OVERLOAD_STATUS_CODE, set by
     * main() before the first call; 503 stays 503. */
    CHECK(lg_overload_status() == 429);
    CHECK(lg_status_http(LG_OK) == 200);
    CHECK(lg_status_http(LG_OVERLOADED) == 429);
    CHECK(lg_status_http(LG_WORKER_OVERLOADED) == 429);
    CHECK(lg_status_http(LG_AT_CAPACITY) == 429);
    CHECK(lg_status_http(LG_QUEUE_TIMEOUT) == 429);
    CHECK(lg_status_http(LG_WOULD_WAIT) == 429);
    CHECK(lg_status_http(LG_TIMED_OUT) == 429);
    CHECK(lg_status_http(LG_DISPLACED) == 429);
    CHECK(lg_status_http(LG_UNAVAILABLE) == 503);
    CHECK(lg_status_http(LG_CLOSED) == 503);
    CHECK(lg_status_http(LG_INVALID_ARGUMENT) == 400);
    CHECK(lg_status_http(LG_NOT_FOUND) == 404);
    CHECK(lg_status_http(LG_ALREADY_EXISTS) == 409);
    CHECK(lg_status_http(LG_TRANSPORT_ERROR) == 500);
    CHECK(lg_status_http(LG_PANIC) == 500);
    CHECK(lg_status_http(99999) == 500);

    CHECK(strcmp(lg_status_reason(LG_OVERLOADED), "all_workers_busy") == 0);
    CHECK(strcmp(lg_status_reason(LG_UNAVAILABLE), "no_workers") == 0);
    CHECK(strcmp(lg_status_reason(LG_WORKER_OVERLOADED), "worker_overloaded") == 0);
    CHECK(strcmp(lg_status_reason(LG_AT_CAPACITY), "worker_at_capacity") == 0);
    CHECK(strcmp(lg_status_reason(LG_QUEUE_TIMEOUT), "queue_timeout") == 0);
    CHECK(strcmp(lg_status_reason(LG_CLOSED), "closed") == 0);
    CHECK(strcmp(lg_status_reason(LG_DISPLACED), "displaced") == 0);
    CHECK(lg_status_reason(LG_OK) == NULL);
    CHECK(lg_status_reason(LG_NOT_FOUND) == NULL);
    CHECK(lg_status_reason(LG_TRANSPORT_ERROR) == NULL);
    CHECK(lg_status_reason(-5) == NULL);

    /* The last error is per thread, and success leaves it alone. */
    INVALID(lg_monitor_new(NULL, NULL));
    CHECK(last_error_contains("out_monitor must not be NULL"));
    pthread_t t;
    void *result = NULL;
    CHECK(pthread_create(&t, NULL, other_thread_last_error, NULL) == 0);
    CHECK(pthread_join(t, &result) == 0);
    CHECK(result != NULL);
    CHECK(strcmp(lg_version(), want) == 0);
    CHECK(last_error_contains("out_monitor must not be NULL"));
}

/* ----- HTTP helpers ------------------------------------------------------ */

static void test_error_response(void) {
    char body[512];
    size_t needed = 0;
    uint16_t http = 0;
    uint64_t retry = 0;

    OK(lg_error_response(LG_OVERLOADED, LG_ERROR_STYLE_DYNAMO, 1500, &http, &retry, body,
                         sizeof body, &needed));
    CHECK(http == 429);
    CHECK(retry == 2);
    CHECK(needed == strlen(body));
    CHECK(strcmp(body, "{\"message\":\"Service temporarily overloaded\",\"type\":\"Overloaded\","
                       "\"code\":429}") == 0);

    OK(lg_error_response(LG_UNAVAILABLE, LG_ERROR_STYLE_OPENAI, 0, &http, &retry, body,
                         sizeof body, &needed));
    CHECK(http == 503);
    CHECK(retry == 1);
    CHECK(contains(body, "\"code\":\"no_workers\""));

    OK(lg_error_response(LG_AT_CAPACITY, LG_ERROR_STYLE_ANTHROPIC, 3000, &http, &retry, body,
                         sizeof body, &needed));
    CHECK(http == 429 && retry == 3);
    CHECK(contains(body, "overloaded_error"));

    /* Buffer too small: snprintf semantics, status and length still given. */
    char tiny[8];
    http = 0;
    EXPECT(lg_error_response(LG_WORKER_OVERLOADED, LG_ERROR_STYLE_DYNAMO, 1000, &http, &retry,
                             tiny, sizeof tiny, &needed),
           LG_BUFFER_TOO_SMALL);
    CHECK(needed > sizeof tiny && http == 429);
    CHECK(strlen(tiny) == sizeof tiny - 1);
    CHECK(last_error_contains("too small"));
    size_t size_only = 0;
    EXPECT(lg_error_response(LG_QUEUE_TIMEOUT, LG_ERROR_STYLE_DYNAMO, 1000, &http, &retry, NULL,
                             0, &size_only),
           LG_BUFFER_TOO_SMALL);
    CHECK(size_only > 0);

    INVALID(lg_error_response(LG_OK, LG_ERROR_STYLE_DYNAMO, 1000, &http, &retry, body,
                              sizeof body, &needed));
    CHECK(last_error_contains("not a rejection"));
    INVALID(lg_error_response(LG_NOT_FOUND, LG_ERROR_STYLE_DYNAMO, 1000, &http, &retry, body,
                              sizeof body, &needed));
    INVALID(lg_error_response(LG_OVERLOADED, 7, 1000, &http, &retry, body, sizeof body,
                              &needed));
    INVALID(lg_error_response(LG_OVERLOADED, LG_ERROR_STYLE_DYNAMO, 1000, NULL, &retry, body,
                              sizeof body, &needed));
    INVALID(lg_error_response(LG_OVERLOADED, LG_ERROR_STYLE_DYNAMO, 1000, &http, NULL, body,
                              sizeof body, &needed));
    INVALID(lg_error_response(LG_OVERLOADED, LG_ERROR_STYLE_DYNAMO, 1000, &http, &retry, body,
                              sizeof body, NULL));
    INVALID(lg_error_response(LG_OVERLOADED, LG_ERROR_STYLE_DYNAMO, 1000, &http, &retry, NULL,
                              16, &needed));
}

/* ----- monitor ----------------------------------------------------------- */

static void test_monitor_config(void) {
    lg_monitor_config c;
    lg_monitor *m = NULL;

    INVALID(lg_monitor_config_default(NULL));
    OK(lg_monitor_config_default(&c));
    CHECK(c.lease_ms == 1000 && c.stale_after_ms == 3000);
    CHECK(c.staleness == LG_STALENESS_KEEP && c.max_workers_per_model == 4096);
    CHECK(c.metrics_prefix == NULL && c.metrics_prefix_len == 0);
    CHECK(c.max_models == 256 && c.max_workers == 16384 && c.max_ranks_per_worker == 1024);
    CHECK(c.max_ranks == 65536 && c.max_name_len == 256);

    /* Sizes are bounded before anything is allocated: 2^31 ranks were 120 GB. */
    OK(lg_monitor_new(&c, &m));
    lg_worker_spec huge;
    memset(&huge, 0, sizeof huge);
    huge.dp_size = UINT32_C(1) << 31;
    INVALID(lg_monitor_add_worker(m, S("m"), 1, &huge));
    CHECK(last_error_contains("max_ranks_per_worker"));
    char long_name[300];
    memset(long_name, 'x', sizeof long_name);
    INVALID(lg_monitor_add_worker(m, long_name, sizeof long_name, 1, NULL));
    CHECK(last_error_contains("max_name_len"));
    lg_monitor_free(m);
    m = NULL;
    c.max_models = 1;
    c.max_workers = 2;
    OK(lg_monitor_new(&c, &m));
    OK(lg_monitor_add_worker(m, S("a"), 1, NULL));
    INVALID(lg_monitor_add_worker(m, S("b"), 2, NULL));
    CHECK(last_error_contains("max_models"));
    OK(lg_monitor_add_worker(m, S("a"), 2, NULL));
    INVALID(lg_monitor_add_worker(m, S("a"), 3, NULL));
    CHECK(last_error_contains("max_workers"));
    lg_monitor_free(m);
    m = NULL;
    OK(lg_monitor_config_default(&c));
    c.max_ranks_per_worker = 0;
    INVALID(lg_monitor_new(&c, &m));
    CHECK(last_error_contains("max_ranks_per_worker"));
    OK(lg_monitor_config_default(&c));

    /* Invalid settings: nothing is created, the out-parameter is untouched. */
    lg_monitor *untouched = (lg_monitor *)&c;
    c.lease_ms = 0;
    INVALID(lg_monitor_new(&c, &untouched));
    CHECK(untouched == (lg_monitor *)&c);
    CHECK(last_error_contains("lease"));
    OK(lg_monitor_config_default(&c));
    c.stale_after_ms = 0;
    INVALID(lg_monitor_new(&c, &m));
    OK(lg_monitor_config_default(&c));
    c.staleness = 9;
    INVALID(lg_monitor_new(&c, &m));
    CHECK(last_error_contains("staleness 9"));
    OK(lg_monitor_config_default(&c));
    c.max_workers_per_model = 0;
    INVALID(lg_monitor_new(&c, &m));
    OK(lg_monitor_config_default(&c));
    c.metrics_prefix = "9bad";
    c.metrics_prefix_len = 4;
    INVALID(lg_monitor_new(&c, &m));
    c.metrics_prefix = NULL;
    c.metrics_prefix_len = 3;
    INVALID(lg_monitor_new(&c, &m));
    c.metrics_prefix = "\xff\xfe";
    c.metrics_prefix_len = 2;
    INVALID(lg_monitor_new(&c, &m));
    CHECK(last_error_contains("UTF-8"));
    CHECK(m == NULL);

    /* A custom prefix and a one-worker model. */
    OK(lg_monitor_config_default(&c));
    c.metrics_prefix = "edge_xyz";
    c.metrics_prefix_len = 4; /* only "edge" */
    c.max_workers_per_model = 1;
    OK(lg_monitor_new(&c, &m));
    OK(lg_monitor_add_worker(m, S("tiny"), 1, NULL));
    EXPECT(lg_monitor_add_worker(m, S("tiny"), 2, NULL), LG_MODEL_FULL);
    CHECK(last_error_contains("maximum of 1"));
    char text[4096];
    size_t needed = 0;
    OK(lg_monitor_metrics(m, text, sizeof text, &needed));
    CHECK(contains(text, "edge_frontend_model_workers{model=\"tiny\"} 1"));
    lg_monitor_free(m);

    lg_monitor_free(NULL);
}

static void test_monitor(void) {
    lg_monitor *m = NULL;
    OK(lg_monitor_new(NULL, &m));
    CHECK(m != NULL);

    /* -- workers -- */
    lg_worker_spec spec;
    memset(&spec, 0, sizeof spec);
    spec.dp_start = 0;
    spec.dp_size = 2;
    spec.has_kv_total_blocks = true;
    spec.kv_total_blocks = 100;
    for (uint64_t id = 101; id <= 104; id++) {
        OK(lg_monitor_add_worker(m, S("llama"), id, &spec));
    }
    OK(lg_monitor_add_worker(m, S("other"), 900, NULL)); /* default: one rank 0..1 */

    INVALID(lg_monitor_add_worker(NULL, S("llama"), 1, &spec));
    INVALID(lg_monitor_add_worker(m, NULL, 5, 1, &spec));
    INVALID(lg_monitor_add_worker(m, "", 0, 1, &spec));
    CHECK(last_error_contains("must not be empty"));
    INVALID(lg_monitor_add_worker(m, "\xc3\x28", 2, 1, &spec));
    INVALID(lg_monitor_add_worker(m, "llama", SIZE_MAX, 1, &spec));
    CHECK(last_error_contains("out of range"));
    EXPECT(lg_monitor_add_worker(m, S("llama"), 101, &spec), LG_ALREADY_EXISTS);
    CHECK(last_error_contains("already registered"));
    lg_worker_spec overflow = spec;
    overflow.dp_start = UINT32_MAX;
    overflow.dp_size = 2;
    INVALID(lg_monitor_add_worker(m, S("llama"), 7, &overflow));
    CHECK(last_error_contains("dp_start"));

    /* -- thresholds: validation first, then a real one -- */
    lg_threshold_update u;
    lg_thresholds t;
    memset(&u, 0, sizeof u);
    const double bad_decode[] = {NAN, -0.1, 1.5, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof bad_decode / sizeof bad_decode[0]; i++) {
        u.has_active_decode_blocks_threshold = true;
        u.active_decode_blocks_threshold = bad_decode[i];
        INVALID(lg_monitor_set_thresholds(m, S("llama"), &u, &t));
        CHECK(last_error_contains("active_decode_blocks_threshold"));
        CHECK(last_error_contains("[0, 1]"));
    }
    memset(&u, 0, sizeof u);
    const double bad_frac[] = {NAN, -1.0, INFINITY};
    for (size_t i = 0; i < sizeof bad_frac / sizeof bad_frac[0]; i++) {
        u.has_active_prefill_tokens_threshold_frac = true;
        u.active_prefill_tokens_threshold_frac = bad_frac[i];
        INVALID(lg_monitor_set_thresholds(m, S("llama"), &u, &t));
        CHECK(last_error_contains("active_prefill_tokens_threshold_frac"));
    }
    memset(&u, 0, sizeof u);
    u.clear = 16;
    INVALID(lg_monitor_set_thresholds(m, S("llama"), &u, &t));
    CHECK(last_error_contains("unknown bits"));
    u.clear = LG_CLEAR_ACTIVE_PREFILL_TOKENS_THRESHOLD;
    u.has_active_prefill_tokens_threshold = true;
    u.active_prefill_tokens_threshold = 10;
    INVALID(lg_monitor_set_thresholds(m, S("llama"), &u, &t));
    CHECK(last_error_contains("both set and cleared"));
    memset(&u, 0, sizeof u);
    u.has_active_decode_blocks_threshold = true;
    u.active_decode_blocks_threshold = 0.5;
    EXPECT(lg_monitor_set_thresholds(m, S("nope"), &u, &t), LG_NOT_FOUND);
    CHECK(last_error_contains("unknown model"));
    INVALID(lg_monitor_set_thresholds(NULL, S("llama"), &u, &t));
    INVALID(lg_monitor_set_thresholds(m, S("llama"), NULL, &t));
    INVALID(lg_monitor_set_thresholds(m, NULL, 3, &u, &t));

    /* Nothing refused above changed anything. */
    OK(lg_monitor_get_thresholds(m, S("llama"), &t));
    CHECK(t.version == 0);
    CHECK(!t.has_active_decode_blocks_threshold && !t.has_active_prefill_tokens_threshold &&
          !t.has_active_prefill_tokens_threshold_frac);

    u.active_decode_blocks_threshold = 0.9;
    OK(lg_monitor_set_thresholds(m, S("llama"), &u, &t));
    CHECK(t.version == 1 && t.has_active_decode_blocks_threshold &&
          t.active_decode_blocks_threshold == 0.9);
    memset(&u, 0, sizeof u);
    u.has_active_prefill_tokens_threshold_frac = true;
    u.active_prefill_tokens_threshold_frac = 64.0; /* above 1 is legal */
    OK(lg_monitor_set_thresholds(m, S("llama"), &u, NULL));
    memset(&u, 0, sizeof u); /* nothing set, nothing cleared: a read */
    OK(lg_monitor_set_thresholds(m, S("llama"), &u, &t));
    CHECK(t.version == 2 && t.has_active_prefill_tokens_threshold_frac &&
          t.active_prefill_tokens_threshold_frac == 64.0 &&
          t.active_decode_blocks_threshold == 0.9);
    u.clear = LG_CLEAR_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC;
    OK(lg_monitor_set_thresholds(m, S("llama"), &u, &t));
    CHECK(t.version == 3 && !t.has_active_prefill_tokens_threshold_frac &&
          t.has_active_decode_blocks_threshold);

    lg_thresholds untouched_t;
    memset(&untouched_t, 0x5a, sizeof untouched_t);
    EXPECT(lg_monitor_get_thresholds(m, S("nope"), &untouched_t), LG_NOT_FOUND);
    CHECK(untouched_t.version == 0x5a5a5a5a5a5a5a5aULL);
    INVALID(lg_monitor_get_thresholds(m, S("llama"), NULL));
    INVALID(lg_monitor_get_thresholds(NULL, S("llama"), &t));
    INVALID(lg_monitor_get_thresholds(m, "\xff", 1, &t));

    /* -- reports and the busy rule (decode 0.9 of 100 blocks: busy > 90) -- */
    lg_load_report r = kv_report(95, 100);
    OK(lg_monitor_report(m, 102, 0, &r));
    bool busy = true;
    OK(lg_monitor_is_busy(m, 102, &busy));
    CHECK(!busy); /* one of two ranks busy: the worker is not */
    OK(lg_monitor_report(m, 102, 1, &r));
    OK(lg_monitor_is_busy(m, 102, &busy));
    CHECK(busy);
    lg_load_report empty;
    memset(&empty, 0, sizeof empty);
    OK(lg_monitor_report(m, 102, 1, &empty)); /* absent fields keep their value */
    OK(lg_monitor_is_busy(m, 102, &busy));
    CHECK(busy);

    EXPECT(lg_monitor_report(m, 555, 0, &r), LG_NOT_FOUND);
    CHECK(last_error_contains("unknown worker 555"));
    EXPECT(lg_monitor_report(m, 101, 2, &r), LG_NOT_FOUND);
    CHECK(last_error_contains("no dp_rank 2"));
    lg_load_report huge;
    memset(&huge, 0, sizeof huge);
    huge.has_active_prefill_tokens = true;
    huge.active_prefill_tokens = UINT64_MAX;
    INVALID(lg_monitor_report(m, 101, 0, &huge));
    INVALID(lg_monitor_report(NULL, 101, 0, &r));
    INVALID(lg_monitor_report(m, 101, 0, NULL));
    CHECK(last_error_contains("report must not be NULL"));

    INVALID(lg_monitor_is_busy(m, 101, NULL));
    INVALID(lg_monitor_is_busy(NULL, 101, &busy));
    EXPECT(lg_monitor_is_busy(m, 555, &busy), LG_NOT_FOUND);

    /* -- select: round robin skips the busy worker -- */
    uint64_t seen[4] = {0, 0, 0, 0};
    for (int i = 0; i < 30; i++) {
        uint64_t w = 0;
        OK(lg_monitor_select(m, S("llama"), LG_POLICY_ROUND_ROBIN, &w));
        CHECK(w >= 101 && w <= 104 && w != 102);
        seen[w - 101]++;
    }
    CHECK(seen[0] == 10 && seen[1] == 0 && seen[2] == 10 && seen[3] == 10);
    for (int i = 0; i < 20; i++) {
        uint64_t w = 0;
        OK(lg_monitor_select(m, S("llama"), LG_POLICY_RANDOM, &w));
        CHECK(w != 102);
        OK(lg_monitor_select(m, S("llama"), LG_POLICY_POWER_OF_TWO, &w));
        CHECK(w != 102);
    }
    uint64_t w = 77;
    INVALID(lg_monitor_select(m, S("llama"), 3, &w));
    CHECK(last_error_contains("policy 3"));
    INVALID(lg_monitor_select(m, S("llama"), LG_POLICY_ROUND_ROBIN, NULL));
    INVALID(lg_monitor_select(NULL, S("llama"), LG_POLICY_ROUND_ROBIN, &w));
    INVALID(lg_monitor_select(m, NULL, 1, LG_POLICY_ROUND_ROBIN, &w));
    EXPECT(lg_monitor_select(m, S("unknown-model"), LG_POLICY_ROUND_ROBIN, &w), LG_UNAVAILABLE);
    CHECK(strcmp(lg_last_error_message(), "No workers available") == 0);
    CHECK(w == 77);

    /* -- select_min_cost -- */
    const uint64_t ids[] = {101, 102, 103, 999, 900};
    const double costs[] = {5.0, 0.0, 2.0, 0.0, 0.0};
    OK(lg_monitor_select_min_cost(m, S("llama"), ids, costs, 5, &w));
    CHECK(w == 103); /* 102 is busy, 999 unknown, 900 of another model */
    const double nan_costs[] = {NAN, 0.0, NAN, 0.0, 0.0};
    OK(lg_monitor_select_min_cost(m, S("llama"), ids, nan_costs, 3, &w));
    CHECK(w == 101); /* NaN ranks last; ties keep the first */
    EXPECT(lg_monitor_select_min_cost(m, S("llama"), NULL, NULL, 0, &w), LG_OVERLOADED);
    INVALID(lg_monitor_select_min_cost(m, S("llama"), NULL, costs, 2, &w));
    INVALID(lg_monitor_select_min_cost(m, S("llama"), ids, NULL, 2, &w));
    INVALID(lg_monitor_select_min_cost(m, S("llama"), ids, costs, SIZE_MAX / 4, &w));
    INVALID(lg_monitor_select_min_cost(m, S("llama"), ids, costs, 2, NULL));
    INVALID(lg_monitor_select_min_cost(NULL, S("llama"), ids, costs, 2, &w));
    EXPECT(lg_monitor_select_min_cost(m, S("ghost"), ids, costs, 2, &w), LG_UNAVAILABLE);

    /* -- check and overload leases -- */
    OK(lg_monitor_check(m, 101));
    EXPECT(lg_monitor_check(m, 102), LG_WORKER_OVERLOADED);
    CHECK(strcmp(lg_last_error_message(),
                 "Selected worker is overloaded, please retry later") == 0);
    EXPECT(lg_monitor_check(m, 555), LG_NOT_FOUND);
    INVALID(lg_monitor_check(NULL, 101));

    bool leased = true;
    OK(lg_monitor_is_leased(m, 103, &leased));
    CHECK(!leased);
    OK(lg_monitor_mark_overloaded(m, 103));
    OK(lg_monitor_is_leased(m, 103, &leased));
    CHECK(leased);
    EXPECT(lg_monitor_check(m, 103), LG_WORKER_OVERLOADED);
    for (int i = 0; i < 10; i++) {
        OK(lg_monitor_select(m, S("llama"), LG_POLICY_ROUND_ROBIN, &w));
        CHECK(w == 101 || w == 104);
    }
    lg_load_report calm = kv_report(10, 100);
    OK(lg_monitor_report(m, 103, 0, &calm)); /* a not-busy report ends the lease */
    OK(lg_monitor_is_leased(m, 103, &leased));
    CHECK(!leased);
    EXPECT(lg_monitor_mark_overloaded(m, 555), LG_NOT_FOUND);
    INVALID(lg_monitor_mark_overloaded(NULL, 101));
    INVALID(lg_monitor_is_leased(m, 103, NULL));
    INVALID(lg_monitor_is_leased(NULL, 103, &leased));
    EXPECT(lg_monitor_is_leased(m, 555, &leased), LG_NOT_FOUND);

    /* Everything busy: 529 (here 429), counted as a rejection. */
    for (uint64_t id = 101; id <= 104; id++) {
        OK(lg_monitor_report(m, id, 0, &r));
        OK(lg_monitor_report(m, id, 1, &r));
    }
    EXPECT(lg_monitor_select(m, S("llama"), LG_POLICY_ROUND_ROBIN, &w), LG_OVERLOADED);
    CHECK(strcmp(lg_last_error_message(), "All workers are busy, please retry later") == 0);
    CHECK(lg_status_http(LG_OVERLOADED) == 429);

    /* -- bookings feed active_decode_blocks -- */
    lg_booking *b = NULL;
    OK(lg_monitor_book(m, 900, 0, 5, &b));
    uint64_t blocks = 0;
    OK(lg_booking_blocks(b, &blocks));
    CHECK(blocks == 5);
    OK(lg_booking_add_output_blocks(b, 3));
    OK(lg_booking_blocks(b, &blocks));
    CHECK(blocks == 8);
    memset(&u, 0, sizeof u);
    u.has_active_decode_blocks_threshold = true;
    u.active_decode_blocks_threshold = 0.5;
    OK(lg_monitor_set_thresholds(m, S("other"), &u, NULL));
    lg_load_report cap;
    memset(&cap, 0, sizeof cap);
    cap.has_kv_total_blocks = true;
    cap.kv_total_blocks = 10;
    OK(lg_monitor_report(m, 900, 0, &cap));
    OK(lg_monitor_is_busy(m, 900, &busy));
    CHECK(busy); /* 8 booked blocks > 0.5 * 10 */
    lg_booking_free(b);
    OK(lg_monitor_is_busy(m, 900, &busy));
    CHECK(!busy);
    lg_booking *nb = NULL;
    EXPECT(lg_monitor_book(m, 555, 0, 1, &nb), LG_NOT_FOUND);
    EXPECT(lg_monitor_book(m, 900, 3, 1, &nb), LG_NOT_FOUND);
    INVALID(lg_monitor_book(m, 900, 0, 1, NULL));
    INVALID(lg_monitor_book(NULL, 900, 0, 1, &nb));
    CHECK(nb == NULL);
    INVALID(lg_booking_add_output_blocks(NULL, 1));
    INVALID(lg_booking_blocks(NULL, &blocks));
    OK(lg_monitor_book(m, 900, 0, 1, &b));
    INVALID(lg_booking_blocks(b, NULL));
    lg_booking_free(b);
    lg_booking_free(NULL);

    /* -- prefill bookings feed active_prefill_tokens until prefill is done -- */
    memset(&u, 0, sizeof u);
    u.has_active_prefill_tokens_threshold = true;
    u.active_prefill_tokens_threshold = 100;
    OK(lg_monitor_set_thresholds(m, S("other"), &u, NULL));
    OK(lg_monitor_is_busy(m, 900, &busy));
    CHECK(!busy); /* no prefill count on the rank yet */
    OK(lg_monitor_book_prefill(m, 900, 0, 2, 150, &b));
    OK(lg_monitor_is_busy(m, 900, &busy));
    CHECK(busy); /* 150 booked prompt tokens > 100 */
    OK(lg_booking_prefill_done(b));
    OK(lg_booking_prefill_done(b)); /* twice: frees once */
    OK(lg_monitor_is_busy(m, 900, &busy));
    CHECK(!busy);
    OK(lg_booking_blocks(b, &blocks));
    CHECK(blocks == 2); /* the blocks stay booked */
    lg_booking_free(b);
    INVALID(lg_booking_prefill_done(NULL));
    INVALID(lg_monitor_book_prefill(m, 900, 0, 1, 1, NULL));
    EXPECT(lg_monitor_book_prefill(m, 555, 0, 1, 1, &nb), LG_NOT_FOUND);
    CHECK(nb == NULL);
    memset(&u, 0, sizeof u);
    u.clear = LG_CLEAR_ACTIVE_PREFILL_TOKENS_THRESHOLD;
    OK(lg_monitor_set_thresholds(m, S("other"), &u, NULL));

    /* -- staleness and sweep -- */
    /* Setting the policy sweeps once, which notes the last report. */
    OK(lg_monitor_set_staleness(m, S("other"), LG_STALENESS_BUSY, 1));
    OK(lg_monitor_is_busy(m, 900, &busy));
    CHECK(!busy);
    sleep_ms(5);
    size_t changed = 99;
    OK(lg_monitor_sweep(m, &changed));
    CHECK(changed == 1);
    OK(lg_monitor_is_busy(m, 900, &busy));
    CHECK(busy); /* silent for longer than stale_after counts as busy */
    OK(lg_monitor_set_staleness(m, S("other"), LG_STALENESS_KEEP, 3000));
    OK(lg_monitor_is_busy(m, 900, &busy));
    CHECK(!busy);
    OK(lg_monitor_sweep(m, NULL));
    INVALID(lg_monitor_sweep(NULL, &changed));
    INVALID(lg_monitor_set_staleness(m, S("other"), 3, 1000));
    INVALID(lg_monitor_set_staleness(m, S("other"), LG_STALENESS_FREE, 0));
    EXPECT(lg_monitor_set_staleness(m, S("ghost"), LG_STALENESS_FREE, 10), LG_NOT_FOUND);
    INVALID(lg_monitor_set_staleness(NULL, S("other"), LG_STALENESS_FREE, 10));

    /* -- metrics, snprintf semantics -- */
    size_t needed = 0;
    EXPECT(lg_monitor_metrics(m, NULL, 0, &needed), LG_BUFFER_TOO_SMALL);
    CHECK(needed > 100);
    char *text = malloc(needed + 1);
    CHECK(text != NULL);
    size_t again = 0;
    OK(lg_monitor_metrics(m, text, needed + 1, &again));
    CHECK(again == needed && strlen(text) == needed);
    CHECK(contains(text, "dynamo_frontend_model_rejection_total{model=\"llama\",endpoint=\"generate\"}"));
    CHECK(contains(text, "dynamo_frontend_worker_active_decode_blocks{dp_rank=\"0\",worker_id=\"101\",worker_type=\"decode\"}"));
    EXPECT(lg_monitor_metrics(m, text, needed, &again), LG_BUFFER_TOO_SMALL);
    CHECK(strlen(text) == needed - 1); /* truncated, NUL-terminated */
    free(text);
    char small[16];
    EXPECT(lg_monitor_metrics(m, small, sizeof small, &needed), LG_BUFFER_TOO_SMALL);
    CHECK(strlen(small) == sizeof small - 1);
    INVALID(lg_monitor_metrics(m, small, sizeof small, NULL));
    INVALID(lg_monitor_metrics(m, NULL, 10, &needed));
    INVALID(lg_monitor_metrics(NULL, small, sizeof small, &needed));

    /* -- /busy_threshold -- */
    char resp[1024];
    uint16_t status = 0;
    OK(lg_monitor_handle_busy_threshold(m, S("GET"), NULL, 0, NULL, 0, &status, resp,
                                        sizeof resp, &needed));
    CHECK(status == 200 && contains(resp, "\"thresholds\""));
    CHECK(contains(resp, "\"model\":\"llama\""));
    const char *post = "{\"model\":\"llama\",\"active_decode_blocks_threshold\":0.97}";
    OK(lg_monitor_handle_busy_threshold(m, S("POST"), S("application/json"),
                                        (const uint8_t *)post, strlen(post), &status, resp,
                                        sizeof resp, &needed));
    CHECK(status == 200 && contains(resp, "\"active_decode_blocks_threshold\":0.97"));
    CHECK(contains(resp, "\"version\":4"));
    OK(lg_monitor_get_thresholds(m, S("llama"), &t));
    CHECK(t.version == 4 && t.active_decode_blocks_threshold == 0.97);
    OK(lg_monitor_is_busy(m, 101, &busy));
    CHECK(!busy); /* 95 of 100 is not above 97 */

    struct {
        const char *method, *ctype, *body;
        uint16_t want;
    } cases[] = {
        {"POST", "application/json", "{\"model\":", 400},
        {"POST", "application/json", "{\"model\":\"llama\",\"active_decode_blocks_threshold\":2}",
         400},
        {"POST", "application/json", "{\"model\":5}", 422},
        {"POST", "application/json", "{\"model\":\"ghost\",\"active_prefill_tokens_threshold\":3}",
         404},
        {"POST", "text/plain", "{}", 415},
        {"POST", NULL, "{}", 415},
        {"PUT", "application/json", "{}", 405},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        OK(lg_monitor_handle_busy_threshold(
            m, cases[i].method, strlen(cases[i].method), cases[i].ctype,
            cases[i].ctype ? strlen(cases[i].ctype) : 0, (const uint8_t *)cases[i].body,
            strlen(cases[i].body), &status, resp, sizeof resp, &needed));
        CHECK(status == cases[i].want);
    }
    size_t big_len = 2 * 1024 * 1024 + 1;
    uint8_t *big = malloc(big_len);
    CHECK(big != NULL);
    memset(big, ' ', big_len);
    OK(lg_monitor_handle_busy_threshold(m, S("POST"), S("application/json"), big, big_len,
                                        &status, resp, sizeof resp, &needed));
    CHECK(status == 413);
    free(big);
    OK(lg_monitor_get_thresholds(m, S("llama"), &t));
    CHECK(t.version == 4); /* none of the failures changed anything */

    char tiny[10];
    status = 0;
    EXPECT(lg_monitor_handle_busy_threshold(m, S("GET"), NULL, 0, NULL, 0, &status, tiny,
                                            sizeof tiny, &needed),
           LG_BUFFER_TOO_SMALL);
    CHECK(status == 200 && needed > sizeof tiny && strlen(tiny) == sizeof tiny - 1);
    INVALID(lg_monitor_handle_busy_threshold(NULL, S("GET"), NULL, 0, NULL, 0, &status, resp,
                                             sizeof resp, &needed));
    INVALID(lg_monitor_handle_busy_threshold(m, NULL, 0, NULL, 0, NULL, 0, &status, resp,
                                             sizeof resp, &needed));
    INVALID(lg_monitor_handle_busy_threshold(m, S("GET"), NULL, 4, NULL, 0, &status, resp,
                                             sizeof resp, &needed));
    INVALID(lg_monitor_handle_busy_threshold(m, S("POST"), S("application/json"), NULL, 5,
                                             &status, resp, sizeof resp, &needed));
    INVALID(lg_monitor_handle_busy_threshold(m, S("GET"), NULL, 0, NULL, 0, NULL, resp,
                                             sizeof resp, &needed));
    INVALID(lg_monitor_handle_busy_threshold(m, S("GET"), NULL, 0, NULL, 0, &status, resp,
                                             sizeof resp, NULL));

    /* -- removal -- */
    OK(lg_monitor_remove_worker(m, 104));
    EXPECT(lg_monitor_remove_worker(m, 104), LG_NOT_FOUND);
    CHECK(last_error_contains("unknown worker 104"));
    INVALID(lg_monitor_remove_worker(NULL, 101));
    EXPECT(lg_monitor_is_busy(m, 104, &busy), LG_NOT_FOUND);
    OK(lg_monitor_remove_worker(m, 900));
    EXPECT(lg_monitor_select(m, S("other"), LG_POLICY_ROUND_ROBIN, &w), LG_UNAVAILABLE);
    /* A booking outlives its worker and the monitor itself. */
    OK(lg_monitor_book(m, 101, 1, 4, &b));
    OK(lg_monitor_remove_worker(m, 101));
    OK(lg_booking_add_output_blocks(b, 1));
    lg_monitor_free(m);
    OK(lg_booking_blocks(b, &blocks));
    CHECK(blocks == 5);
    lg_booking_free(b);
}

/* ----- the waiting-requests threshold -------------------------------------- */

static void test_monitor_waiting_requests(void) {
    lg_monitor *m = NULL;
    OK(lg_monitor_new(NULL, &m));
    lg_worker_spec spec;
    memset(&spec, 0, sizeof spec);
    spec.dp_size = 2;
    OK(lg_monitor_add_worker(m, S("llama"), 7, &spec));

    lg_load_report r;
    memset(&r, 0, sizeof r);
    r.has_waiting_requests = true;
    r.waiting_requests = 9;
    OK(lg_monitor_report(m, 7, 0, &r));
    OK(lg_monitor_report(m, 7, 1, &r));

    lg_threshold_update u;
    lg_thresholds t;
    memset(&u, 0, sizeof u);
    u.has_waiting_requests_threshold = true;
    u.waiting_requests_threshold = 8;
    OK(lg_monitor_set_thresholds(m, S("llama"), &u, &t));
    CHECK(t.version == 1 && t.has_waiting_requests_threshold &&
          t.waiting_requests_threshold == 8 && !t.has_active_decode_blocks_threshold);
    bool busy = false;
    OK(lg_monitor_is_busy(m, 7, &busy));
    CHECK(busy); /* 9 > 8 on both ranks, effective before the call returned */

    /* Another field merges; the waiting-requests threshold stays. */
    memset(&u, 0, sizeof u);
    u.has_active_prefill_tokens_threshold = true;
    u.active_prefill_tokens_threshold = 100;
    OK(lg_monitor_set_thresholds(m, S("llama"), &u, &t));
    CHECK(t.version == 2 && t.has_waiting_requests_threshold &&
          t.waiting_requests_threshold == 8);

    r.waiting_requests = 8;
    OK(lg_monitor_report(m, 7, 1, &r));
    OK(lg_monitor_is_busy(m, 7, &busy));
    CHECK(!busy); /* strict: 8 is not above 8 */

    lg_load_report reserved;
    memset(&reserved, 0, sizeof reserved);
    reserved.has_waiting_requests = true;
    reserved.waiting_requests = UINT64_MAX;
    INVALID(lg_monitor_report(m, 7, 0, &reserved));
    CHECK(last_error_contains("waiting_requests"));

    char text[8192];
    size_t needed = 0;
    OK(lg_monitor_metrics(m, text, sizeof text, &needed));
    CHECK(contains(text, "dynamo_frontend_worker_waiting_requests{dp_rank=\"1\",worker_id=\"7\",worker_type=\"decode\"} 8"));

    /* Set and clear of one field at once is refused; the flag clears. */
    memset(&u, 0, sizeof u);
    u.has_waiting_requests_threshold = true;
    u.clear = LG_CLEAR_WAITING_REQUESTS_THRESHOLD;
    INVALID(lg_monitor_set_thresholds(m, S("llama"), &u, &t));
    CHECK(last_error_contains("waiting_requests_threshold"));
    u.has_waiting_requests_threshold = false;
    OK(lg_monitor_set_thresholds(m, S("llama"), &u, &t));
    CHECK(t.version == 3 && !t.has_waiting_requests_threshold &&
          t.has_active_prefill_tokens_threshold);
    u.clear = 16; /* no such flag */
    INVALID(lg_monitor_set_thresholds(m, S("llama"), &u, &t));

    /* The HTTP handler speaks the field too. */
    const char body[] = "{\"model\": \"llama\", \"waiting_requests_threshold\": 3}";
    char resp[512];
    uint16_t status = 0;
    OK(lg_monitor_handle_busy_threshold(m, S("POST"), S("application/json"),
                                        (const uint8_t *)body, sizeof body - 1, &status, resp,
                                        sizeof resp, &needed));
    CHECK(status == 200);
    CHECK(contains(resp, "\"waiting_requests_threshold\":3"));
    OK(lg_monitor_is_busy(m, 7, &busy));
    CHECK(busy);
    lg_monitor_free(m);
}

/* ----- engine scraping ---------------------------------------------------- */

/* A fake vLLM engine: one connection at a time, every request answered with
 * the same /metrics text (keep-alive HTTP/1.1). */
static const char VLLM_METRICS[] =
    "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
    "# TYPE vllm:num_requests_waiting gauge\n"
    "vllm:num_requests_waiting{model_name=\"llama\",engine=\"0\"} 9.0\n"
    "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
    "# TYPE vllm:kv_cache_usage_perc gauge\n"
    "vllm:kv_cache_usage_perc{model_name=\"llama\",engine=\"0\"} 0.5\n"
    "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
    "# TYPE vllm:cache_config_info gauge\n"
    "vllm:cache_config_info{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"100\"} 1.0\n";

struct fake_engine {
    int listen_fd;
    int conn_fd;
    pthread_t thread;
};

static void *fake_engine_run(void *arg) {
    struct fake_engine *e = arg;
    for (;;) {
        int fd = accept(e->listen_fd, NULL, NULL);
        if (fd < 0) {
            return NULL;
        }
        e->conn_fd = fd;
        char buf[4096];
        size_t have = 0;
        for (;;) {
            ssize_t n = read(fd, buf + have, sizeof buf - 1 - have);
            if (n <= 0) {
                break;
            }
            have += (size_t)n;
            buf[have] = '\0';
            char *end = strstr(buf, "\r\n\r\n");
            if (end == NULL) {
                continue;
            }
            char head[128];
            int len = snprintf(head, sizeof head,
                               "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: %zu\r\n\r\n",
                               sizeof VLLM_METRICS - 1);
            /* MSG_NOSIGNAL: a scraper that gave up (its timeout, under
             * valgrind's slow clock) must not kill this process with SIGPIPE. */
            if (send(fd, head, (size_t)len, MSG_NOSIGNAL) != len ||
                send(fd, VLLM_METRICS, sizeof VLLM_METRICS - 1, MSG_NOSIGNAL) !=
                    (ssize_t)(sizeof VLLM_METRICS - 1)) {
                break;
            }
            size_t used = (size_t)(end + 4 - buf);
            memmove(buf, buf + used, have - used);
            have -= used;
        }
        close(fd);
    }
}

/* ----- workers from Dynamo's file discovery store --------------------------- */

/* One Dynamo 1.6.1 model card (the fields loadgate reads, and one it does
 * not), for instance 255 with two ranks of 64 blocks. */
static const char CARD[] =
    "{\"type\":\"Model\",\"namespace\":\"dynamo\",\"component\":\"backend\","
    "\"endpoint\":\"generate\",\"instance_id\":255,\"card_json\":{\"display_name\":\"tiny\","
    "\"runtime_config\":{\"total_kv_blocks\":64,\"max_num_batched_tokens\":8192,"
    "\"data_parallel_start_rank\":0,\"data_parallel_size\":2,\"enable_eagle\":false}}}";

static void test_discovery(void) {
    char root[] = "/tmp/loadgate-c-discovery-XXXXXX";
    CHECK(mkdtemp(root) != NULL);
    char dir[256], card[512];
    snprintf(dir, sizeof dir, "%s/v1", root);
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(dir, sizeof dir, "%s/v1/mdc", root);
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(card, sizeof card, "%s/dynamo%%2Fbackend%%2Fgenerate%%2Fff", dir);
    FILE *f = fopen(card, "w");
    CHECK(f != NULL);
    CHECK(fwrite(CARD, 1, sizeof CARD - 1, f) == sizeof CARD - 1);
    CHECK(fclose(f) == 0);

    lg_monitor *m = NULL;
    OK(lg_monitor_new(NULL, &m));
    lg_discovery *d = NULL;
    OK(lg_monitor_discover_dynamo(m, NULL, 0, root, strlen(root), NULL, 0, NULL, 0, 10, 0, &d));
    CHECK(d != NULL);
    /* Registered when the call returns: two ranks of 64 blocks. */
    bool busy = true;
    OK(lg_monitor_is_busy(m, 255, &busy));
    lg_load_report r;
    memset(&r, 0, sizeof r);
    r.has_kv_used_blocks = true;
    r.kv_used_blocks = 33;
    OK(lg_monitor_report(m, 255, 0, &r));
    OK(lg_monitor_report(m, 255, 1, &r));
    EXPECT(lg_monitor_report(m, 255, 2, &r), LG_NOT_FOUND);
    lg_threshold_update u;
    lg_thresholds t;
    memset(&u, 0, sizeof u);
    u.has_active_decode_blocks_threshold = true;
    u.active_decode_blocks_threshold = 0.5;
    OK(lg_monitor_set_thresholds(m, S("tiny"), &u, &t));
    OK(lg_monitor_is_busy(m, 255, &busy));
    CHECK(busy); /* 33 of 64 on both ranks */
    lg_discovery_stats st;
    OK(lg_discovery_get_stats(d, &st));
    CHECK(st.workers == 1 && st.workers_added == 1 && st.scans >= 1);
    CHECK(st.refused_malformed == 0 && st.refused_registration == 0);

    /* A deleted card takes its worker with it (a limit for hangs only). */
    CHECK(unlink(card) == 0);
    for (int i = 0; i < 6000 && lg_monitor_is_busy(m, 255, &busy) == LG_OK; i++) {
        sleep_ms(5);
    }
    EXPECT(lg_monitor_is_busy(m, 255, &busy), LG_NOT_FOUND);
    OK(lg_discovery_get_stats(d, &st));
    CHECK(st.workers == 0 && st.workers_removed == 1);

    lg_discovery *bad = NULL;
    INVALID(lg_monitor_discover_dynamo(NULL, NULL, 0, root, strlen(root), NULL, 0, NULL, 0, 0, 0,
                                       &bad));
    INVALID(lg_monitor_discover_dynamo(m, S(""), root, strlen(root), NULL, 0, NULL, 0, 0, 0, &bad));
    CHECK(last_error_contains("namespace"));
    INVALID(lg_monitor_discover_dynamo(m, NULL, 3, root, strlen(root), NULL, 0, NULL, 0, 0, 0,
                                       &bad));
    INVALID(lg_monitor_discover_dynamo(m, NULL, 0, root, strlen(root), NULL, 0, NULL, 0, 0,
                                       LG_DISCOVERY_NO_TTL, NULL));
    CHECK(bad == NULL);
    INVALID(lg_discovery_get_stats(NULL, &st));
    INVALID(lg_discovery_get_stats(d, NULL));
    lg_discovery_free(d);
    lg_discovery_free(NULL);
    lg_monitor_free(m);
    CHECK(rmdir(dir) == 0);
    snprintf(dir, sizeof dir, "%s/v1", root);
    CHECK(rmdir(dir) == 0);
    CHECK(rmdir(root) == 0);
}

/* Learns the worker whose card ffi-c/tests/run.sh put into etcd (the card a
 * Dynamo 1.6.1 worker wrote there). */
static void test_discovery_etcd_live(const char *url, uint64_t worker) {
    lg_monitor *m = NULL;
    OK(lg_monitor_new(NULL, &m));
    lg_discovery *d = NULL;
    OK(lg_monitor_discover_dynamo_etcd(m, S("dynamo"), url, strlen(url), NULL, 0, NULL, 0, NULL,
                                       0, NULL, 0, 0, &d));
    bool busy = true;
    OK(lg_monitor_is_busy(m, worker, &busy)); /* registered when the call returns */
    CHECK(!busy);
    lg_discovery_stats st;
    OK(lg_discovery_get_stats(d, &st));
    CHECK(st.workers == 1 && st.scans == 1 && st.scan_errors == 0);
    lg_discovery_free(d);
    EXPECT(lg_monitor_is_busy(m, worker, &busy), LG_NOT_FOUND); /* removed with it */

    lg_discovery *bad = NULL;
    EXPECT(lg_monitor_discover_dynamo_etcd(m, NULL, 0, S("http://127.0.0.1:1"), NULL, 0, NULL, 0,
                                           NULL, 0, NULL, 0, 300, &bad),
           LG_TRANSPORT_ERROR);
    CHECK(last_error_contains("etcd"));
    INVALID(lg_monitor_discover_dynamo_etcd(m, NULL, 0, url, strlen(url), S("root"), NULL, 0,
                                            NULL, 0, NULL, 0, 0, &bad));
    CHECK(last_error_contains("user and password"));
    INVALID(lg_monitor_discover_dynamo_etcd(m, NULL, 0, S(" , "), NULL, 0, NULL, 0, NULL, 0, NULL,
                                            0, 0, &bad));
    INVALID(lg_monitor_discover_dynamo_etcd(NULL, NULL, 0, url, strlen(url), NULL, 0, NULL, 0,
                                            NULL, 0, NULL, 0, 0, &bad));
    CHECK(bad == NULL);
    lg_monitor_free(m);
    printf("c11 api: worker %llu learned from etcd at %s\n", (unsigned long long)worker, url);
}

static void test_scrape(void) {
    struct fake_engine e;
    e.conn_fd = -1;
    e.listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(e.listen_fd >= 0);
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(bind(e.listen_fd, (struct sockaddr *)&addr, sizeof addr) == 0);
    socklen_t addr_len = sizeof addr;
    CHECK(getsockname(e.listen_fd, (struct sockaddr *)&addr, &addr_len) == 0);
    CHECK(listen(e.listen_fd, 4) == 0);
    CHECK(pthread_create(&e.thread, NULL, fake_engine_run, &e) == 0);
    char url[64];
    int url_len = snprintf(url, sizeof url, "http://127.0.0.1:%d/metrics", ntohs(addr.sin_port));

    lg_monitor *m = NULL;
    OK(lg_monitor_new(NULL, &m));
    lg_scrape *s = NULL;
    OK(lg_monitor_scrape(m, NULL, 0, 5, url, (size_t)url_len, LG_ENGINE_VLLM, 10, 0, &s));
    CHECK(s != NULL);
    /* Registered on the first successful scrape (a limit for hangs only). */
    bool busy = true;
    for (int i = 0; i < 6000 && lg_monitor_is_busy(m, 5, &busy) != LG_OK; i++) {
        sleep_ms(5);
    }
    OK(lg_monitor_is_busy(m, 5, &busy));
    CHECK(!busy);
    lg_threshold_update u;
    lg_thresholds t;
    memset(&u, 0, sizeof u);
    u.has_waiting_requests_threshold = true;
    u.waiting_requests_threshold = 8;
    OK(lg_monitor_set_thresholds(m, S("llama"), &u, &t)); /* the model_name label */
    OK(lg_monitor_is_busy(m, 5, &busy));
    CHECK(busy); /* 9 waiting > 8 */
    lg_scrape_stats st;
    memset(&st, 0, sizeof st);
    for (int i = 0; i < 6000; i++) {
        OK(lg_scrape_get_stats(s, &st));
        if (st.scrapes >= 3) {
            break;
        }
        sleep_ms(5);
    }
    CHECK(st.scrapes >= 3 && st.errors == 0 && st.connections == 1 && st.registered);
    /* The scrape's outcomes are in the monitor's metrics. */
    char text[16384];
    size_t needed = 0;
    OK(lg_monitor_metrics(m, text, sizeof text, &needed));
    CHECK(strstr(text, "# TYPE dynamo_frontend_scrapes_total counter") != NULL);
    CHECK(strstr(text, "dynamo_frontend_scrapes_total{worker_id=\"5\",outcome=\"http\"} 0") != NULL);
    CHECK(strstr(text, "dynamo_frontend_scrape_registered{worker_id=\"5\"} 1") != NULL);
    CHECK(strstr(text, "dynamo_frontend_scrape_duration_seconds_count{worker_id=\"5\"}") != NULL);

    lg_scrape *bad = NULL;
    INVALID(lg_monitor_scrape(m, NULL, 0, 6, url, (size_t)url_len, 7, 0, 0, &bad));
    CHECK(last_error_contains("LG_ENGINE_VLLM"));
    INVALID(lg_monitor_scrape(m, NULL, 0, 6, S("https://x/metrics"), LG_ENGINE_SGLANG, 0, 0, &bad));
    CHECK(last_error_contains("scheme"));
    INVALID(lg_monitor_scrape(NULL, NULL, 0, 6, url, (size_t)url_len, LG_ENGINE_VLLM, 0, 0, &bad));
    INVALID(lg_monitor_scrape(m, NULL, 0, 6, url, (size_t)url_len, LG_ENGINE_VLLM, 0, 0, NULL));
    INVALID(lg_monitor_scrape(m, NULL, 3, 6, url, (size_t)url_len, LG_ENGINE_VLLM, 0, 0, &bad));
    CHECK(bad == NULL);
    INVALID(lg_scrape_get_stats(NULL, &st));
    INVALID(lg_scrape_get_stats(s, NULL));

    lg_scrape_free(s);
    EXPECT(lg_monitor_is_busy(m, 5, &busy), LG_NOT_FOUND); /* removed with its scrape */
    lg_scrape_free(NULL);
    lg_monitor_free(m);
    shutdown(e.listen_fd, SHUT_RDWR);
    close(e.listen_fd);
    pthread_join(e.thread, NULL);
}

/* ----- /busy_threshold with a bearer token -------------------------------- */

/* One request through lg_monitor_handle_busy_threshold_auth() with a JSON
 * content type; *challenge receives the WWW-Authenticate value or NULL
 * (challenge NULL: no headers asked for). */
static uint16_t auth_call(const lg_monitor *m, const lg_control_auth *auth, const char *method,
                          const char *authorization, const char *body, const char **challenge,
                          char *resp, size_t resp_len) {
    uint16_t status = 0;
    size_t needed = 0;
    lg_http_headers headers;
    OK(lg_monitor_handle_busy_threshold_auth(
        m, auth, method, strlen(method), S("application/json"), authorization,
        authorization ? strlen(authorization) : 0, (const uint8_t *)body, strlen(body), &status,
        challenge ? &headers : NULL, resp, resp_len, &needed));
    if (challenge) {
        *challenge = headers.www_authenticate;
        CHECK(headers.content_type != NULL && strcmp(headers.content_type, "application/json") == 0);
    }
    return status;
}

/* The headers of 1.6.1's answers: plain text for what is not JSON, an empty
 * 405 with its Allow. */
static void test_busy_threshold_headers(void) {
    lg_monitor *m = NULL;
    OK(lg_monitor_new(NULL, &m));
    OK(lg_monitor_add_worker(m, S("llama"), 1, NULL));
    char resp[512];
    uint16_t status = 0;
    size_t needed = 0;
    lg_http_headers h;
    OK(lg_monitor_handle_busy_threshold_auth(m, NULL, S("POST"), S("text/plain"), NULL, 0,
                                             (const uint8_t *)"{}", 2, &status, &h, resp,
                                             sizeof resp, &needed));
    CHECK(status == 415 && strcmp(h.content_type, "text/plain; charset=utf-8") == 0);
    CHECK(strcmp(resp, "Expected request with `Content-Type: application/json`") == 0);
    CHECK(h.allow == NULL && h.www_authenticate == NULL);
    OK(lg_monitor_handle_busy_threshold_auth(m, NULL, S("PUT"), NULL, 0, NULL, 0, NULL, 0,
                                             &status, &h, resp, sizeof resp, &needed));
    CHECK(status == 405 && h.content_type == NULL && strcmp(h.allow, "POST,GET,HEAD") == 0);
    CHECK(resp[0] == '\0' && needed == 0);
    const char *ghost = "{\"model\":\"ghost\",\"active_decode_blocks_threshold\":0.5}";
    OK(lg_monitor_handle_busy_threshold_auth(m, NULL, S("POST"), S("application/json"), NULL, 0,
                                             (const uint8_t *)ghost, strlen(ghost), &status, &h,
                                             resp, sizeof resp, &needed));
    CHECK(status == 404 && strcmp(h.content_type, "application/json") == 0);
    CHECK(strcmp(resp, "{\"error\":\"Model 'ghost' not found. Thresholds can only be set for "
                       "discovered models.\"}") == 0);
    lg_monitor_free(m);
}

static void test_busy_threshold_auth(void) {
    lg_monitor *m = NULL;
    OK(lg_monitor_new(NULL, &m));
    OK(lg_monitor_add_worker(m, S("llama"), 1, NULL));
    lg_control_auth *auth = NULL;
    OK(lg_control_auth_new(S("s3cret"), false, &auth));
    CHECK(auth != NULL);

    char resp[512];
    const char *challenge = "unset";
    const char *set = "{\"model\":\"llama\",\"active_decode_blocks_threshold\":0.5}";
    const char *read = "{\"model\":\"llama\"}";
    lg_thresholds t;

    /* A write without the right token: 401, the challenge, nothing changed. */
    const char *refused[][2] = {
        {NULL, "missing bearer token"},
        {"Basic czNjcmV0", "missing bearer token"},
        {"Bearer", "missing bearer token"},
        {"Bearer wrong", "invalid bearer token"},
        {"Bearer S3CRET", "invalid bearer token"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        challenge = "unset";
        CHECK(auth_call(m, auth, "POST", refused[i][0], set, &challenge, resp, sizeof resp) == 401);
        CHECK(challenge != NULL && strcmp(challenge, "Bearer") == 0);
        CHECK(contains(resp, "\"error\"") && contains(resp, refused[i][1]));
    }
    OK(lg_monitor_get_thresholds(m, S("llama"), &t));
    CHECK(t.version == 0 && !t.has_active_decode_blocks_threshold);

    /* Reads stay open; a 200 carries no challenge. */
    CHECK(auth_call(m, auth, "GET", NULL, "", &challenge, resp, sizeof resp) == 200);
    CHECK(challenge == NULL && contains(resp, "\"thresholds\""));
    CHECK(auth_call(m, auth, "POST", NULL, read, &challenge, resp, sizeof resp) == 200);

    /* The right token, scheme in any case: applied. */
    CHECK(auth_call(m, auth, "POST", "bearer s3cret", set, &challenge, resp, sizeof resp) == 200);
    CHECK(challenge == NULL && contains(resp, "\"version\":1"));
    OK(lg_monitor_get_thresholds(m, S("llama"), &t));
    CHECK(t.version == 1 && t.has_active_decode_blocks_threshold &&
          t.active_decode_blocks_threshold == 0.5);
    /* out_www_authenticate is optional. */
    CHECK(auth_call(m, auth, "POST", NULL, set, NULL, resp, sizeof resp) == 401);
    /* NULL auth: no authentication, as lg_monitor_handle_busy_threshold(). */
    CHECK(auth_call(m, NULL, "POST", NULL, set, &challenge, resp, sizeof resp) == 200);
    CHECK(challenge == NULL && contains(resp, "\"version\":2"));
    lg_control_auth_free(auth);

    /* protect_reads: every request needs the token. */
    OK(lg_control_auth_new(S("s3cret"), true, &auth));
    CHECK(auth_call(m, auth, "GET", NULL, "", &challenge, resp, sizeof resp) == 401);
    CHECK(challenge != NULL && contains(resp, "missing bearer token"));
    CHECK(auth_call(m, auth, "POST", "Bearer nope", read, &challenge, resp, sizeof resp) == 401);
    CHECK(contains(resp, "invalid bearer token"));
    CHECK(auth_call(m, auth, "GET", "Bearer s3cret", "", &challenge, resp, sizeof resp) == 200);

    /* The 401 answer fits any buffer rule: too small still reports it. */
    char tiny[4];
    uint16_t status = 0;
    size_t needed = 0;
    challenge = NULL;
    lg_http_headers h;
    EXPECT(lg_monitor_handle_busy_threshold_auth(m, auth, S("GET"), NULL, 0, NULL, 0, NULL, 0,
                                                 &status, &h, tiny, sizeof tiny, &needed),
           LG_BUFFER_TOO_SMALL);
    CHECK(status == 401 && h.www_authenticate != NULL && needed > sizeof tiny);

    /* Bad arguments. */
    INVALID(lg_monitor_handle_busy_threshold_auth(NULL, auth, S("GET"), NULL, 0, NULL, 0, NULL, 0,
                                                  &status, &h, resp, sizeof resp,
                                                  &needed));
    INVALID(lg_monitor_handle_busy_threshold_auth(m, auth, S("GET"), NULL, 0, NULL, 3, NULL, 0,
                                                  &status, &h, resp, sizeof resp,
                                                  &needed));
    INVALID(lg_monitor_handle_busy_threshold_auth(m, auth, S("GET"), NULL, 0, "\xc3\x28", 2,
                                                  NULL, 0, &status, &h, resp,
                                                  sizeof resp, &needed));
    INVALID(lg_monitor_handle_busy_threshold_auth(m, auth, S("GET"), NULL, 0, NULL, 0, NULL, 0,
                                                  NULL, &h, resp, sizeof resp,
                                                  &needed));
    lg_control_auth_free(auth);

    lg_control_auth *bad = NULL;
    INVALID(lg_control_auth_new("", 0, false, &bad));
    CHECK(last_error_contains("must not be empty"));
    INVALID(lg_control_auth_new(NULL, 0, false, &bad));
    INVALID(lg_control_auth_new(S("two words"), false, &bad));
    CHECK(last_error_contains("visible ASCII"));
    INVALID(lg_control_auth_new(NULL, 5, false, &bad));
    INVALID(lg_control_auth_new(S("s3cret"), false, NULL));
    CHECK(bad == NULL); /* written only on success */
    lg_control_auth_free(NULL);
    lg_monitor_free(m);
}

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

static void test_gate_config(void) {
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

static void test_gate(void) {
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
static void test_gate_wait_limit(void) {
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

static void test_gate_deadline(void) {
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
static void test_gate_classes(void) {
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

/* ----- load reports across machines (NATS) -------------------------------- */

/* Nothing listens on port 1 of the loopback interface. */
#define UNREACHABLE "nats://127.0.0.1:1"

static void test_cluster_errors(void) {
    lg_monitor *m = NULL;
    OK(lg_monitor_new(NULL, &m));
    lg_reporter *rep = (lg_reporter *)(uintptr_t)0x1;
    lg_subscription *sub = (lg_subscription *)(uintptr_t)0x1;

    /* Arguments are checked before any connection is tried. */
    INVALID(lg_reporter_new(S(UNREACHABLE), S("ns"), 1, S("m"), NULL, NULL));
    CHECK(last_error_contains("out_reporter must not be NULL"));
    INVALID(lg_reporter_new(NULL, 3, S("ns"), 1, S("m"), NULL, &rep));
    INVALID(lg_reporter_new(S(UNREACHABLE), NULL, 2, 1, S("m"), NULL, &rep));
    INVALID(lg_reporter_new(S(UNREACHABLE), S("ns"), 1, NULL, 1, NULL, &rep));
    INVALID(lg_reporter_new(S(UNREACHABLE), S("ns"), 1, "", 0, NULL, &rep));
    CHECK(last_error_contains("model must not be empty"));
    INVALID(lg_reporter_new(S(UNREACHABLE), S("a.b"), 1, S("m"), NULL, &rep));
    CHECK(last_error_contains("nats_namespace"));
    INVALID(lg_reporter_new(S(UNREACHABLE), "", 0, 1, S("m"), NULL, &rep));
    INVALID(lg_reporter_new(S(UNREACHABLE), S("a b"), 1, S("m"), NULL, &rep));
    INVALID(lg_reporter_new(S(UNREACHABLE), S("*"), 1, S("m"), NULL, &rep));
    INVALID(lg_reporter_new(S(UNREACHABLE), "\xff", 1, 1, S("m"), NULL, &rep));
    lg_worker_spec overflow;
    memset(&overflow, 0, sizeof overflow);
    overflow.dp_start = UINT32_MAX;
    overflow.dp_size = 2;
    INVALID(lg_reporter_new(S(UNREACHABLE), S("ns"), 1, S("m"), &overflow, &rep));
    CHECK(last_error_contains("overflows"));
    CHECK(rep == (lg_reporter *)(uintptr_t)0x1); /* untouched on failure */

    INVALID(lg_monitor_subscribe_nats(NULL, S(UNREACHABLE), S("ns"), &sub));
    INVALID(lg_monitor_subscribe_nats(m, S(UNREACHABLE), S("ns"), NULL));
    INVALID(lg_monitor_subscribe_nats(m, NULL, 1, S("ns"), &sub));
    INVALID(lg_monitor_subscribe_nats(m, S(UNREACHABLE), S("a.b"), &sub));
    CHECK(last_error_contains("nats_namespace"));
    INVALID(lg_monitor_subscribe_nats(m, S(UNREACHABLE), S(">"), &sub));
    CHECK(sub == (lg_subscription *)(uintptr_t)0x1);

    /* An unreachable server is a transport error, with the reason. */
    EXPECT(lg_reporter_new(S(UNREACHABLE), S("ns"), 1, S("m"), NULL, &rep), LG_TRANSPORT_ERROR);
    CHECK(last_error_contains("cannot connect to NATS"));
    EXPECT(lg_monitor_subscribe_nats(m, S(UNREACHABLE), S("ns"), &sub), LG_TRANSPORT_ERROR);
    CHECK(last_error_contains("cannot connect to NATS"));
    /* A malformed URL is a bad argument, found without connecting. */
    INVALID(lg_monitor_subscribe_nats(m, S("not a url at all"), S("ns"), &sub));
    CHECK(last_error_contains("is not a NATS server URL"));
    INVALID(lg_reporter_new(S("nats://"), S("ns"), 1, S("m"), NULL, &rep));
    CHECK(last_error_contains("no host"));
    CHECK(rep == (lg_reporter *)(uintptr_t)0x1 && sub == (lg_subscription *)(uintptr_t)0x1);

    /* NULL handles. */
    lg_load_report r = kv_report(1, 100);
    INVALID(lg_reporter_report(NULL, 0, &r));
    CHECK(last_error_contains("reporter must not be NULL"));
    lg_reporter_stats rs;
    INVALID(lg_reporter_get_stats(NULL, &rs));
    lg_subscription_stats ss;
    INVALID(lg_subscription_get_stats(NULL, &ss));
    CHECK(last_error_contains("subscription must not be NULL"));
    lg_reporter_free(NULL);
    lg_subscription_free(NULL);
    lg_monitor_free(m);
}

/* lg_nats_options: the connecting calls check the settings before they
 * connect, with a message naming the setting. */
static void test_nats_options_errors(void) {
    lg_monitor *m = NULL;
    OK(lg_monitor_new(NULL, &m));
    lg_reporter *rep = (lg_reporter *)(uintptr_t)0x1;
    lg_subscription *sub = (lg_subscription *)(uintptr_t)0x1;
    lg_nats_options *o = NULL;
    INVALID(lg_nats_options_new(NULL));
    CHECK(last_error_contains("out_options must not be NULL"));
    OK(lg_nats_options_new(&o));
    CHECK(o != NULL);

    /* The reference's endpoint: both names or neither; a reporter cannot
     * publish on a wildcard. */
    INVALID(lg_nats_options_set_dynamo_endpoint(NULL, S("c"), S("e")));
    INVALID(lg_nats_options_set_dynamo_endpoint(o, S("c"), NULL, 0));
    CHECK(last_error_contains("together"));
    OK(lg_nats_options_set_dynamo_endpoint(o, S("*"), S("generate")));
    INVALID(lg_reporter_new_with(S(UNREACHABLE), S("ns"), 1, S("m"), NULL, o, &rep));
    CHECK(last_error_contains("wildcard"));
    OK(lg_nats_options_set_dynamo_endpoint(o, NULL, 0, NULL, 0));

    /* NULL handles and bad strings. */
    INVALID(lg_nats_options_set_user_password(NULL, S("u"), S("p")));
    CHECK(last_error_contains("options must not be NULL"));
    INVALID(lg_nats_options_set_token(NULL, S("t")));
    INVALID(lg_nats_options_set_credentials_file(NULL, S("x.creds")));
    INVALID(lg_nats_options_set_tls_ca(NULL, S("ca.pem")));
    INVALID(lg_nats_options_set_client_cert(NULL, S("c.pem"), S("k.pem")));
    INVALID(lg_nats_options_set_connect_timeout_ms(NULL, 100));
    INVALID(lg_nats_options_set_token(o, NULL, 3));
    CHECK(last_error_contains("token"));
    INVALID(lg_nats_options_set_user_password(o, "\xff", 1, S("p")));
    CHECK(last_error_contains("user is not valid UTF-8"));

    /* A connect timeout of its own, against a server that accepts and never
     * answers; then the default again (0). */
    int silent = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(silent >= 0);
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(bind(silent, (struct sockaddr *)&addr, sizeof addr) == 0);
    socklen_t addr_len = sizeof addr;
    CHECK(getsockname(silent, (struct sockaddr *)&addr, &addr_len) == 0);
    CHECK(listen(silent, 4) == 0);
    char silent_url[64];
    int silent_len = snprintf(silent_url, sizeof silent_url, "nats://127.0.0.1:%d",
                              ntohs(addr.sin_port));
    OK(lg_nats_options_set_connect_timeout_ms(o, 250));
    EXPECT(lg_reporter_new_with(silent_url, (size_t)silent_len, S("ns"), 1, S("m"), NULL, o, &rep),
           LG_TRANSPORT_ERROR);
    CHECK(last_error_contains("no answer within 250ms"));
    close(silent);
    OK(lg_nats_options_set_connect_timeout_ms(o, 0));

    /* The defaults, and NULL options, connect as the plain calls do. */
    EXPECT(lg_reporter_new_with(S(UNREACHABLE), S("ns"), 1, S("m"), NULL, o, &rep),
           LG_TRANSPORT_ERROR);
    CHECK(last_error_contains("cannot connect to NATS"));
    EXPECT(lg_monitor_subscribe_nats_with(m, S(UNREACHABLE), S("ns"), NULL, &sub),
           LG_TRANSPORT_ERROR);
    INVALID(lg_reporter_new_with(S(UNREACHABLE), S("a.b"), 1, S("m"), NULL, o, &rep));
    CHECK(last_error_contains("nats_namespace"));
    INVALID(lg_monitor_subscribe_nats_with(m, S(UNREACHABLE), S("ns"), o, NULL));

    /* A password without a user. */
    OK(lg_nats_options_set_user_password(o, NULL, 0, S("p")));
    INVALID(lg_reporter_new_with(S(UNREACHABLE), S("ns"), 1, S("m"), NULL, o, &rep));
    CHECK(last_error_contains("password is set without user"));
    /* A user and password together with a token. */
    OK(lg_nats_options_set_user_password(o, S("u"), S("p")));
    OK(lg_nats_options_set_token(o, S("t")));
    INVALID(lg_monitor_subscribe_nats_with(m, S(UNREACHABLE), S("ns"), o, &sub));
    CHECK(last_error_contains("user/password and token"));
    /* Cleared, the token alone passes the checks and fails at connecting. */
    OK(lg_nats_options_set_user_password(o, NULL, 0, NULL, 0));
    EXPECT(lg_monitor_subscribe_nats_with(m, S(UNREACHABLE), S("ns"), o, &sub),
           LG_TRANSPORT_ERROR);
    OK(lg_nats_options_set_token(o, NULL, 0));

    /* Files that cannot be read, and incomplete pairs. */
    OK(lg_nats_options_set_credentials_file(o, S("/nonexistent/loadgate.creds")));
    INVALID(lg_reporter_new_with(S(UNREACHABLE), S("ns"), 1, S("m"), NULL, o, &rep));
    CHECK(last_error_contains("credentials file") && last_error_contains("cannot be read"));
    OK(lg_nats_options_set_credentials_file(o, NULL, 0));
    OK(lg_nats_options_set_tls_ca(o, S("/nonexistent/ca.pem")));
    INVALID(lg_monitor_subscribe_nats_with(m, S(UNREACHABLE), S("ns"), o, &sub));
    CHECK(last_error_contains("tls_ca file"));
    OK(lg_nats_options_set_tls_ca(o, NULL, 0));
    OK(lg_nats_options_set_client_cert(o, S("/nonexistent/c.pem"), NULL, 0));
    INVALID(lg_reporter_new_with(S(UNREACHABLE), S("ns"), 1, S("m"), NULL, o, &rep));
    CHECK(last_error_contains("tls_cert is set without tls_key"));
    CHECK(rep == (lg_reporter *)(uintptr_t)0x1 && sub == (lg_subscription *)(uintptr_t)0x1);

    lg_nats_options_free(o);
    lg_nats_options_free(NULL);
    lg_monitor_free(m);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* How long a wait for another thread or process may take before the check
 * fails: far above what a loaded machine (or valgrind) needs, so it bounds a
 * hang, not a speed. */
#define WAIT_MS 30000.0

/* Polls lg_monitor_select on `model` every 5 ms for at most WAIT_MS until it
 * answers `want` (and, for LG_OK, the worker `want_id`); returns whether it
 * did. */
static int await_select(const lg_monitor *m, const char *model, lg_status want,
                        uint64_t want_id) {
    double deadline = now_ms() + WAIT_MS;
    do {
        uint64_t id = 0;
        lg_status got = lg_monitor_select(m, model, strlen(model), LG_POLICY_ROUND_ROBIN, &id);
        if (got == want && (want != LG_OK || id == want_id)) {
            return 1;
        }
        sleep_ms(5);
    } while (now_ms() < deadline);
    return 0;
}

/* Polls lg_monitor_is_busy until it answers `want`, for at most WAIT_MS. */
static int await_busy(const lg_monitor *m, uint64_t worker_id, bool want) {
    double deadline = now_ms() + WAIT_MS;
    do {
        bool busy = !want;
        if (lg_monitor_is_busy(m, worker_id, &busy) == LG_OK && busy == want) {
            return 1;
        }
        sleep_ms(5);
    } while (now_ms() < deadline);
    return 0;
}

/* Two workers (two ranks each) report over a real nats-server; two
 * frontends subscribed to the namespace see them, agree on the busy set,
 * and route or refuse accordingly. */
static void test_cluster_live(const char *url) {
    double t0 = now_ms();
    const size_t url_len = strlen(url);
    lg_monitor *front = NULL, *other = NULL;
    OK(lg_monitor_new(NULL, &front));
    OK(lg_monitor_new(NULL, &other));
    lg_subscription *sub = NULL, *sub2 = NULL;
    OK(lg_monitor_subscribe_nats(front, url, url_len, S("capi"), &sub));
    CHECK(sub != NULL);
    OK(lg_monitor_subscribe_nats(other, url, url_len, S("capi"), &sub2));
    /* Another namespace sees nothing of this one. */
    lg_monitor *elsewhere = NULL;
    lg_subscription *sub3 = NULL;
    OK(lg_monitor_new(NULL, &elsewhere));
    OK(lg_monitor_subscribe_nats(elsewhere, url, url_len, S("capi-other"), &sub3));

    lg_worker_spec spec;
    memset(&spec, 0, sizeof spec);
    spec.dp_start = 0;
    spec.dp_size = 2;
    spec.has_kv_total_blocks = true;
    spec.kv_total_blocks = 100;
    lg_reporter *w1 = NULL, *w2 = NULL;
    OK(lg_reporter_new(url, url_len, S("capi"), 41, S("llama"), &spec, &w1));
    CHECK(w1 != NULL);
    OK(lg_reporter_new(url, url_len, S("capi"), 42, S("llama"), &spec, &w2));

    /* Both workers are announced by their first heartbeat. */
    lg_load_report calm = kv_report(10, 100);
    lg_load_report full = kv_report(95, 100);
    for (uint32_t rank = 0; rank < 2; rank++) {
        OK(lg_reporter_report(w1, rank, &calm));
        OK(lg_reporter_report(w2, rank, &calm));
    }
    EXPECT(lg_reporter_report(w1, 2, &calm), LG_NOT_FOUND);
    CHECK(last_error_contains("dp_rank 2"));
    INVALID(lg_reporter_report(w1, 0, NULL));
    CHECK(await_select(front, "llama", LG_OK, 41));
    CHECK(await_busy(front, 41, false) && await_busy(front, 42, false));
    CHECK(await_busy(other, 41, false) && await_busy(other, 42, false));

    /* Thresholds are per frontend: only `front` gets a decode threshold. */
    lg_threshold_update u;
    memset(&u, 0, sizeof u);
    u.has_active_decode_blocks_threshold = true;
    u.active_decode_blocks_threshold = 0.9;
    OK(lg_monitor_set_thresholds(front, S("llama"), &u, NULL));

    /* Worker 41 fills up on both ranks: busy on `front`, so select picks 42. */
    OK(lg_reporter_report(w1, 0, &full));
    OK(lg_reporter_report(w1, 1, &full));
    CHECK(await_busy(front, 41, true));
    for (int i = 0; i < 4; i++) {
        uint64_t id = 0;
        OK(lg_monitor_select(front, S("llama"), LG_POLICY_ROUND_ROBIN, &id));
        CHECK(id == 42);
    }
    bool busy = true;
    OK(lg_monitor_is_busy(other, 41, &busy));
    CHECK(!busy); /* no threshold there */

    /* Both full: every select on `front` is refused. */
    OK(lg_reporter_report(w2, 0, &full));
    OK(lg_reporter_report(w2, 1, &full));
    CHECK(await_busy(front, 42, true));
    CHECK(await_select(front, "llama", LG_OVERLOADED, 0));

    /* Load drops again: 41 is routable. */
    OK(lg_reporter_report(w1, 1, &calm));
    CHECK(await_busy(front, 41, false));
    CHECK(await_select(front, "llama", LG_OK, 41));

    lg_reporter_stats rs;
    OK(lg_reporter_get_stats(w1, &rs));
    CHECK(rs.messages_sent >= 2 && rs.messages_failed == 0);
    INVALID(lg_reporter_get_stats(w1, NULL));
    lg_subscription_stats ss;
    OK(lg_subscription_get_stats(sub, &ss));
    CHECK(ss.announced == 2 && ss.applied >= 4);
    CHECK(ss.malformed == 0 && ss.refused == 0 && ss.expired == 0);
    INVALID(lg_subscription_get_stats(sub, NULL));
    size_t sub_needed = 0;
    EXPECT(lg_subscription_metrics(sub, NULL, 0, &sub_needed), LG_BUFFER_TOO_SMALL);
    CHECK(sub_needed > 0);
    char sub_text[8192];
    OK(lg_subscription_metrics(sub, sub_text, sizeof sub_text, &sub_needed));
    CHECK(strstr(sub_text, "dynamo_frontend_load_messages_total{outcome=\"announced\"} 2") != NULL);
    CHECK(strstr(sub_text, "dynamo_frontend_load_messages_refused_total{reason=\"spoofed\"} 0") !=
          NULL);
    INVALID(lg_subscription_metrics(NULL, sub_text, sizeof sub_text, &sub_needed));
    INVALID(lg_subscription_metrics(sub, sub_text, sizeof sub_text, NULL));

    lg_subscription_stats none;
    OK(lg_subscription_get_stats(sub3, &none));
    CHECK(none.announced == 0 && none.applied == 0);
    EXPECT(lg_monitor_select(elsewhere, S("llama"), LG_POLICY_ROUND_ROBIN, &(uint64_t){0}),
           LG_UNAVAILABLE);

    /* The monitor may go first: the subscription keeps its state alive. */
    lg_monitor_free(other);
    OK(lg_reporter_report(w2, 0, &calm));
    sleep_ms(20); /* a chance for the report to reach sub2; nothing checks that it did */
    lg_subscription_free(sub2);

    lg_reporter_free(w1);
    lg_reporter_free(w2);
    lg_subscription_free(sub);
    lg_subscription_free(sub3);
    lg_monitor_free(front);
    lg_monitor_free(elsewhere);
    printf("c11 api: NATS round trip against %s took %.0f ms\n", url, now_ms() - t0);
}

/* The reference's event plane: a reporter speaking its envelope on a
 * component/endpoint subject, read by a subscription that follows every
 * endpoint of the namespace; its workers are declared by hand. */
static void test_cluster_dynamo_live(const char *url) {
    const size_t url_len = strlen(url);
    lg_monitor *front = NULL;
    OK(lg_monitor_new(NULL, &front));
    lg_worker_spec spec;
    memset(&spec, 0, sizeof spec);
    spec.dp_size = 1;
    spec.has_kv_total_blocks = true;
    spec.kv_total_blocks = 100;
    OK(lg_monitor_add_worker(front, S("m"), 77, &spec));
    lg_threshold_update u;
    memset(&u, 0, sizeof u);
    u.has_active_decode_blocks_threshold = true;
    u.active_decode_blocks_threshold = 0.5;
    OK(lg_monitor_set_thresholds(front, S("m"), &u, NULL));

    lg_nats_options *follow = NULL, *speak = NULL;
    OK(lg_nats_options_new(&follow));
    OK(lg_nats_options_set_dynamo_endpoint(follow, S("*"), S("*")));
    OK(lg_nats_options_new(&speak));
    OK(lg_nats_options_set_dynamo_endpoint(speak, S("vllm worker"), S("generate")));
    lg_subscription *sub = NULL;
    OK(lg_monitor_subscribe_nats_with(front, url, url_len, S("capi-dyn"), follow, &sub));
    lg_reporter *w = NULL, *stranger = NULL;
    OK(lg_reporter_new_with(url, url_len, S("capi-dyn"), 77, S("m"), &spec, speak, &w));
    OK(lg_reporter_new_with(url, url_len, S("capi-dyn"), 78, S("m"), &spec, speak, &stranger));
    lg_nats_options_free(follow);
    lg_nats_options_free(speak);

    lg_load_report full = kv_report(90, 100);
    OK(lg_reporter_report(w, 0, &full));
    OK(lg_reporter_report(stranger, 0, &full));
    CHECK(await_busy(front, 77, true));
    /* Worker 78 was never declared: refused and counted, never added. */
    char text[8192];
    size_t needed = 0;
    bool counted = false;
    for (int i = 0; i < 3000 && !counted; i++) {
        OK(lg_subscription_metrics(sub, text, sizeof text, &needed));
        counted = strstr(text, "refused_total{reason=\"unknown_worker\"} 0") == NULL;
        if (!counted) sleep_ms(10);
    }
    CHECK(counted);
    bool busy = false;
    EXPECT(lg_monitor_is_busy(front, 78, &busy), LG_NOT_FOUND);

    lg_reporter_free(w);
    lg_reporter_free(stranger);
    lg_subscription_free(sub);
    lg_monitor_free(front);
    printf("c11 api: the reference's envelope crossed %s both ways\n", url);
}

/* A nats-server that wants user "loadgate" with password "s3cret"
 * (ffi-c/tests/run.sh starts it): refused credentials are a transport
 * error saying so; the right ones carry a report to a frontend. */
static void test_cluster_auth_live(const char *url) {
    const size_t url_len = strlen(url);
    lg_monitor *front = NULL;
    OK(lg_monitor_new(NULL, &front));
    lg_nats_options *o = NULL;
    OK(lg_nats_options_new(&o));
    /* Generous: a loaded machine must not turn a refusal into a timeout. */
    OK(lg_nats_options_set_connect_timeout_ms(o, 30000));
    lg_subscription *sub = (lg_subscription *)(uintptr_t)0x1;
    lg_reporter *w = (lg_reporter *)(uintptr_t)0x1;

    EXPECT(lg_monitor_subscribe_nats(front, url, url_len, S("capi-auth"), &sub),
           LG_TRANSPORT_ERROR);
    CHECK(last_error_contains("authorization failed"));
    OK(lg_nats_options_set_user_password(o, S("loadgate"), S("wrong")));
    EXPECT(lg_reporter_new_with(url, url_len, S("capi-auth"), 5, S("llama"), NULL, o, &w),
           LG_TRANSPORT_ERROR);
    CHECK(last_error_contains("authorization failed") &&
          last_error_contains("user and password"));
    CHECK(sub == (lg_subscription *)(uintptr_t)0x1 && w == (lg_reporter *)(uintptr_t)0x1);

    OK(lg_nats_options_set_user_password(o, S("loadgate"), S("s3cret")));
    OK(lg_monitor_subscribe_nats_with(front, url, url_len, S("capi-auth"), o, &sub));
    OK(lg_reporter_new_with(url, url_len, S("capi-auth"), 5, S("llama"), NULL, o, &w));
    lg_nats_options_free(o); /* the handles keep their own copy */
    lg_load_report r = kv_report(10, 100);
    OK(lg_reporter_report(w, 0, &r));
    CHECK(await_select(front, "llama", LG_OK, 5));

    lg_reporter_free(w);
    lg_subscription_free(sub);
    lg_monitor_free(front);
    printf("c11 api: NATS user/password checked against %s\n", url);
}

int main(void) {
    /* Read once per process, at the first call that needs it. */
    setenv("DYN_HTTP_OVERLOAD_STATUS_CODE", " 429 ", 1);

    test_version_and_status();
    test_error_response();
    test_monitor_config();
    test_monitor();
    test_monitor_waiting_requests();
    test_scrape();
    test_discovery();
    test_busy_threshold_auth();
    test_busy_threshold_headers();
    test_gate_config();
    test_gate();
    test_gate_wait_limit();
    test_gate_deadline();
    test_gate_classes();
    test_cluster_errors();
    test_nats_options_errors();
    const char *nats_url = getenv("LG_NATS_URL");
    if (nats_url != NULL && nats_url[0] != '\0') {
        test_cluster_live(nats_url);
        test_cluster_dynamo_live(nats_url);
    } else {
        printf("c11 api: LG_NATS_URL is not set; the NATS round trip is skipped\n");
    }
    const char *etcd_url = getenv("LG_ETCD_URL");
    const char *etcd_worker = getenv("LG_ETCD_WORKER");
    if (etcd_url != NULL && etcd_url[0] != '\0' && etcd_worker != NULL) {
        test_discovery_etcd_live(etcd_url, strtoull(etcd_worker, NULL, 10));
    } else {
        printf("c11 api: LG_ETCD_URL is not set; the etcd discovery is skipped\n");
    }
    const char *auth_url = getenv("LG_NATS_AUTH_URL");
    if (auth_url != NULL && auth_url[0] != '\0') {
        test_cluster_auth_live(auth_url);
    } else {
        printf("c11 api: LG_NATS_AUTH_URL is not set; the NATS authentication is skipped\n");
    }

    printf("c11 api: %d checks passed\n", checks);
    return 0;
}
