/*
 * The C11 API test (see api.c): the /busy_threshold handler with a bearer
 * token (lg_control_auth) and the headers of its answers.
 */
#define _POSIX_C_SOURCE 200809L

#include "check.h"

/* ----- /busy_threshold with a bearer token -------------------------------- */

/* One request through lg_monitor_handle_busy_threshold_auth() with a JSON
 * content type; *challenge receives the WWW-Authenticate value or NULL
 * (challenge NULL: no headers asked for). */
static uint16_t auth_call(const lg_monitor *m, const lg_control_auth *auth, const char *method,
                          const char *authorization, const char *body, const char **challenge,
                          char *resp, size_t resp_len) {
    uint16_t status = 0;
    size_t needed = 0;
    lg_http_headers headers;
    OK(lg_monitor_handle_busy_threshold_auth(
        m, auth, method, strlen(method), S("application/json"), authorization,
        authorization ? strlen(authorization) : 0, (const uint8_t *)body, strlen(body), &status,
        challenge ? &headers : NULL, resp, resp_len, &needed));
    if (challenge) {
        *challenge = headers.www_authenticate;
        CHECK(headers.content_type != NULL && strcmp(headers.content_type, "application/json") == 0);
    }
    return status;
}

/* The headers of 1.6.1's answers: plain text for what is not JSON, an empty
 * 405 with its Allow. */
void test_busy_threshold_headers(void) {
    lg_monitor *m = NULL;
    OK(lg_monitor_new(NULL, &m));
    OK(lg_monitor_add_worker(m, S("llama"), 1, NULL));
    char resp[512];
    uint16_t status = 0;
    size_t needed = 0;
    lg_http_headers h;
    OK(lg_monitor_handle_busy_threshold_auth(m, NULL, S("POST"), S("text/plain"), NULL, 0,
                                             (const uint8_t *)"{}", 2, &status, &h, resp,
                                             sizeof resp, &needed));
    CHECK(status == 415 && strcmp(h.content_type, "text/plain; charset=utf-8") == 0);
    CHECK(strcmp(resp, "Expected request with `Content-Type: application/json`") == 0);
    CHECK(h.allow == NULL && h.www_authenticate == NULL);
    OK(lg_monitor_handle_busy_threshold_auth(m, NULL, S("PUT"), NULL, 0, NULL, 0, NULL, 0,
                                             &status, &h, resp, sizeof resp, &needed));
    CHECK(status == 405 && h.content_type == NULL && strcmp(h.allow, "POST,GET,HEAD") == 0);
    CHECK(resp[0] == '\0' && needed == 0);
    const char *ghost = "{\"model\":\"ghost\",\"active_decode_blocks_threshold\":0.5}";
    OK(lg_monitor_handle_busy_threshold_auth(m, NULL, S("POST"), S("application/json"), NULL, 0,
                                             (const uint8_t *)ghost, strlen(ghost), &status, &h,
                                             resp, sizeof resp, &needed));
    CHECK(status == 404 && strcmp(h.content_type, "application/json") == 0);
    CHECK(strcmp(resp, "{\"error\":\"Model 'ghost' not found. Thresholds can only be set for "
                       "discovered models.\"}") == 0);
    lg_monitor_free(m);
}

