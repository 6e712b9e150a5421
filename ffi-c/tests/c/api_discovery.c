/*
 * The C11 API test (see api.c): workers the monitor learns by itself, by
 * scraping an engine's /metrics (a fake vLLM engine on a loopback socket)
 * and from Dynamo's discovery store (its file backend, and etcd when
 * LG_ETCD_URL names one).
 */
#define _POSIX_C_SOURCE 200809L

#include "check.h"

#include <pthread.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* ----- engine scraping ---------------------------------------------------- */

/* A fake vLLM engine: one connection at a time, every request answered with
 * the same /metrics text (keep-alive HTTP/1.1): 9 waiting, or none. */
#define VLLM_TEXT(waiting)                                                          \
    "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n" \
    "# TYPE vllm:num_requests_waiting gauge\n"                                      \
    "vllm:num_requests_waiting{model_name=\"llama\",engine=\"0\"} " waiting "\n"   \
    "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"  \
    "# TYPE vllm:kv_cache_usage_perc gauge\n"                                       \
    "vllm:kv_cache_usage_perc{model_name=\"llama\",engine=\"0\"} 0.5\n"            \
    "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"       \
    "# TYPE vllm:cache_config_info gauge\n"                                         \
    "vllm:cache_config_info{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"100\"} 1.0\n"
static const char VLLM_METRICS[] = VLLM_TEXT("9.0");
static const char VLLM_IDLE[] = VLLM_TEXT("0.0");

struct fake_engine {
    const char *body;
    size_t body_len;
    char url[64];
    size_t url_len;
    int listen_fd;
    int conn_fd;
    pthread_t thread;
};

static void *fake_engine_run(void *arg) {
    struct fake_engine *e = arg;
    for (;;) {
        int fd = accept(e->listen_fd, NULL, NULL);
        if (fd < 0) {
            return NULL;
        }
        e->conn_fd = fd;
        char buf[4096];
        size_t have = 0;
        for (;;) {
            ssize_t n = read(fd, buf + have, sizeof buf - 1 - have);
            if (n <= 0) {
                break;
            }
            have += (size_t)n;
            buf[have] = '\0';
            char *end = strstr(buf, "\r\n\r\n");
            if (end == NULL) {
                continue;
            }
            char head[128];
            int len = snprintf(head, sizeof head,
                               "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: %zu\r\n\r\n",
                               e->body_len);
            /* MSG_NOSIGNAL: a scraper that gave up (its timeout, under
             * valgrind's slow clock) must not kill this process with SIGPIPE. */
            if (send(fd, head, (size_t)len, MSG_NOSIGNAL) != len ||
                send(fd, e->body, e->body_len, MSG_NOSIGNAL) != (ssize_t)e->body_len) {
                break;
            }
            size_t used = (size_t)(end + 4 - buf);
            memmove(buf, buf + used, have - used);
            have -= used;
        }
        close(fd);
    }
}

/* Starts a fake engine answering with `body` on a loopback port (its URL in
 * e->url). */
static void start_engine(struct fake_engine *e, const char *body, size_t body_len) {
    e->body = body;
    e->body_len = body_len;
    e->conn_fd = -1;
    e->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(e->listen_fd >= 0);
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(bind(e->listen_fd, (struct sockaddr *)&addr, sizeof addr) == 0);
    socklen_t addr_len = sizeof addr;
    CHECK(getsockname(e->listen_fd, (struct sockaddr *)&addr, &addr_len) == 0);
    CHECK(listen(e->listen_fd, 4) == 0);
    CHECK(pthread_create(&e->thread, NULL, fake_engine_run, e) == 0);
    int len = snprintf(e->url, sizeof e->url, "http://127.0.0.1:%d/metrics", ntohs(addr.sin_port));
    CHECK(len > 0 && (size_t)len < sizeof e->url);
    e->url_len = (size_t)len;
}

static void stop_engine(struct fake_engine *e) {
    shutdown(e->listen_fd, SHUT_RDWR);
    close(e->listen_fd);
    pthread_join(e->thread, NULL);
}

