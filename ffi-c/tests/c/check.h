/*
 * What the files of the C11 API test share: the check macros, which count
 * each check in `checks` and on a failure print the check and the last
 * error message and exit 1; the helpers of check.c; and the tests that
 * main() in api.c runs, one group per file.
 *
 * Every file of the program defines _POSIX_C_SOURCE before it includes this
 * header or any system header.
 */
#ifndef LOADGATE_TEST_CHECK_H
#define LOADGATE_TEST_CHECK_H

#include <loadgate.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How many checks have run (and passed: a failed one exits). */
extern int checks;

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

int contains(const char *haystack, const char *needle);
int last_error_contains(const char *needle);
void sleep_ms(long ms);
/* Milliseconds on the monotonic clock. */
double now_ms(void);
/* How long a wait for another thread or process may take before the check
 * fails: far above what a loaded machine (or valgrind) needs, so it bounds a
 * hang, not a speed. */
#define WAIT_MS 30000.0
/* Polls lg_monitor_is_busy until it answers `want`, for at most WAIT_MS. */
int await_busy(const lg_monitor *m, uint64_t worker_id, bool want);
lg_load_report kv_report(uint64_t used, uint64_t total);
/* A worker of one rank (0) with `kv_total` KV blocks. */
lg_worker_spec one_rank(uint64_t kv_total);
/* Books rank 0 of `worker` (bookings of 4 blocks, into held[*n..8]) until
 * it is busy. */
void book_until_busy(lg_monitor *m, uint64_t worker, lg_booking **held, size_t *n);
/* Sets model "llama"'s SLO (2 s, 0.1 s, enforced), then book_until_busy:
 * the bookings it took. */
size_t slo_bookings_until_busy(lg_monitor *m, uint64_t worker, lg_booking **held, size_t *n);
/* A monitor of model "m" with worker 1 (one rank of 100 KV blocks), busy
 * above half of them. */
lg_monitor *half_line_monitor(void);

/* api_status.c: version, statuses, the last error, error responses. */
void test_version_and_status(void);
void test_error_response(void);

/* api_monitor.c: the monitor's settings, workers, thresholds, routing. */
void test_monitor_config(void);
void test_monitor(void);
void test_monitor_waiting_requests(void);
void test_monitor_slo(void);
void test_monitor_slo_engine_seats(void);

/* api_discovery.c: workers from engine scraping and Dynamo's discovery. */
void test_scrape(void);
void test_scrape_declared_seats(void);
void test_discovery(void);
void test_discovery_etcd_live(const char *url, uint64_t worker);

/* api_busy_threshold.c: the /busy_threshold handler's auth and headers. */
void test_busy_threshold_auth(void);
void test_busy_threshold_headers(void);

/* api_gate.c: the admission gate. */
void test_gate_config(void);
void test_gate(void);
void test_gate_wait_limit(void);
void test_gate_deadline(void);
void test_gate_classes(void);

/* api_flow.c: frontend flow control. */
void test_flow(void);

/* api_cluster.c: load reports across machines (NATS). */
void test_cluster_errors(void);
void test_nats_options_errors(void);
void test_cluster_live(const char *url);
void test_cluster_dynamo_live(const char *url);
void test_cluster_auth_live(const char *url);

/* api_replicas.c: booking sync between frontend replicas (NATS). */
void test_replicas_errors(void);
void test_replicas_live(const char *url);
void test_replicas_leased_live(const char *url);

#endif /* LOADGATE_TEST_CHECK_H */