void test_busy_threshold_auth(void) {
    lg_monitor *m = NULL;
    OK(lg_monitor_new(NULL, &m));
    OK(lg_monitor_add_worker(m, S("llama"), 1, NULL));
    lg_control_auth *auth = NULL;
    OK(lg_control_auth_new(S("s3cret"), false, &auth));
    CHECK(auth != NULL);

    char resp[512];
    const char *challenge = "unset";
    const char *set = "{\"model\":\"llama\",\"active_decode_blocks_threshold\":0.5}";
    const char *read = "{\"model\":\"llama\"}";
    lg_thresholds t;

    /* A write without the right token: 401, the challenge, nothing changed. */
    const char *refused[][2] = {
        {NULL, "missing bearer token"},
        {"Basic czNjcmV0", "missing bearer token"},
        {"Bearer", "missing bearer token"},
        {"Bearer wrong", "invalid bearer token"},
        {"Bearer S3CRET", "invalid bearer token"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        challenge = "unset";
        CHECK(auth_call(m, auth, "POST", refused[i][0], set, &challenge, resp, sizeof resp) == 401);
        CHECK(challenge != NULL && strcmp(challenge, "Bearer") == 0);
        CHECK(contains(resp, "\"error\"") && contains(resp, refused[i][1]));
    }
    OK(lg_monitor_get_thresholds(m, S("llama"), &t));
    CHECK(t.version == 0 && !t.has_active_decode_blocks_threshold);

    /* Reads stay open; a 200 carries no challenge. */
    CHECK(auth_call(m, auth, "GET", NULL, "", &challenge, resp, sizeof resp) == 200);
    CHECK(challenge == NULL && contains(resp, "\"thresholds\""));
    CHECK(auth_call(m, auth, "POST", NULL, read, &challenge, resp, sizeof resp) == 200);

    /* The right token, scheme in any case: applied. */
    CHECK(auth_call(m, auth, "POST", "bearer s3cret", set, &challenge, resp, sizeof resp) == 200);
    CHECK(challenge == NULL && contains(resp, "\"version\":1"));
    OK(lg_monitor_get_thresholds(m, S("llama"), &t));
    CHECK(t.version == 1 && t.has_active_decode_blocks_threshold &&
          t.active_decode_blocks_threshold == 0.5);
    /* out_www_authenticate is optional. */
    CHECK(auth_call(m, auth, "POST", NULL, set, NULL, resp, sizeof resp) == 401);
    /* NULL auth: no authentication, as lg_monitor_handle_busy_threshold(). */
    CHECK(auth_call(m, NULL, "POST", NULL, set, &challenge, resp, sizeof resp) == 200);
    CHECK(challenge == NULL && contains(resp, "\"version\":2"));
    lg_control_auth_free(auth);

    /* protect_reads: every request needs the token. */
    OK(lg_control_auth_new(S("s3cret"), true, &auth));
    CHECK(auth_call(m, auth, "GET", NULL, "", &challenge, resp, sizeof resp) == 401);
    CHECK(challenge != NULL && contains(resp, "missing bearer token"));
    CHECK(auth_call(m, auth, "POST", "Bearer nope", read, &challenge, resp, sizeof resp) == 401);
    CHECK(contains(resp, "invalid bearer token"));
    CHECK(auth_call(m, auth, "GET", "Bearer s3cret", "", &challenge, resp, sizeof resp) == 200);

    /* The 401 answer fits any buffer rule: too small still reports it. */
    char tiny[4];
    uint16_t status = 0;
    size_t needed = 0;
    challenge = NULL;
    lg_http_headers h;
    EXPECT(lg_monitor_handle_busy_threshold_auth(m, auth, S("GET"), NULL, 0, NULL, 0, NULL, 0,
                                                 &status, &h, tiny, sizeof tiny, &needed),
           LG_BUFFER_TOO_SMALL);
    CHECK(status == 401 && h.www_authenticate != NULL && needed > sizeof tiny);

    /* Bad arguments. */
    INVALID(lg_monitor_handle_busy_threshold_auth(NULL, auth, S("GET"), NULL, 0, NULL, 0, NULL, 0,
                                                  &status, &h, resp, sizeof resp,
                                                  &needed));
    INVALID(lg_monitor_handle_busy_threshold_auth(m, auth, S("GET"), NULL, 0, NULL, 3, NULL, 0,
                                                  &status, &h, resp, sizeof resp,
                                                  &needed));
    INVALID(lg_monitor_handle_busy_threshold_auth(m, auth, S("GET"), NULL, 0, "\xc3\x28", 2,
                                                  NULL, 0, &status, &h, resp,
                                                  sizeof resp, &needed));
    INVALID(lg_monitor_handle_busy_threshold_auth(m, auth, S("GET"), NULL, 0, NULL, 0, NULL, 0,
                                                  NULL, &h, resp, sizeof resp,
                                                  &needed));
    lg_control_auth_free(auth);

    lg_control_auth *bad = NULL;
    INVALID(lg_control_auth_new("", 0, false, &bad));
    CHECK(last_error_contains("must not be empty"));
    INVALID(lg_control_auth_new(NULL, 0, false, &bad));
    INVALID(lg_control_auth_new(S("two words"), false, &bad));
    CHECK(last_error_contains("visible ASCII"));
    INVALID(lg_control_auth_new(NULL, 5, false, &bad));
    INVALID(lg_control_auth_new(S("s3cret"), false, NULL));
    CHECK(bad == NULL); /* written only on success */
    lg_control_auth_free(NULL);
    lg_monitor_free(m);
}