/* A monitor scraping `e` every 10 ms as worker 5, its engine's seats
 * declared as `seats` (0: not known), once the first scrape registered it
 * (a limit for hangs only). */
static lg_monitor *scraping(const struct fake_engine *e, uint64_t seats, lg_scrape **s) {
    lg_monitor *m = NULL;
    OK(lg_monitor_new(NULL, &m));
    OK(lg_monitor_scrape(m, NULL, 0, 5, e->url, e->url_len, LG_ENGINE_VLLM, 10, 0, seats, s));
    CHECK(*s != NULL);
    bool busy = true;
    for (int i = 0; i < 6000 && lg_monitor_is_busy(m, 5, &busy) != LG_OK; i++) {
        sleep_ms(5);
    }
    OK(lg_monitor_is_busy(m, 5, &busy));
    return m;
}

void test_scrape(void) {
    struct fake_engine e;
    start_engine(&e, VLLM_METRICS, sizeof VLLM_METRICS - 1);
    const char *url = e.url;
    size_t url_len = e.url_len;
    lg_scrape *s = NULL;
    lg_monitor *m = scraping(&e, 0, &s);
    bool busy = true;
    OK(lg_monitor_is_busy(m, 5, &busy));
    CHECK(!busy);
    lg_threshold_update u;
    lg_thresholds t;
    memset(&u, 0, sizeof u);
    u.has_waiting_requests_threshold = true;
    u.waiting_requests_threshold = 8;
    OK(lg_monitor_set_thresholds(m, S("llama"), &u, &t)); /* the model_name label */
    OK(lg_monitor_is_busy(m, 5, &busy));
    CHECK(busy); /* 9 waiting > 8 */
    lg_scrape_stats st;
    memset(&st, 0, sizeof st);
    for (int i = 0; i < 6000; i++) {
        OK(lg_scrape_get_stats(s, &st));
        if (st.scrapes >= 3) {
            break;
        }
        sleep_ms(5);
    }
    CHECK(st.scrapes >= 3 && st.errors == 0 && st.connections == 1 && st.registered);
    /* The scrape's outcomes are in the monitor's metrics. */
    char text[16384];
    size_t needed = 0;
    OK(lg_monitor_metrics(m, text, sizeof text, &needed));
    CHECK(strstr(text, "# TYPE dynamo_frontend_scrapes_total counter") != NULL);
    CHECK(strstr(text, "dynamo_frontend_scrapes_total{worker_id=\"5\",outcome=\"http\"} 0") != NULL);
    CHECK(strstr(text, "dynamo_frontend_scrape_registered{worker_id=\"5\"} 1") != NULL);
    CHECK(strstr(text, "dynamo_frontend_scrape_duration_seconds_count{worker_id=\"5\"}") != NULL);

    lg_scrape *bad = NULL;
    INVALID(lg_monitor_scrape(m, NULL, 0, 6, url, url_len, 7, 0, 0, 0, &bad));
    CHECK(last_error_contains("LG_ENGINE_VLLM"));
    INVALID(lg_monitor_scrape(m, NULL, 0, 6, S("https://x/metrics"), LG_ENGINE_SGLANG, 0, 0, 0, &bad));
    CHECK(last_error_contains("scheme"));
    INVALID(lg_monitor_scrape(NULL, NULL, 0, 6, url, url_len, LG_ENGINE_VLLM, 0, 0, 0, &bad));
    INVALID(lg_monitor_scrape(m, NULL, 0, 6, url, url_len, LG_ENGINE_VLLM, 0, 0, 0, NULL));
    INVALID(lg_monitor_scrape(m, NULL, 3, 6, url, url_len, LG_ENGINE_VLLM, 0, 0, 0, &bad));
    CHECK(bad == NULL);
    INVALID(lg_scrape_get_stats(NULL, &st));
    INVALID(lg_scrape_get_stats(s, NULL));

    lg_scrape_free(s);
    EXPECT(lg_monitor_is_busy(m, 5, &busy), LG_NOT_FOUND); /* removed with its scrape */
    lg_scrape_free(NULL);
    lg_monitor_free(m);
    stop_engine(&e);
}

