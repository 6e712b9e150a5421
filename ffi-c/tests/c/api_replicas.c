/*
 * The C11 API test (see api.c): booking sync between frontend replicas
 * (lg_monitor_sync_bookings, lg_booking_sync_*): its error paths always,
 * and two frontends sharing their bookings through the nats-server that
 * LG_NATS_URL names when set.
 */
#define _POSIX_C_SOURCE 200809L

#include "check.h"

#define UNREACHABLE "nats://127.0.0.1:1"

void test_replicas_errors(void) {
    lg_booking_sync_config c;
    INVALID(lg_booking_sync_config_default(NULL));
    OK(lg_booking_sync_config_default(&c));
    CHECK(c.debounce_ms == 2 && c.heartbeat_ms == 1000 && c.expire_after_ms == 3000);
    CHECK(c.max_frontends == 64 && c.max_entries == 262144);

    lg_monitor *m = half_line_monitor();
    lg_booking_sync *s = NULL;
    const size_t n = strlen(UNREACHABLE);
    INVALID(lg_monitor_sync_bookings(NULL, UNREACHABLE, n, S("ns"), S("a"), NULL, NULL, &s));
    INVALID(lg_monitor_sync_bookings(m, UNREACHABLE, n, S("ns"), S("a"), NULL, NULL, NULL));
    INVALID(lg_monitor_sync_bookings(m, UNREACHABLE, n, S("ns"), S("a.b"), NULL, NULL, &s));
    CHECK(last_error_contains("frontend_id"));
    INVALID(lg_monitor_sync_bookings(m, UNREACHABLE, n, S("n s"), S("a"), NULL, NULL, &s));
    c.debounce_ms = 0;
    INVALID(lg_monitor_sync_bookings(m, UNREACHABLE, n, S("ns"), S("a"), &c, NULL, &s));
    OK(lg_booking_sync_config_default(&c));
    c.expire_after_ms = c.heartbeat_ms;
    INVALID(lg_monitor_sync_bookings(m, UNREACHABLE, n, S("ns"), S("a"), &c, NULL, &s));
    OK(lg_booking_sync_config_default(&c));
    c.max_entries = 0;
    INVALID(lg_monitor_sync_bookings(m, UNREACHABLE, n, S("ns"), S("a"), &c, NULL, &s));
    CHECK(last_error_contains("max_entries"));
    EXPECT(lg_monitor_sync_bookings(m, UNREACHABLE, n, S("ns"), S("a"), NULL, NULL, &s),
           LG_TRANSPORT_ERROR);
    CHECK(s == NULL);
    lg_booking_sync_stats st;
    INVALID(lg_booking_sync_get_stats(NULL, &st));
    lg_booking_sync_free(NULL);
    lg_monitor_free(m);
}

void test_replicas_live(const char *url) {
    double t0 = now_ms();
    const size_t url_len = strlen(url);
    lg_monitor *a = half_line_monitor(), *b = half_line_monitor();
    lg_booking_sync_config c;
    OK(lg_booking_sync_config_default(&c));
    c.heartbeat_ms = 100;
    c.expire_after_ms = 300;
    lg_booking_sync *sa = NULL, *sb = NULL;
    OK(lg_monitor_sync_bookings(a, url, url_len, S("capi-replicas"), S("a"), &c, NULL, &sa));
    OK(lg_monitor_sync_bookings(b, url, url_len, S("capi-replicas"), S("b"), &c, NULL, &sb));

    /* 30 blocks each: neither is over half alone, both are together. */
    lg_booking *ka = NULL, *kb = NULL;
    OK(lg_monitor_book(a, 1, 0, 30, &ka));
    OK(lg_monitor_book(b, 1, 0, 30, &kb));
    CHECK(await_busy(a, 1, true) && await_busy(b, 1, true));
    lg_booking_free(ka);
    CHECK(await_busy(a, 1, false) && await_busy(b, 1, false));

    lg_booking_sync_stats st;
    OK(lg_booking_sync_get_stats(sa, &st));
    CHECK(st.sent >= 2 && st.received >= 1 && st.frontends == 1 && st.refused == 0);
    CHECK(st.last_size > 0);
    INVALID(lg_booking_sync_get_stats(sa, NULL));

    /* B stops: A forgets its 30 blocks after its silence. */
    OK(lg_monitor_book(a, 1, 0, 25, &ka));
    CHECK(await_busy(a, 1, true)); /* 25 + B's 30 */
    lg_booking_sync_free(sb);
    CHECK(await_busy(a, 1, false));
    OK(lg_booking_sync_get_stats(sa, &st));
    CHECK(st.expired == 1 && st.frontends == 0);

    lg_booking_free(ka);
    lg_booking_free(kb);
    lg_booking_sync_free(sa);
    lg_monitor_free(a);
    lg_monitor_free(b);
    printf("c11 api: booking sync against %s took %.0f ms\n", url, now_ms() - t0);
}
