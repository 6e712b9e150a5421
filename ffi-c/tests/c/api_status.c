/*
 * The C11 API test (see api.c): the version, every status's text, HTTP
 * status and reason, the per-thread last error, and lg_error_response().
 */
#define _POSIX_C_SOURCE 200809L

#include "check.h"

#include <pthread.h>

/* ----- version, status, last error -------------------------------------- */

static void *other_thread_last_error(void *arg) {
    (void)arg;
    /* Another thread's failures are not visible here. */
    return (void *)(lg_last_error_message()[0] == '\0' ? "empty" : NULL);
}

void test_version_and_status(void) {
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", LOADGATE_VERSION_MAJOR, LOADGATE_VERSION_MINOR,
             LOADGATE_VERSION_PATCH);
    CHECK(strcmp(lg_version(), want) == 0);

    CHECK(strcmp(lg_last_error_message(), "") == 0);

    const lg_status all[] = {LG_OK,          LG_OVERLOADED,       LG_UNAVAILABLE,
                             LG_WORKER_OVERLOADED, LG_AT_CAPACITY, LG_QUEUE_TIMEOUT,
                             LG_CLOSED,      LG_WOULD_WAIT,       LG_TIMED_OUT,
                             LG_DISPLACED,
                             LG_INVALID_ARGUMENT, LG_NOT_FOUND,   LG_BUFFER_TOO_SMALL,
                             LG_ALREADY_EXISTS, LG_MODEL_FULL,    LG_TRANSPORT_ERROR,
                             LG_PANIC};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        CHECK(lg_status_str((int)all[i]) != NULL);
        CHECK(strcmp(lg_status_str((int)all[i]), "unknown status") != 0);
        CHECK(lg_status_http((int)all[i]) >= 200);
    }
    CHECK(strcmp(lg_status_str(-1), "unknown status") == 0);
    CHECK(strcmp(lg_status_str(LG_OVERLOADED), "All workers are busy, please retry later") == 0);
    CHECK(strcmp(lg_status_str(LG_AT_CAPACITY), "Server overloaded: worker at capacity") == 0);

    /* The overload status comes from DYN_HTTP_OVERLOAD_STATUS_CODE, set by
     * main() before the first call; 503 stays 503. */
    CHECK(lg_overload_status() == 429);
    CHECK(lg_status_http(LG_OK) == 200);
    CHECK(lg_status_http(LG_OVERLOADED) == 429);
    CHECK(lg_status_http(LG_WORKER_OVERLOADED) == 429);
    CHECK(lg_status_http(LG_AT_CAPACITY) == 429);
    CHECK(lg_status_http(LG_QUEUE_TIMEOUT) == 429);
    CHECK(lg_status_http(LG_WOULD_WAIT) == 429);
    CHECK(lg_status_http(LG_TIMED_OUT) == 429);
    CHECK(lg_status_http(LG_DISPLACED) == 429);
    CHECK(lg_status_http(LG_UNAVAILABLE) == 503);
    CHECK(lg_status_http(LG_CLOSED) == 503);
    CHECK(lg_status_http(LG_INVALID_ARGUMENT) == 400);
    CHECK(lg_status_http(LG_NOT_FOUND) == 404);
    CHECK(lg_status_http(LG_ALREADY_EXISTS) == 409);
    CHECK(lg_status_http(LG_TRANSPORT_ERROR) == 500);
    CHECK(lg_status_http(LG_PANIC) == 500);
    CHECK(lg_status_http(99999) == 500);

    CHECK(strcmp(lg_status_reason(LG_OVERLOADED), "all_workers_busy") == 0);
    CHECK(strcmp(lg_status_reason(LG_UNAVAILABLE), "no_workers") == 0);
    CHECK(strcmp(lg_status_reason(LG_WORKER_OVERLOADED), "worker_overloaded") == 0);
    CHECK(strcmp(lg_status_reason(LG_AT_CAPACITY), "worker_at_capacity") == 0);
    CHECK(strcmp(lg_status_reason(LG_QUEUE_TIMEOUT), "queue_timeout") == 0);
    CHECK(strcmp(lg_status_reason(LG_CLOSED), "closed") == 0);
    CHECK(strcmp(lg_status_reason(LG_DISPLACED), "displaced") == 0);
    CHECK(lg_status_reason(LG_OK) == NULL);
    CHECK(lg_status_reason(LG_NOT_FOUND) == NULL);
    CHECK(lg_status_reason(LG_TRANSPORT_ERROR) == NULL);
    CHECK(lg_status_reason(-5) == NULL);

    /* The last error is per thread, and success leaves it alone. */
    INVALID(lg_monitor_new(NULL, NULL));
    CHECK(last_error_contains("out_monitor must not be NULL"));
    pthread_t t;
    void *result = NULL;
    CHECK(pthread_create(&t, NULL, other_thread_last_error, NULL) == 0);
    CHECK(pthread_join(t, &result) == 0);
    CHECK(result != NULL);
    CHECK(strcmp(lg_version(), want) == 0);
    CHECK(last_error_contains("out_monitor must not be NULL"));
}

