//! The `engine` binary's command line. Engine parameters are the flags vLLM
//! and Dynamo's mocker take, with the same names, so that a command line
//! written for one of them starts an emulated engine of the same shape.
//!
//! No argument-parsing crate: the flags are few, every one takes a value,
//! and each refusal names the flag and what it needs.

use std::net::IpAddr;

use loadgate::cluster::PublisherConfig;

use crate::engine::EngineConfig;

/// Output tokens of a request that names no `max_tokens`.
pub const DEFAULT_MAX_TOKENS: u32 = 128;

/// Most data-parallel ranks one engine runs (one thread each).
pub const MAX_DATA_PARALLEL_SIZE: u32 = 64;

/// The flags, with what each is for.
pub const USAGE: &str = "\
usage: engine --model NAME [--port P] [flags]

Serves the lab's continuous-batching engine emulator over HTTP:
OpenAI-compatible /v1/chat/completions and /v1/completions (streamed or
not), vLLM-format /metrics, /health and /v1/models.

  --model NAME                    served model name (required)
  --host ADDR                     address to bind (default 127.0.0.1)
  --port P                        port to bind (default 8000; 0: any free
                                  port, printed at start)
  --max-num-seqs N                most requests in a rank's running batch (256)
  --max-num-batched-tokens N      token budget of one step (8192)
  --block-size N                  tokens per KV block (16)
  --num-gpu-blocks-override N     KV blocks per rank (25000)
  --data-parallel-size N          ranks, each with its own scheduler (1)
  --speedup-ratio X               steps run X times faster than modelled (1)
  --default-max-tokens N          output tokens when a request names none (128)
  --nats URL                      publish each rank's load to this NATS server
  --namespace NS                  subject namespace of those reports (default)
  --worker-id ID                  worker id in those reports (default: the port)
  --dynamo-endpoint COMP.ENDP     publish Dynamo's event-plane envelope on
                                  that component's endpoint instead of
                                  loadgate's own messages
  -h, --help                      this text
";

/// A parsed and checked command line.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// `--model`.
    pub model: String,
    /// `--host`.
    pub host: IpAddr,
    /// `--port` (0: any free port).
    pub port: u16,
    /// Each rank's shape.
    pub engine: EngineConfig,
    /// `--data-parallel-size`.
    pub data_parallel_size: u32,
    /// `--default-max-tokens`.
    pub default_max_tokens: u32,
    /// `--nats`, with where to publish.
    pub nats: Option<NatsOptions>,
}

/// Where and how load reports are published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsOptions {
    /// `--nats`.
    pub url: String,
    /// `--namespace`.
    pub namespace: String,
    /// `--worker-id`; `None`: the port the server is bound to.
    pub worker_id: Option<u64>,
    /// `--dynamo-endpoint`, split into component and endpoint.
    pub dynamo: Option<(String, String)>,
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Serve.
    Serve(Box<Options>),
    /// Print [`USAGE`].
    Help,
}

