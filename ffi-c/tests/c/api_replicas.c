/*
 * The C11 API test (see api.c): booking sync between frontend replicas
 * (lg_monitor_sync_bookings, lg_booking_sync_*): its error paths always,
 * and two frontends sharing their bookings through the nats-server that
 * LG_NATS_URL names when set, in shared mode and in leased mode.
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
    CHECK(c.mode == LG_SYNC_SHARED && c.lease_ms == 1000 && c.snapshot_every_ms == 10000);

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
    c.snapshot_every_ms = c.heartbeat_ms - 1;
    INVALID(lg_monitor_sync_bookings(m, UNREACHABLE, n, S("ns"), S("a"), &c, NULL, &s));
    CHECK(last_error_contains("snapshot_every"));
    OK(lg_booking_sync_config_default(&c));
    c.max_entries = 0;
    INVALID(lg_monitor_sync_bookings(m, UNREACHABLE, n, S("ns"), S("a"), &c, NULL, &s));
    CHECK(last_error_contains("max_entries"));
    OK(lg_booking_sync_config_default(&c));
    c.mode = 7;
    INVALID(lg_monitor_sync_bookings(m, UNREACHABLE, n, S("ns"), S("a"), &c, NULL, &s));
    CHECK(last_error_contains("mode"));
    c.mode = LG_SYNC_LEASED;
    c.lease_ms = 2;
    INVALID(lg_monitor_sync_bookings(m, UNREACHABLE, n, S("ns"), S("a"), &c, NULL, &s));
    CHECK(last_error_contains("lease"));
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
    CHECK(st.last_size > 0 && st.bytes_sent >= st.last_size && st.bytes_received > 0);
    CHECK(st.snapshots_sent >= 1 && st.snapshots_sent <= st.sent && st.behind == 0);
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

/* Books one block at a time on worker 1 until refused; how many. */
static uint64_t fill(lg_monitor *m, lg_booking **held, size_t cap) {
    size_t k = 0;
    lg_status st;
    while (k < cap && (st = lg_monitor_book(m, 1, 0, 1, &held[k])) == LG_OK) {
        k++;
    }
    CHECK(k < cap && st == LG_WORKER_OVERLOADED);
    CHECK(last_error_contains("leased share"));
    return k;
}

static uint32_t share_of(const lg_booking_sync *s) {
    lg_booking_sync_stats st;
    OK(lg_booking_sync_get_stats(s, &st));
    return st.share_ppm;
}

void test_replicas_leased_live(const char *url) {
    double t0 = now_ms();
    const size_t url_len = strlen(url);
    lg_monitor *a = half_line_monitor(), *b = half_line_monitor();
    lg_booking_sync_config c;
    OK(lg_booking_sync_config_default(&c));
    c.mode = LG_SYNC_LEASED; /* the default lease of 1 s holds under valgrind too */
    lg_booking_sync *sa = NULL, *sb = NULL;
    OK(lg_monitor_sync_bookings(a, url, url_len, S("capi-leased"), S("a"), &c, NULL, &sa));
    OK(lg_monitor_sync_bookings(b, url, url_len, S("capi-leased"), S("b"), &c, NULL, &sb));
    /* Joining, neither books anything. */
    lg_booking *one = NULL;
    EXPECT(lg_monitor_book(a, 1, 0, 1, &one), LG_WORKER_OVERLOADED);

    /* Once both have joined they share out the line of 50 blocks. */
    double deadline = now_ms() + WAIT_MS;
    while ((share_of(sa) == 0 || share_of(sb) == 0 || share_of(sa) + share_of(sb) < 900000) &&
           now_ms() < deadline) {
        sleep_ms(5);
    }
    uint32_t pa = share_of(sa), pb = share_of(sb);
    CHECK(pa > 0 && pb > 0 && pa + pb >= 900000 && pa + pb <= 1000000);

    /* Each books within its share, and the two never pass the line. */
    lg_booking *held[128];
    uint64_t na = fill(a, held, 64), nb = fill(b, held + na, 64);
    CHECK(na <= (uint64_t)pa * 50 / 1000000 && nb <= (uint64_t)pb * 50 / 1000000);
    CHECK(na + nb <= 50 && na + nb >= 25);
    for (uint64_t k = 0; k < na + nb; k++) {
        lg_booking_free(held[k]);
    }

    lg_booking_sync_free(sb);
    lg_booking_sync_free(sa);
    lg_monitor_free(a);
    lg_monitor_free(b);
    printf("c11 api: leased booking sync against %s: shares %u and %u ppm, %llu and %llu of "
           "50 blocks; took %.0f ms\n",
           url, pa, pb, (unsigned long long)na, (unsigned long long)nb, now_ms() - t0);
}