/* vLLM's metrics carry no seat count: a scrape declares the engine's, and
 * with an SLO the worker holds 3, which no probe passes, though every
 * scrape shows none waiting; busy at the fourth booking. */
void test_scrape_declared_seats(void) {
    struct fake_engine e;
    start_engine(&e, VLLM_IDLE, sizeof VLLM_IDLE - 1);
    lg_scrape *s = NULL;
    lg_monitor *m = scraping(&e, 3, &s);
    lg_booking *held[8] = {NULL};
    size_t n = 0;
    CHECK(slo_bookings_until_busy(m, 5, held, &n) == 4);
    while (n > 0) lg_booking_free(held[--n]);
    lg_scrape_free(s);
    lg_monitor_free(m);
    stop_engine(&e);
}


/* ----- workers from Dynamo's file discovery store --------------------------- */

/* One Dynamo 1.6.1 model card (the fields loadgate reads, and one it does
 * not), for instance 255 with two ranks of 64 blocks. */
static const char CARD[] =
    "{\"type\":\"Model\",\"namespace\":\"dynamo\",\"component\":\"backend\","
    "\"endpoint\":\"generate\",\"instance_id\":255,\"card_json\":{\"display_name\":\"tiny\","
    "\"runtime_config\":{\"total_kv_blocks\":64,\"max_num_batched_tokens\":8192,"
    "\"data_parallel_start_rank\":0,\"data_parallel_size\":2,\"enable_eagle\":false}}}";

void test_discovery(void) {
    char root[] = "/tmp/loadgate-c-discovery-XXXXXX";
    CHECK(mkdtemp(root) != NULL);
    char dir[256], card[512];
    snprintf(dir, sizeof dir, "%s/v1", root);
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(dir, sizeof dir, "%s/v1/mdc", root);
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(card, sizeof card, "%s/dynamo%%2Fbackend%%2Fgenerate%%2Fff", dir);
    FILE *f = fopen(card, "w");
    CHECK(f != NULL);
    CHECK(fwrite(CARD, 1, sizeof CARD - 1, f) == sizeof CARD - 1);
    CHECK(fclose(f) == 0);

    lg_monitor *m = NULL;
    OK(lg_monitor_new(NULL, &m));
    lg_discovery *d = NULL;
    OK(lg_monitor_discover_dynamo(m, NULL, 0, root, strlen(root), NULL, 0, NULL, 0, 10, 0, &d));
    CHECK(d != NULL);
    /* Registered when the call returns: two ranks of 64 blocks. */
    bool busy = true;
    OK(lg_monitor_is_busy(m, 255, &busy));
    lg_load_report r;
    memset(&r, 0, sizeof r);
    r.has_kv_used_blocks = true;
    r.kv_used_blocks = 33;
    OK(lg_monitor_report(m, 255, 0, &r));
    OK(lg_monitor_report(m, 255, 1, &r));
    EXPECT(lg_monitor_report(m, 255, 2, &r), LG_NOT_FOUND);
    lg_threshold_update u;
    lg_thresholds t;
    memset(&u, 0, sizeof u);
    u.has_active_decode_blocks_threshold = true;
    u.active_decode_blocks_threshold = 0.5;
    OK(lg_monitor_set_thresholds(m, S("tiny"), &u, &t));
    OK(lg_monitor_is_busy(m, 255, &busy));
    CHECK(busy); /* 33 of 64 on both ranks */
    lg_discovery_stats st;
    OK(lg_discovery_get_stats(d, &st));
    CHECK(st.workers == 1 && st.workers_added == 1 && st.scans >= 1);
    CHECK(st.refused_malformed == 0 && st.refused_registration == 0);

    /* A deleted card takes its worker with it (a limit for hangs only). */
    CHECK(unlink(card) == 0);
    for (int i = 0; i < 6000 && lg_monitor_is_busy(m, 255, &busy) == LG_OK; i++) {
        sleep_ms(5);
    }
    EXPECT(lg_monitor_is_busy(m, 255, &busy), LG_NOT_FOUND);
    OK(lg_discovery_get_stats(d, &st));
    CHECK(st.workers == 0 && st.workers_removed == 1);

    lg_discovery *bad = NULL;
    INVALID(lg_monitor_discover_dynamo(NULL, NULL, 0, root, strlen(root), NULL, 0, NULL, 0, 0, 0,
                                       &bad));
    INVALID(lg_monitor_discover_dynamo(m, S(""), root, strlen(root), NULL, 0, NULL, 0, 0, 0, &bad));
    CHECK(last_error_contains("namespace"));
    INVALID(lg_monitor_discover_dynamo(m, NULL, 3, root, strlen(root), NULL, 0, NULL, 0, 0, 0,
                                       &bad));
    INVALID(lg_monitor_discover_dynamo(m, NULL, 0, root, strlen(root), NULL, 0, NULL, 0, 0,
                                       LG_DISCOVERY_NO_TTL, NULL));
    CHECK(bad == NULL);
    INVALID(lg_discovery_get_stats(NULL, &st));
    INVALID(lg_discovery_get_stats(d, NULL));
    lg_discovery_free(d);
    lg_discovery_free(NULL);
    lg_monitor_free(m);
    CHECK(rmdir(dir) == 0);
    snprintf(dir, sizeof dir, "%s/v1", root);
    CHECK(rmdir(dir) == 0);
    CHECK(rmdir(root) == 0);
}

