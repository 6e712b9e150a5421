/*
 * The C11 API test (see api.c): SLO admission on the frontend monitor: the
 * SLO set and refused, a booking's stream fitted, predictions, the answer's
 * reservation, advisory counts, and the engine's own seats bounding a
 * rank's.
 */
#define _POSIX_C_SOURCE 200809L

#include "check.h"

/* ----- SLO admission ----------------------------------------------------- */

/* The SLO: set (advisory), refused with the field named, cleared; a
 * booking's stream observed (first token, then token gaps) and fitted by the
 * maintenance thread; predictions for known and unknown ranks; the answer's
 * reservation, bounded and settled; answers learned by lg_booking_finish();
 * what the advisory verdicts would have decided. */
void test_monitor_slo(void) {
    lg_monitor *m = NULL;
    OK(lg_monitor_new(NULL, &m));
    lg_worker_spec spec = one_rank(1000);
    OK(lg_monitor_add_worker(m, S("llama"), 3, &spec));

    lg_slo bad = {0.0, 0.1, false};
    INVALID(lg_monitor_set_slo(m, S("llama"), &bad));
    CHECK(last_error_contains("ttft"));
    bad.ttft_seconds = 2.0;
    bad.tpot_seconds = 1e9;
    INVALID(lg_monitor_set_slo(m, S("llama"), &bad));
    CHECK(last_error_contains("tpot"));
    lg_slo slo = {2.0, 0.1, true};
    EXPECT(lg_monitor_set_slo(m, S("nope"), &slo), LG_NOT_FOUND);
    INVALID(lg_monitor_set_slo(NULL, S("llama"), &slo));
    OK(lg_monitor_set_slo(m, S("llama"), &slo));

    INVALID(lg_booking_first_token(NULL));
    INVALID(lg_booking_tokens(NULL, 1));
    INVALID(lg_booking_expect_output(NULL, 10));
    uint64_t reserved = 99;
    INVALID(lg_booking_reserved_blocks(NULL, &reserved));
    lg_booking_finish(NULL, 5); /* a no-op */
    lg_prediction p;
    EXPECT(lg_monitor_predict(m, 4, 0, 10, &p), LG_NOT_FOUND);
    INVALID(lg_monitor_predict(m, 3, 0, 10, NULL));
    OK(lg_monitor_predict(m, 3, 0, 10, &p));
    CHECK(!p.trusted && p.fit_error == 1.0);

    lg_booking *b = NULL;
    OK(lg_monitor_book_prefill(m, 3, 0, 10, 100, &b));
    OK(lg_booking_tokens(b, 1)); /* before the first token: nothing */
    sleep_ms(2);
    OK(lg_booking_first_token(b));
    for (int i = 0; i < 40; i++) {
        sleep_ms(2);
        OK(lg_booking_tokens(b, 1));
    }
    /* The maintenance thread fits every 20 ms. */
    bool fitted = false;
    for (int i = 0; i < 3000 && !fitted; i++) {
        OK(lg_monitor_predict(m, 3, 0, 10, &p));
        fitted = p.fit_error < 1.0;
        if (!fitted) sleep_ms(10);
    }
    CHECK(fitted);
    CHECK(p.ttft_seconds >= 0.0 && p.tpot_seconds >= 0.0);
    /* 41 tokens so far; up to 100: 7 blocks of 16 reserved, on top of 10. */
    OK(lg_booking_expect_output(b, 100));
    INVALID(lg_booking_reserved_blocks(b, NULL));
    OK(lg_booking_reserved_blocks(b, &reserved));
    CHECK(reserved == 7);
    uint64_t blocks = 0;
    OK(lg_booking_blocks(b, &blocks));
    CHECK(blocks == 17);
    OK(lg_booking_tokens(b, 100)); /* past its limit: the actual */
    OK(lg_booking_reserved_blocks(b, &reserved));
    CHECK(reserved == 9);
    lg_booking_finish(b, UINT64_MAX); /* learned as 141 tokens, and freed */

    /* Advisory: the verdict (free) is counted, never acted on. */
    struct lg_slo_counts counts = {9, 9, 9, 9};
    uint64_t w = 0;
    EXPECT(lg_monitor_slo_counts(m, S("nope"), &counts), LG_NOT_FOUND);
    INVALID(lg_monitor_slo_counts(m, S("llama"), NULL));
    OK(lg_monitor_select(m, S("llama"), LG_POLICY_RANDOM, &w));
    OK(lg_monitor_slo_counts(m, S("llama"), &counts));
    CHECK(counts.would_admit == 1 && counts.would_refuse == 0);
    CHECK(counts.would_queue == 0 && counts.refused_late == 0);

    OK(lg_monitor_set_slo(m, S("llama"), NULL)); /* cleared */
    lg_monitor_free(m);
}

/* With an SLO enforced, a rank's seats never pass its engine's own
 * (lg_worker_spec.max_num_seqs, or a report's), which stand for them until
 * any are learned, and no probe passes them: 3 seats, so busy at the fourth
 * booking; after a report of 2 seats, at the third. */
void test_monitor_slo_engine_seats(void) {
    lg_monitor *m = NULL;
    OK(lg_monitor_new(NULL, &m));
    lg_worker_spec spec = one_rank(1000);
    spec.has_max_num_seqs = true;
    spec.max_num_seqs = 3;
    OK(lg_monitor_add_worker(m, S("llama"), 5, &spec));
    lg_booking *held[8] = {NULL};
    size_t n = 0;
    CHECK(slo_bookings_until_busy(m, 5, held, &n) == 4);
    while (n > 2) lg_booking_free(held[--n]);
    lg_load_report report;
    memset(&report, 0, sizeof report);
    report.has_max_num_seqs = true;
    report.max_num_seqs = 2;
    OK(lg_monitor_report(m, 5, 0, &report));
    book_until_busy(m, 5, held, &n);
    CHECK(n == 3);
    while (n > 0) lg_booking_free(held[--n]);
    lg_monitor_free(m);
}