/// Parses the arguments after the program name. `Err` says what is wrong,
/// in one line.
pub fn parse<I, S>(args: I) -> Result<Command, String>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let mut model = None;
    let mut host: IpAddr = [127, 0, 0, 1].into();
    let mut port: u16 = 8000;
    let mut engine = EngineConfig::default();
    let mut data_parallel_size = 1u32;
    let mut default_max_tokens = DEFAULT_MAX_TOKENS;
    let mut nats_url = None;
    let mut namespace = None;
    let mut worker_id = None;
    let mut dynamo = None;

    let mut args = args.into_iter().map(Into::into);
    while let Some(arg) = args.next() {
        if arg == "-h" || arg == "--help" {
            return Ok(Command::Help);
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
            _ => (arg.clone(), None),
        };
        if !flag.starts_with("--") {
            return Err(format!("unexpected argument {arg:?} (flags start with --)"));
        }
        let value = match inline {
            Some(v) => v,
            None => args.next().ok_or_else(|| format!("{flag} needs a value"))?,
        };
        let v = value.as_str();
        match flag.as_str() {
            "--model" => model = Some(v.to_owned()),
            "--host" => {
                host = v
                    .parse()
                    .map_err(|_| format!("--host {v:?} is not an IP address"))?
            }
            "--port" => port = number(&flag, v)?,
            "--max-num-seqs" => engine.max_num_seqs = number(&flag, v)?,
            "--max-num-batched-tokens" => engine.max_num_batched_tokens = number(&flag, v)?,
            "--block-size" => engine.block_size = number(&flag, v)?,
            "--num-gpu-blocks-override" => engine.num_gpu_blocks = number(&flag, v)?,
            "--speedup-ratio" => engine.speedup_ratio = number(&flag, v)?,
            "--data-parallel-size" => data_parallel_size = number(&flag, v)?,
            "--default-max-tokens" => default_max_tokens = number(&flag, v)?,
            "--nats" => nats_url = Some(v.to_owned()),
            "--namespace" => namespace = Some(v.to_owned()),
            "--worker-id" => worker_id = Some(number(&flag, v)?),
            "--dynamo-endpoint" => {
                let (c, e) = v
                    .split_once('.')
                    .filter(|(c, e)| !c.is_empty() && !e.is_empty() && !e.contains('.'))
                    .ok_or_else(|| format!("--dynamo-endpoint {v:?} must be COMPONENT.ENDPOINT"))?;
                dynamo = Some((c.to_owned(), e.to_owned()));
            }
            _ => return Err(format!("unknown flag {flag} (see --help)")),
        }
    }

    let model = model.ok_or("--model is required (the served model name)")?;
    if model.is_empty() {
        return Err("--model must not be empty".into());
    }
    if let Some(why) = engine.invalid() {
        return Err(format!("invalid engine: {}", flag_words(why)));
    }
    if !(1..=MAX_DATA_PARALLEL_SIZE).contains(&data_parallel_size) {
        return Err(format!(
            "--data-parallel-size must be from 1 to {MAX_DATA_PARALLEL_SIZE}"
        ));
    }
    if default_max_tokens == 0 {
        return Err("--default-max-tokens must be at least 1".into());
    }
    let nats = match nats_url {
        None => {
            if namespace.is_some() || worker_id.is_some() || dynamo.is_some() {
                return Err("--namespace, --worker-id and --dynamo-endpoint need --nats".into());
            }
            None
        }
        Some(url) => {
            let nats = NatsOptions {
                url,
                namespace: namespace.unwrap_or_else(|| "default".into()),
                worker_id,
                dynamo,
            };
            // The declaration and subjects are checked now, before binding.
            nats.publisher_config(&model, 0, &engine, data_parallel_size)
                .validate()
                .map_err(|e| format!("--nats: {e}"))?;
            loadgate::cluster::Subjects::new(&nats.namespace)
                .map_err(|e| format!("--namespace: {e}"))?;
            Some(nats)
        }
    };
    Ok(Command::Serve(Box::new(Options {
        model,
        host,
        port,
        engine,
        data_parallel_size,
        default_max_tokens,
        nats,
    })))
}

impl NatsOptions {
    /// The publisher's declaration of a worker whose server is on `port`.
    pub fn publisher_config(
        &self,
        model: &str,
        port: u16,
        engine: &EngineConfig,
        data_parallel_size: u32,
    ) -> PublisherConfig {
        let mut config = PublisherConfig::new(self.worker_id.unwrap_or(u64::from(port)), model);
        config.dp_size = data_parallel_size;
        config.kv_total_blocks = Some(u64::from(engine.num_gpu_blocks));
        config.max_num_batched_tokens = Some(u64::from(engine.max_num_batched_tokens));
        if let Some((component, endpoint)) = &self.dynamo {
            config.format = loadgate::cluster::WireFormat::Dynamo {
                namespace: self.namespace.clone(),
                component: component.clone(),
                endpoint: endpoint.clone(),
            };
        }
        config
    }
}

