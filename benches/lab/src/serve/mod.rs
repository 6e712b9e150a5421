//! The lab's engine emulator over real HTTP, so that loadgate's scrape,
//! NATS and Python frontends can be tried against engines that behave
//! like continuous-batching servers under load, on one machine.
//!
//! `cargo run --release -p loadgate-lab --bin engine -- --model NAME --port P`
//! serves OpenAI-compatible `/v1/chat/completions` and `/v1/completions`
//! (streamed as server-sent events or in one body) with the emulator's
//! timing, and vLLM-format `/metrics`. With `--nats URL` each rank's load
//! goes out through loadgate's own [`Publisher`] (loadgate's messages, or
//! Dynamo's event-plane envelope with `--dynamo-endpoint`), which a
//! loadgate `Subscriber` (`Monitor.subscribe_nats` in Python) picks up.
//!
//! * [`flags`]: the command line, named as vLLM and Dynamo's mocker name it;
//! * [`rank`]: one data-parallel rank stepping in real time;
//! * [`openai`]: the requests and answers of the OpenAI API;
//! * [`stream`]: streamed answers, and aborting a request whose client left;
//! * [`metrics`]: `/metrics` in vLLM's names;
//! * [`http`]: the server and its routes.
//!
//! [`Publisher`]: loadgate::cluster::Publisher

pub mod flags;
pub mod http;
pub mod metrics;
pub mod openai;
pub mod rank;
pub mod stream;

use std::io::Write;
use std::sync::Arc;

use loadgate::cluster::nats::NatsTransport;
use loadgate::cluster::{Publisher, Subjects};

pub use flags::{Command, NatsOptions, Options};

/// Serves `options` until the process ends. `Err` says why it could not
/// start (the address is taken, the NATS server cannot be reached).
pub fn run(options: Options) -> Result<(), String> {
    let listener = std::net::TcpListener::bind((options.host, options.port))
        .map_err(|e| format!("cannot bind {}:{}: {e}", options.host, options.port))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("cannot read the bound address: {e}"))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("cannot set the listener non-blocking: {e}"))?;

    let publisher = match &options.nats {
        None => None,
        Some(nats) => Some(Arc::new(publisher(&options, nats, addr.port())?)),
    };
    let ranks = (0..options.data_parallel_size)
        .map(|i| rank::Rank::start(i, options.engine, publisher.clone()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("cannot start a rank's thread: {e}"))?;

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let e = &options.engine;
    let banner = format!(
        "engine: serving {:?} on {addr}: {} rank(s), max_num_seqs {}, max_num_batched_tokens {}, \
         {} KV blocks of {} tokens, speedup ratio {}",
        options.model,
        options.data_parallel_size,
        e.max_num_seqs,
        e.max_num_batched_tokens,
        e.num_gpu_blocks,
        e.block_size,
        e.speedup_ratio
    );
    let shared = Arc::new(http::Shared::new(options, ranks));
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        eprintln!("{banner}");
        // The one line on stdout: scripts that asked for port 0 read it.
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "engine listening on http://{addr}");
        let _ = stdout.flush();
        drop(stdout);
        http::serve(listener, shared).await;
        Ok(())
    })
}

/// Connects to NATS and starts the publisher of a server bound to `port`.
fn publisher(options: &Options, nats: &NatsOptions, port: u16) -> Result<Publisher, String> {
    let config = nats.publisher_config(
        &options.model,
        port,
        &options.engine,
        options.data_parallel_size,
    );
    let subjects = Subjects::new(&nats.namespace).map_err(|e| format!("--namespace: {e}"))?;
    let transport = NatsTransport::connect(&nats.url).map_err(|e| format!("--nats: {e}"))?;
    eprintln!(
        "engine: publishing the load of worker {} ({} ranks) to {} in namespace {}",
        config.worker_id, config.dp_size, nats.url, nats.namespace
    );
    Publisher::spawn(config, Arc::new(transport), &subjects).map_err(|e| format!("--nats: {e}"))
}
