/*
 * The C11 API test (see api.c): load reports across machines over NATS
 * (lg_reporter_*, lg_monitor_subscribe_nats*, lg_nats_options_*): their
 * error paths always, and end to end through the nats-servers that
 * LG_NATS_URL and LG_NATS_AUTH_URL name when set.
 */
#define _POSIX_C_SOURCE 200809L

#include "check.h"

#include <time.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

/* ----- load reports across machines (NATS) -------------------------------- */

/* Nothing listens on port 1 of the loopback interface. */
#define UNREACHABLE "nats://127.0.0.1:1"

void test_cluster_errors(void) {
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
void test_nats_options_errors(void) {
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

/* Two workers (two ranks each) report over a real nats-server; two
 * frontends subscribed to the namespace see them, agree on the busy set,
 * and route or refuse accordingly. */
void test_cluster_live(const char *url) {
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
void test_cluster_dynamo_live(const char *url) {
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

    lg_subscription_stats ss;
    /* Another monitor announces its own bookings to the backend/generate
     * endpoint's routers; the front, following every endpoint's routers,
     * holds them as a router's. */
    OK(lg_monitor_add_worker(front, S("m"), 79, &spec));
    lg_monitor *router = NULL;
    OK(lg_monitor_new(NULL, &router));
    OK(lg_monitor_add_worker(router, S("m"), 79, &spec));
    lg_nats_options *announce = NULL;
    OK(lg_nats_options_new(&announce));
    INVALID(lg_nats_options_set_announce_bookings(NULL, true));
    OK(lg_nats_options_set_announce_bookings(announce, true));
    lg_subscription *told = (lg_subscription *)(uintptr_t)0x1;
    INVALID(lg_monitor_subscribe_nats_with(router, url, url_len, S("capi-dyn"), announce, &told));
    CHECK(last_error_contains("lg_nats_options_set_dynamo_endpoint"));
    OK(lg_nats_options_set_dynamo_endpoint(announce, S("backend"), S("generate")));
    OK(lg_monitor_subscribe_nats_with(router, url, url_len, S("capi-dyn"), announce, &told));
    lg_subscription *again = (lg_subscription *)(uintptr_t)0x1;
    INVALID(lg_monitor_subscribe_nats_with(router, url, url_len, S("capi-dyn"), announce, &again));
    CHECK(last_error_contains("already announced"));
    CHECK(again == (lg_subscription *)(uintptr_t)0x1);
    lg_nats_options_free(announce);
    lg_booking *held = NULL;
    OK(lg_monitor_book(router, 79, 0, 60, &held));
    CHECK(await_busy(front, 79, true));
    lg_booking_free(held);
    CHECK(await_busy(front, 79, false));
    OK(lg_subscription_get_stats(told, &ss));
    CHECK(ss.bookings_announced == 2 && ss.announce_lost == 0 && ss.router_id != 0);
    OK(lg_subscription_get_stats(sub, &ss));
    CHECK(ss.router_id == 0 && ss.bookings_announced == 0);

    lg_subscription_free(told);
    lg_monitor_free(router);
    lg_reporter_free(w);
    lg_reporter_free(stranger);
    lg_subscription_free(sub);
    lg_monitor_free(front);
    printf("c11 api: the reference's envelope crossed %s both ways\n", url);
}

/* A nats-server that wants user "loadgate" with password "s3cret"
 * (ffi-c/tests/run.sh starts it): refused credentials are a transport
 * error saying so; the right ones carry a report to a frontend. */
void test_cluster_auth_live(const char *url) {
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
