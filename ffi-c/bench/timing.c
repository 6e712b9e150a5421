/*
 * Times the two hot paths through the C ABI:
 *   select:    lg_monitor_select(round robin) on a model of 8 workers, 2 busy
 *   admit:     lg_gate_try_admit + lg_permit_release on an idle gate
 * and prints ns of thread CPU time per call as "name ns" lines. examples/timing.rs does the same
 * calls in Rust; bench/run.sh runs both and prints the ratios.
 *
 * Usage: timing [iterations [select|admit]]
 *   (default 2,000,000 per run, best of 7 runs; both operations)
 */
#define _POSIX_C_SOURCE 200809L

#include <loadgate.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RUNS 7

/* CPU time of this thread: time the thread spent preempted by other work on
 * the machine is not counted. */
static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static void must(lg_status s, const char *what) {
    if (s != LG_OK) {
        fprintf(stderr, "%s: %s (%s)\n", what, lg_status_str((int)s), lg_last_error_message());
        exit(1);
    }
}

int main(int argc, char **argv) {
    long iters = argc > 1 ? atol(argv[1]) : 2000000;
    const char *only = argc > 2 ? argv[2] : "";
    const int do_select = strcmp(only, "admit") != 0, do_admit = strcmp(only, "select") != 0;
    static const char model[] = "llama";
    const size_t model_len = sizeof model - 1;

    lg_monitor *m = NULL;
    must(lg_monitor_new(NULL, &m), "lg_monitor_new");
    lg_worker_spec spec;
    memset(&spec, 0, sizeof spec);
    spec.dp_size = 2;
    spec.has_kv_total_blocks = true;
    spec.kv_total_blocks = 1000;
    for (uint64_t id = 1; id <= 8; id++) {
        must(lg_monitor_add_worker(m, model, model_len, id, &spec), "add_worker");
    }
    lg_threshold_update u;
    memset(&u, 0, sizeof u);
    u.has_active_decode_blocks_threshold = true;
    u.active_decode_blocks_threshold = 0.9;
    must(lg_monitor_set_thresholds(m, model, model_len, &u, NULL), "set_thresholds");
    lg_load_report r;
    memset(&r, 0, sizeof r);
    r.has_kv_used_blocks = true;
    r.kv_used_blocks = 950;
    for (uint64_t id = 3; id <= 4; id++) {
        must(lg_monitor_report(m, id, 0, &r), "report");
        must(lg_monitor_report(m, id, 1, &r), "report");
    }

    lg_gate_config gc;
    must(lg_gate_config_default(4, &gc), "gate_config_default");
    lg_gate *g = NULL;
    must(lg_gate_new(&gc, &g), "lg_gate_new");

    double best_select = 1e30, best_admit = 1e30;
    volatile uint64_t sink = 0;
    for (int run = 0; run < RUNS; run++) {
        double t0 = now_ns();
        for (long i = 0; do_select && i < iters; i++) {
            uint64_t w;
            lg_status s = lg_monitor_select(m, model, model_len, LG_POLICY_ROUND_ROBIN, &w);
            sink += (s == LG_OK) ? w : 0;
        }
        double t1 = now_ns();
        for (long i = 0; do_admit && i < iters; i++) {
            lg_permit *p;
            if (lg_gate_try_admit(g, &p) == LG_OK) {
                lg_permit_release(p);
            } else {
                sink += 1;
            }
        }
        double t2 = now_ns();
        double sel = (t1 - t0) / (double)iters, adm = (t2 - t1) / (double)iters;
        if (sel < best_select) best_select = sel;
        if (adm < best_admit) best_admit = adm;
    }
    if (do_select) printf("select %.2f\n", best_select);
    if (do_admit) printf("try_admit+release %.2f\n", best_admit);
    lg_gate_free(g);
    lg_monitor_free(m);
    return sink == 0 && do_select ? 1 : 0;
}
