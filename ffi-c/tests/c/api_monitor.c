/*
 * The C11 API test (see api.c): the frontend monitor: its settings and
 * bounds, workers, thresholds and the busy rule, reports, routing, leases,
 * bookings, staleness, metrics, the /busy_threshold handler, removal, and
 * the waiting-requests threshold.
 */
#define _POSIX_C_SOURCE 200809L

#include "check.h"

#include <math.h>

/* ----- monitor ----------------------------------------------------------- */

void test_monitor_config(void) {
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

void test_monitor(void) {
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
    /* Setting the policy sweeps once, which notes the last report; then the
     * monitor's maintenance sweeps by itself: silent for longer than
     * stale_after (1 ms), the worker counts as busy with no call from us. */
    OK(lg_monitor_set_staleness(m, S("other"), LG_STALENESS_BUSY, 1));
    CHECK(await_busy(m, 900, true));
    OK(lg_monitor_set_staleness(m, S("other"), LG_STALENESS_KEEP, 3000));
    OK(lg_monitor_is_busy(m, 900, &busy));
    CHECK(!busy);
    /* A sweep on demand: nothing is stale under keep. */
    size_t changed = 99;
    OK(lg_monitor_sweep(m, &changed));
    CHECK(changed == 0);
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

void test_monitor_waiting_requests(void) {
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
