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

lg_load_report kv_report(uint64_t used, uint64_t total) {
    lg_load_report r;
    memset(&r, 0, sizeof r);
    r.has_kv_used_blocks = true;
    r.kv_used_blocks = used;
    r.has_kv_total_blocks = true;
    r.kv_total_blocks = total;
    return r;
}
