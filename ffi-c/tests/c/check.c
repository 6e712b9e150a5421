/*
 * The helpers check.h declares, shared by the files of the C11 API test.
 */
#define _POSIX_C_SOURCE 200809L

#include "check.h"

#include <time.h>

int checks;

int contains(const char *haystack, const char *needle) {
    return strstr(haystack, needle) != NULL;
}

int last_error_contains(const char *needle) {
    return contains(lg_last_error_message(), needle);
}

void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int await_busy(const lg_monitor *m, uint64_t worker_id, bool want) {
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

lg_worker_spec one_rank(uint64_t kv_total) {
    lg_worker_spec spec;
    memset(&spec, 0, sizeof spec);
    spec.dp_size = 1;
    spec.has_kv_total_blocks = true;
    spec.kv_total_blocks = kv_total;
    return spec;
}

void book_until_busy(lg_monitor *m, uint64_t worker, lg_booking **held, size_t *n) {
    bool busy = false;
    OK(lg_monitor_is_busy(m, worker, &busy));
    while (!busy && *n < 8) {
        OK(lg_monitor_book(m, worker, 0, 4, &held[(*n)++]));
        OK(lg_monitor_is_busy(m, worker, &busy));
    }
    CHECK(busy);
}

size_t slo_bookings_until_busy(lg_monitor *m, uint64_t worker, lg_booking **held, size_t *n) {
    lg_slo slo = {2.0, 0.1, false};
    OK(lg_monitor_set_slo(m, S("llama"), &slo));
    book_until_busy(m, worker, held, n);
    return *n;
}

lg_monitor *half_line_monitor(void) {
    lg_monitor *m = NULL;
    OK(lg_monitor_new(NULL, &m));
    lg_worker_spec spec = one_rank(100);
    OK(lg_monitor_add_worker(m, S("m"), 1, &spec));
    lg_threshold_update u;
    memset(&u, 0, sizeof u);
    u.has_active_decode_blocks_threshold = true;
    u.active_decode_blocks_threshold = 0.5;
    OK(lg_monitor_set_thresholds(m, S("m"), &u, NULL));
    return m;
}

lg_load_report kv_report(uint64_t used, uint64_t total) {
    lg_load_report r;
    memset(&r, 0, sizeof r);
    r.has_kv_used_blocks = true;
    r.kv_used_blocks = used;
    r.has_kv_total_blocks = true;
    r.kv_total_blocks = total;
    return r;
}