/* Learns the worker whose card ffi-c/tests/run.sh put into etcd (the card a
 * Dynamo 1.6.1 worker wrote there). */
void test_discovery_etcd_live(const char *url, uint64_t worker) {
    lg_monitor *m = NULL;
    OK(lg_monitor_new(NULL, &m));
    lg_discovery *d = NULL;
    OK(lg_monitor_discover_dynamo_etcd(m, S("dynamo"), url, strlen(url), NULL, 0, NULL, 0, NULL,
                                       0, NULL, 0, 0, &d));
    bool busy = true;
    OK(lg_monitor_is_busy(m, worker, &busy)); /* registered when the call returns */
    CHECK(!busy);
    lg_discovery_stats st;
    OK(lg_discovery_get_stats(d, &st));
    CHECK(st.workers == 1 && st.scans == 1 && st.scan_errors == 0);
    lg_discovery_free(d);
    EXPECT(lg_monitor_is_busy(m, worker, &busy), LG_NOT_FOUND); /* removed with it */

    lg_discovery *bad = NULL;
    EXPECT(lg_monitor_discover_dynamo_etcd(m, NULL, 0, S("http://127.0.0.1:1"), NULL, 0, NULL, 0,
                                           NULL, 0, NULL, 0, 300, &bad),
           LG_TRANSPORT_ERROR);
    CHECK(last_error_contains("etcd"));
    INVALID(lg_monitor_discover_dynamo_etcd(m, NULL, 0, url, strlen(url), S("root"), NULL, 0,
                                            NULL, 0, NULL, 0, 0, &bad));
    CHECK(last_error_contains("user and password"));
    INVALID(lg_monitor_discover_dynamo_etcd(m, NULL, 0, S(" , "), NULL, 0, NULL, 0, NULL, 0, NULL,
                                            0, 0, &bad));
    INVALID(lg_monitor_discover_dynamo_etcd(NULL, NULL, 0, url, strlen(url), NULL, 0, NULL, 0,
                                            NULL, 0, NULL, 0, 0, &bad));
    CHECK(bad == NULL);
    lg_monitor_free(m);
    printf("c11 api: worker %llu learned from etcd at %s\n", (unsigned long long)worker, url);
}
