//! The HTTP side: hyper 1's HTTP/1.1 server connections on one tokio
//! thread (the ranks step on threads of their own), and the routes.
//!
//! | route | answer |
//! |---|---|
//! | `POST /v1/chat/completions`, `POST /v1/completions` | the emulator's tokens, streamed or in one body |
//! | `GET /metrics` | vLLM's gauges and counters per rank ([`metrics`]) |
//! | `GET /health` | 200, empty, as vLLM |
//! | `GET /v1/models` | the served model |
//!
//! A completion request goes to the rank its `x-data-parallel-rank` header
//! names (vLLM's header for routing by an external load balancer), else to
//! the rank holding the fewest requests. Bodies over [`MAX_BODY`] are
//! refused with 413, malformed ones with 400, both with an OpenAI-style
//! error body; a prompt and output that never fit in a rank's KV cache are
//! refused with 400 as vLLM refuses a request over its model length.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, ALLOW, CACHE_CONTROL, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::TcpListener;

use super::openai::{self, Api, ApiError, Writer};
use super::rank::Rank;
use super::stream::{collect, EventStream, Ticket};
use super::{metrics, Options};
use crate::engine::EngineRequest;

/// Largest request body read.
pub const MAX_BODY: usize = 16 << 20;

/// The header naming the rank a request must run on.
pub const RANK_HEADER: &str = "x-data-parallel-rank";

type Reply = Response<Either<Full<Bytes>, EventStream>>;

/// What every connection shares: the options and the ranks.
#[derive(Debug)]
pub struct Shared {
    options: Options,
    ranks: Vec<Arc<Rank>>,
    next_id: AtomicU64,
}

impl Shared {
    /// The server state over `ranks` (rank `i` at index `i`).
    pub fn new(options: Options, ranks: Vec<Arc<Rank>>) -> Self {
        Self {
            options,
            ranks,
            next_id: AtomicU64::new(1),
        }
    }

    /// The ranks.
    pub fn ranks(&self) -> &[Arc<Rank>] {
        &self.ranks
    }
}

/// Accepts connections on `listener` until the process ends, each served
/// on its own task.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors and the like: wait, and go on.
                eprintln!("engine: accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(route(&shared, req).await) }
            });
            // A client that goes away mid-answer is an error here; its
            // request was aborted when hyper dropped the body.
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn route(shared: &Shared, req: Request<Incoming>) -> Reply {
    let path = req.uri().path().to_owned();
    let api = match path.as_str() {
        "/v1/chat/completions" => Some(Api::Chat),
        "/v1/completions" => Some(Api::Completions),
        _ => None,
    };
    let method = req.method().clone();
    match (api, path.as_str()) {
        (Some(api), _) if method == Method::POST => complete(shared, api, req).await,
        (Some(_), _) => not_allowed("POST"),
        (None, "/metrics" | "/health" | "/v1/models")
            if method != Method::GET && method != Method::HEAD =>
        {
            not_allowed("GET, HEAD")
        }
        (None, "/metrics") => {
            let snapshots: Vec<_> = shared.ranks.iter().map(|r| r.snapshot()).collect();
            let text = metrics::render(&shared.options.model, &shared.options.engine, &snapshots);
            full(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                text,
            )
        }
        (None, "/health") => full(StatusCode::OK, "text/plain", String::new()),
        (None, "/v1/models") => {
            let model = &shared.options.model;
            let body = json!({
                "object": "list",
                "data": [{"id": model, "object": "model", "owned_by": "loadgate-lab",
                          "root": model, "max_model_len": max_model_len(shared)}],
            });
            full(StatusCode::OK, "application/json", body.to_string())
        }
        _ => error(ApiError::new(
            404,
            "NotFoundError",
            format!("no route for {path}"),
            None,
        )),
    }
}

/// Tokens one request may hold: a rank's whole KV cache.
fn max_model_len(shared: &Shared) -> u64 {
    let e = &shared.options.engine;
    u64::from(e.num_gpu_blocks) * u64::from(e.block_size)
}

async fn complete(shared: &Shared, api: Api, req: Request<Incoming>) -> Reply {
    let rank = match pick_rank(shared, &req) {
        Ok(r) => r.clone(),
        Err(e) => return error(e),
    };
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return match e.downcast::<http_body_util::LengthLimitError>() {
                Ok(_) => error(ApiError::new(
                    413,
                    "BadRequestError",
                    format!("the body is over {MAX_BODY} bytes"),
                    None,
                )),
                // The client went away while sending.
                Err(e) => error(ApiError::bad_request(
                    format!("cannot read the body: {e}"),
                    None,
                )),
            };
        }
    };
    let o = &shared.options;
    let ask = match openai::parse(api, &body, &o.model, o.default_max_tokens) {
        Ok(a) => a,
        Err(e) => return error(e),
    };
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let request = EngineRequest {
        id,
        prompt: ask.prompt,
        output: ask.output,
    };
    let Some(tokens) = rank.submit(request) else {
        let limit = max_model_len(shared);
        let asked = u64::from(ask.prompt) + u64::from(ask.output);
        return error(ApiError::bad_request(
            format!(
                "This model's maximum context length is {limit} tokens. However, you requested \
                 {asked} tokens ({} in the messages, {} in the completion). Please reduce the \
                 length of the messages or completion.",
                ask.prompt, ask.output
            ),
            None,
        ));
    };
    let ticket = Ticket::new(rank, id);
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let writer = Writer::new(api, id, &o.model, created, ask.prompt);
    if ask.stream {
        let body = EventStream::new(tokens, ticket, writer, ask.include_usage);
        let mut reply = Response::new(Either::Right(body));
        let h = reply.headers_mut();
        h.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream; charset=utf-8"),
        );
        h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        return reply;
    }
    match collect(tokens, ticket).await {
        Some(generated) => full(StatusCode::OK, "application/json", writer.whole(generated)),
        None => error(ApiError::new(
            500,
            "InternalServerError",
            "the request left the engine before its last token",
            None,
        )),
    }
}