fn number<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.parse()
        .map_err(|_| format!("{flag} {v:?} is not a valid number"))
}

/// The engine's own message, with its field names as the flags spell them.
fn flag_words(why: &str) -> String {
    why.replace("max_num_seqs", "--max-num-seqs")
        .replace("max_num_batched_tokens", "--max-num-batched-tokens")
        .replace("block_size", "--block-size")
        .replace("num_gpu_blocks", "--num-gpu-blocks-override")
        .replace("speedup_ratio", "--speedup-ratio")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve(args: &[&str]) -> Options {
        match parse(args.iter().copied()).unwrap() {
            Command::Serve(o) => *o,
            Command::Help => panic!("help"),
        }
    }

    fn refused(args: &[&str]) -> String {
        parse(args.iter().copied()).unwrap_err()
    }

    #[test]
    fn engine_flags_are_vllm_and_mocker_names() {
        let o = serve(&[
            "--model",
            "m",
            "--port=0",
            "--max-num-seqs",
            "4",
            "--max-num-batched-tokens",
            "512",
            "--block-size",
            "32",
            "--num-gpu-blocks-override",
            "100",
            "--data-parallel-size",
            "2",
            "--speedup-ratio",
            "10",
        ]);
        assert_eq!((o.model.as_str(), o.port), ("m", 0));
        assert_eq!(o.engine.max_num_seqs, 4);
        assert_eq!(o.engine.max_num_batched_tokens, 512);
        assert_eq!(o.engine.block_size, 32);
        assert_eq!(o.engine.num_gpu_blocks, 100);
        assert_eq!(o.engine.speedup_ratio, 10.0);
        assert_eq!(o.data_parallel_size, 2);
        assert_eq!(o.nats, None);
    }

    #[test]
    fn nats_defaults_and_declaration() {
        let o = serve(&["--model", "m", "--nats", "nats://127.0.0.1:4222"]);
        let nats = o.nats.unwrap();
        assert_eq!(nats.namespace, "default");
        let c = nats.publisher_config("m", 8123, &o.engine, 1);
        assert_eq!((c.worker_id, c.kv_total_blocks), (8123, Some(25_000)));
        let o = serve(&[
            "--model",
            "m",
            "--nats",
            "u",
            "--worker-id",
            "7",
            "--dynamo-endpoint",
            "backend.generate",
        ]);
        let c = o.nats.unwrap().publisher_config("m", 1, &o.engine, 1);
        assert_eq!(c.worker_id, 7);
        assert!(matches!(
            c.format,
            loadgate::cluster::WireFormat::Dynamo { .. }
        ));
    }

    #[test]
    fn bad_command_lines_say_what_is_wrong() {
        assert!(refused(&[]).contains("--model is required"));
        assert!(refused(&["--model", "m", "--speedup-ratio", "0"]).contains("--speedup-ratio"));
        assert!(refused(&["--model", "m", "--max-num-seqs", "0"]).contains("--max-num-seqs"));
        assert!(refused(&["--model", "m", "--block-size", "x"]).contains("not a valid number"));
        assert!(refused(&["--model", "m", "--port", "70000"]).contains("--port"));
        assert!(refused(&["--model", "m", "--frobnicate", "1"]).contains("unknown flag"));
        assert!(refused(&["--model", "m", "--max-num-seqs"]).contains("needs a value"));
        assert!(refused(&["--model", "m", "--namespace", "x"]).contains("need --nats"));
        assert!(refused(&["--model", "m", "--data-parallel-size", "0"]).contains("from 1"));
        let bad_ns = ["--model", "m", "--nats", "u", "--namespace", "a.b"];
        assert!(refused(&bad_ns).contains("--namespace"));
        let bad_ep = ["--model", "m", "--nats", "u", "--dynamo-endpoint", "x"];
        assert!(refused(&bad_ep).contains("COMPONENT.ENDPOINT"));
        assert_eq!(parse(["--help"]).unwrap(), Command::Help);
    }
}