/* ----- HTTP helpers ------------------------------------------------------ */

void test_error_response(void) {
    char body[512];
    size_t needed = 0;
    uint16_t http = 0;
    uint64_t retry = 0;

    OK(lg_error_response(LG_OVERLOADED, LG_ERROR_STYLE_DYNAMO, 1500, &http, &retry, body,
                         sizeof body, &needed));
    CHECK(http == 429);
    CHECK(retry == 2);
    CHECK(needed == strlen(body));
    CHECK(strcmp(body, "{\"message\":\"Service temporarily overloaded\",\"type\":\"Overloaded\","
                       "\"code\":429}") == 0);

    OK(lg_error_response(LG_UNAVAILABLE, LG_ERROR_STYLE_OPENAI, 0, &http, &retry, body,
                         sizeof body, &needed));
    CHECK(http == 503);
    CHECK(retry == 1);
    CHECK(contains(body, "\"code\":\"no_workers\""));

    OK(lg_error_response(LG_AT_CAPACITY, LG_ERROR_STYLE_ANTHROPIC, 3000, &http, &retry, body,
                         sizeof body, &needed));
    CHECK(http == 429 && retry == 3);
    CHECK(contains(body, "overloaded_error"));

    /* Buffer too small: snprintf semantics, status and length still given. */
    char tiny[8];
    http = 0;
    EXPECT(lg_error_response(LG_WORKER_OVERLOADED, LG_ERROR_STYLE_DYNAMO, 1000, &http, &retry,
                             tiny, sizeof tiny, &needed),
           LG_BUFFER_TOO_SMALL);
    CHECK(needed > sizeof tiny && http == 429);
    CHECK(strlen(tiny) == sizeof tiny - 1);
    CHECK(last_error_contains("too small"));
    size_t size_only = 0;
    EXPECT(lg_error_response(LG_QUEUE_TIMEOUT, LG_ERROR_STYLE_DYNAMO, 1000, &http, &retry, NULL,
                             0, &size_only),
           LG_BUFFER_TOO_SMALL);
    CHECK(size_only > 0);

    INVALID(lg_error_response(LG_OK, LG_ERROR_STYLE_DYNAMO, 1000, &http, &retry, body,
                              sizeof body, &needed));
    CHECK(last_error_contains("not a rejection"));
    INVALID(lg_error_response(LG_NOT_FOUND, LG_ERROR_STYLE_DYNAMO, 1000, &http, &retry, body,
                              sizeof body, &needed));
    INVALID(lg_error_response(LG_OVERLOADED, 7, 1000, &http, &retry, body, sizeof body,
                              &needed));
    INVALID(lg_error_response(LG_OVERLOADED, LG_ERROR_STYLE_DYNAMO, 1000, NULL, &retry, body,
                              sizeof body, &needed));
    INVALID(lg_error_response(LG_OVERLOADED, LG_ERROR_STYLE_DYNAMO, 1000, &http, NULL, body,
                              sizeof body, &needed));
    INVALID(lg_error_response(LG_OVERLOADED, LG_ERROR_STYLE_DYNAMO, 1000, &http, &retry, body,
                              sizeof body, NULL));
    INVALID(lg_error_response(LG_OVERLOADED, LG_ERROR_STYLE_DYNAMO, 1000, &http, &retry, NULL,
                              16, &needed));
}
