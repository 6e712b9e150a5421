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
 * The program is this file's main(), which runs the tests in order, and
 * the files next to it, each a group of tests (check.h declares them and
 * the check macros; check.c holds the shared helpers): api_status.c,
 * api_monitor.c, api_discovery.c, api_busy_threshold.c, api_gate.c,
 * api_flow.c, api_cluster.c and api_replicas.c.
 *
 * Built as C11 with -Wall -Wextra -Wpedantic -Werror and run plain, under
 * valgrind memcheck and with ASan+UBSan by ffi-c/tests/run.sh. Exits 0 when
 * every check passed; prints the failing check and the last error message
 * otherwise.
 */
#define _POSIX_C_SOURCE 200809L

#include "check.h"

int main(void) {
    /* Read once per process, at the first call that needs it. */
    setenv("DYN_HTTP_OVERLOAD_STATUS_CODE", " 429 ", 1);

    test_version_and_status();
    test_error_response();
    test_monitor_config();
    test_monitor();
    test_monitor_waiting_requests();
    test_monitor_slo();
    test_monitor_slo_engine_seats();
    test_scrape();
    test_scrape_declared_seats();
    test_discovery();
    test_busy_threshold_auth();
    test_busy_threshold_headers();
    test_gate_config();
    test_gate();
    test_gate_wait_limit();
    test_gate_deadline();
    test_gate_classes();
    test_flow();
    test_cluster_errors();
    test_nats_options_errors();
    test_replicas_errors();
    const char *nats_url = getenv("LG_NATS_URL");
    if (nats_url != NULL && nats_url[0] != '\0') {
        test_cluster_live(nats_url);
        test_cluster_dynamo_live(nats_url);
        test_replicas_live(nats_url);
        test_replicas_leased_live(nats_url);
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