/// The rank `req` asks for by [`RANK_HEADER`], else the least loaded.
fn pick_rank<'a>(shared: &'a Shared, req: &Request<Incoming>) -> Result<&'a Arc<Rank>, ApiError> {
    if let Some(v) = req.headers().get(RANK_HEADER) {
        let n = shared.ranks.len();
        return v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .and_then(|i| shared.ranks.get(i))
            .ok_or_else(|| {
                ApiError::bad_request(
                    format!("{RANK_HEADER} must be a rank from 0 to {}", n - 1),
                    None,
                )
            });
    }
    Ok(shared
        .ranks
        .iter()
        .min_by_key(|r| r.len())
        .expect("an engine has at least one rank"))
}

fn full(status: StatusCode, content_type: &'static str, body: String) -> Reply {
    let mut reply = Response::new(Either::Left(Full::new(Bytes::from(body))));
    *reply.status_mut() = status;
    reply
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    reply
}

fn error(e: ApiError) -> Reply {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    full(status, "application/json", e.body)
}

fn not_allowed(allow: &'static str) -> Reply {
    let mut reply = error(ApiError::new(
        405,
        "MethodNotAllowedError",
        format!("method not allowed; use {allow}"),
        None,
    ));
    reply
        .headers_mut()
        .insert(ALLOW, HeaderValue::from_static(allow));
    reply
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpStream};
    use std::time::{Duration, Instant};

    use super::*;
    use crate::serve::flags::{self, Command};

    /// A server of `args` on a loopback port, on a thread of its own for the
    /// rest of the test process.
    fn start(args: &[&str]) -> (SocketAddr, Arc<Shared>) {
        let mut all = vec!["--model", "m", "--port", "0", "--speedup-ratio", "100"];
        all.extend_from_slice(args);
        let Command::Serve(options) = flags::parse(all).unwrap() else {
            panic!("help")
        };
        let ranks = (0..options.data_parallel_size)
            .map(|i| Rank::start(i, options.engine, None).unwrap())
            .collect();
        let shared = Arc::new(Shared::new(*options, ranks));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let serving = shared.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(
                async move { serve(TcpListener::from_std(listener).unwrap(), serving).await },
            );
        });
        (addr, shared)
    }

    /// Sends `body` to `path` over HTTP/1.0 (the answer ends with the
    /// connection) and returns the open connection.
    fn send(addr: SocketAddr, method: &str, path: &str, body: &str) -> TcpStream {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let req = format!(
            "{method} {path} HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).unwrap();
        s
    }

    fn answer(addr: SocketAddr, method: &str, path: &str, body: &str) -> String {
        let mut out = String::new();
        send(addr, method, path, body)
            .read_to_string(&mut out)
            .unwrap();
        out
    }

    fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ok() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn streams_every_token_then_done() {
        let (addr, _) = start(&["--data-parallel-size", "2"]);
        let body = r#"{"model":"m","messages":[{"role":"user","content":"a b c"}],"max_tokens":20,"stream":true}"#;
        let out = answer(addr, "POST", "/v1/chat/completions", body);
        assert!(out.starts_with("HTTP/1.0 200"), "{out}");
        assert!(out.contains("content-type: text/event-stream"), "{out}");
        assert_eq!(out.matches(r#""delta":{"content":" token"}"#).count(), 20);
        assert_eq!(out.matches(r#""finish_reason":"length""#).count(), 1);
        assert!(out.ends_with("data: [DONE]\n\n"), "{out}");
        let out = answer(
            addr,
            "POST",
            "/v1/completions",
            r#"{"prompt":"x","max_tokens":3}"#,
        );
        assert!(out.contains(r#""text":" token token token""#), "{out}");
        let metrics = answer(addr, "GET", "/metrics", "");
        assert!(metrics.contains("vllm:generation_tokens_total{engine=\"1\",model_name=\"m\"}"));
    }

    #[test]
    fn a_client_that_leaves_is_aborted() {
        let (addr, shared) = start(&[]);
        let body = r#"{"prompt":"x","max_tokens":300000,"stream":true}"#;
        let mut s = send(addr, "POST", "/v1/completions", body);
        let mut first = [0u8; 64];
        s.read_exact(&mut first).unwrap();
        assert!(!shared.ranks()[0].is_empty());
        drop(s);
        wait_until("the request left the rank", || shared.ranks()[0].is_empty());
        assert_eq!(shared.ranks()[0].snapshot().counters.aborted, 1);
    }

    #[test]
    fn bad_requests_get_openai_errors() {
        let (addr, shared) = start(&["--num-gpu-blocks-override", "10"]);
        for (method, path, body, status) in [
            ("POST", "/v1/chat/completions", "{", "400"),
            (
                "POST",
                "/v1/completions",
                r#"{"prompt":"x","max_tokens":1000}"#,
                "400",
            ),
            (
                "POST",
                "/v1/completions",
                r#"{"model":"n","prompt":"x"}"#,
                "404",
            ),
            ("GET", "/v1/completions", "", "405"),
            ("GET", "/nowhere", "", "404"),
        ] {
            let out = answer(addr, method, path, body);
            assert!(out.starts_with(&format!("HTTP/1.0 {status}")), "{out}");
            assert!(out.contains(r#"{"error":{"code":"#), "{out}");
        }
        assert_eq!(shared.ranks()[0].snapshot().counters.requests, 0);
        assert!(answer(addr, "GET", "/health", "").starts_with("HTTP/1.0 200"));
    }
}
