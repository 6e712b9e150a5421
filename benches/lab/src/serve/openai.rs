//! The OpenAI API's shapes, as vLLM serves them: reading a chat or text
//! completion request, and writing its chunks, its one-body answer and its
//! errors.
//!
//! The emulator needs two numbers from a request: its prompt length, a
//! count of the whitespace-separated words of its messages or prompt (at
//! least 1; a prompt of token ids counts its ids), and its output length,
//! `max_completion_tokens` or `max_tokens` (else the server's default).
//! Every output token is the same word, [`TOKEN_TEXT`], and every request
//! ends by length (`finish_reason: "length"`). Anything else a request
//! carries (sampling parameters, tools) is accepted and ignored.

use serde_json::{json, Map, Value};

/// The text of every generated token.
pub const TOKEN_TEXT: &str = " token";

/// Which API a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completions,
}

/// What a request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    /// The API.
    pub api: Api,
    /// Prompt tokens (at least 1).
    pub prompt: u32,
    /// Output tokens (at least 1).
    pub output: u32,
    /// Stream the answer as server-sent events.
    pub stream: bool,
    /// With `stream`: a last chunk with the usage (`stream_options`).
    pub include_usage: bool,
}

/// An error answer: status and OpenAI-style body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// The body, `{"error": {...}}`.
    pub body: String,
}

impl ApiError {
    /// A 400 saying `message` about `param`.
    pub fn bad_request(message: impl Into<String>, param: Option<&str>) -> Self {
        Self::new(400, "BadRequestError", message, param)
    }

    /// An error of `status` and OpenAI error type `kind`.
    pub fn new(status: u16, kind: &str, message: impl Into<String>, param: Option<&str>) -> Self {
        let body = json!({
            "error": {
                "message": message.into(),
                "type": kind,
                "param": param,
                "code": status,
            }
        });
        Self {
            status,
            body: body.to_string(),
        }
    }
}

/// Reads a request body of `api` for the server's `model`. `default_output`
/// is the output length of a request that names none.
pub fn parse(api: Api, body: &[u8], model: &str, default_output: u32) -> Result<Ask, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}"), None))?;
    let Value::Object(req) = value else {
        return Err(ApiError::bad_request(
            "the body must be a JSON object",
            None,
        ));
    };
    match req.get("model") {
        None | Some(Value::Null) => {}
        Some(Value::String(m)) if m == model => {}
        Some(Value::String(m)) => {
            return Err(ApiError::new(
                404,
                "NotFoundError",
                format!("The model `{m}` does not exist."),
                Some("model"),
            ))
        }
        Some(_) => {
            return Err(ApiError::bad_request(
                "model must be a string",
                Some("model"),
            ))
        }
    }
    let prompt = match api {
        Api::Chat => chat_prompt(&req)?,
        Api::Completions => text_prompt(&req)?,
    };
    let mut output = default_output;
    for name in ["max_tokens", "max_completion_tokens"] {
        match req.get(name) {
            None | Some(Value::Null) => {}
            Some(v) => {
                output = v
                    .as_u64()
                    .filter(|n| *n >= 1)
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| {
                        ApiError::bad_request(
                            format!("{name} must be an integer from 1 to {}", u32::MAX),
                            Some(name),
                        )
                    })?;
            }
        }
    }
    match req.get("n") {
        None | Some(Value::Null) => {}
        Some(v) if v.as_u64() == Some(1) => {}
        Some(_) => return Err(ApiError::bad_request("only n = 1 is supported", Some("n"))),
    }
    let stream = flag(&req, "stream")?;
    let include_usage = match req.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => flag(o, "include_usage")?,
        Some(_) => {
            return Err(ApiError::bad_request(
                "stream_options must be an object",
                Some("stream_options"),
            ))
        }
    };
    Ok(Ask {
        api,
        prompt,
        output,
        stream,
        include_usage,
    })
}

fn flag(o: &Map<String, Value>, name: &str) -> Result<bool, ApiError> {
    match o.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::bad_request(
            format!("{name} must be a boolean"),
            Some(name),
        )),
    }
}

/// Whitespace-separated words of `text`, saturating.
fn words(text: &str) -> u32 {
    u32::try_from(text.split_whitespace().count()).unwrap_or(u32::MAX)
}

fn chat_prompt(req: &Map<String, Value>) -> Result<u32, ApiError> {
    let bad = |m: &str| ApiError::bad_request(m, Some("messages"));
    let Some(Value::Array(messages)) = req.get("messages") else {
        return Err(bad("messages must be a list of messages"));
    };
    if messages.is_empty() {
        return Err(bad("messages must not be empty"));
    }
    let mut n = 0u32;
    for m in messages {
        let Value::Object(m) = m else {
            return Err(bad("each message must be an object"));
        };
        match m.get("content") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => n = n.saturating_add(words(s)),
            Some(Value::Array(parts)) => {
                for p in parts {
                    let text = p.get("text").and_then(Value::as_str);
                    match (p, text) {
                        (_, Some(t)) => n = n.saturating_add(words(t)),
                        (Value::Object(_), None) => {} // an image or other part
                        _ => return Err(bad("each content part must be an object")),
                    }
                }
            }
            Some(_) => return Err(bad("a message's content must be a string or a list")),
        }
    }
    Ok(n.max(1))
}

fn text_prompt(req: &Map<String, Value>) -> Result<u32, ApiError> {
    let bad = |m: &str| ApiError::bad_request(m, Some("prompt"));
    let n = match req.get("prompt") {
        Some(Value::String(s)) => words(s),
        Some(Value::Array(items)) => match items.as_slice() {
            [Value::String(s)] => words(s),
            [Value::Array(ids)] => ids_len(ids).ok_or_else(|| bad("token ids must be integers"))?,
            ids if ids.iter().all(Value::is_u64) && !ids.is_empty() => {
                u32::try_from(ids.len()).unwrap_or(u32::MAX)
            }
            _ => {
                return Err(bad(
                    "prompt must be a string, one-element list or token ids (batches are not supported)",
                ))
            }
        },
        _ => return Err(bad("prompt must be a string or a list of token ids")),
    };
    Ok(n.max(1))
}

fn ids_len(ids: &[Value]) -> Option<u32> {
    ids.iter()
        .all(Value::is_u64)
        .then(|| u32::try_from(ids.len()).unwrap_or(u32::MAX))
}

/// Writes one request's answer: its chunks when streamed, its body when
/// not. Built once per request; each chunk is its prefix, the part that
/// changes, and its suffix.
#[derive(Debug, Clone)]
pub struct Writer {
    api: Api,
    /// `{"id":...,"object":...,"created":...,"model":...,"choices":[{"index":0,`
    head: String,
    /// What a token's choice says: `"delta":{"content":" token"}` or
    /// `"text":" token"`.
    token: String,
    id: String,
    created: u64,
    model: String,
    prompt: u32,
}

impl Writer {
    /// A writer for request number `n` of `model` with `prompt` tokens,
    /// created at unix time `created` (seconds).
    pub fn new(api: Api, n: u64, model: &str, created: u64, prompt: u32) -> Self {
        let model_json = Value::from(model).to_string();
        let text = Value::from(TOKEN_TEXT).to_string();
        let (id, object, token) = match api {
            Api::Chat => (
                format!("chatcmpl-{n}"),
                "chat.completion.chunk",
                format!(r#""delta":{{"content":{text}}}"#),
            ),
            Api::Completions => (
                format!("cmpl-{n}"),
                "text_completion",
                format!(r#""text":{text}"#),
            ),
        };
        let head = format!(
            r#"{{"id":"{id}","object":"{object}","created":{created},"model":{model_json},"choices":[{{"index":0,"#
        );
        Self {
            api,
            head,
            token,
            id,
            created,
            model: model.to_owned(),
            prompt,
        }
    }

    /// Appends the chunk that opens a chat stream (the assistant's role), as
    /// vLLM sends before the first token. Nothing for text completions.
    pub fn opening(&self, out: &mut String) {
        if self.api == Api::Chat {
            self.event(out, r#""delta":{"role":"assistant","content":""}"#, "null");
        }
    }

    /// Appends the chunk of one token; `last` marks the request's end.
    pub fn token(&self, out: &mut String, last: bool) {
        self.event(out, &self.token, if last { r#""length""# } else { "null" });
    }

    /// Appends the usage chunk (`stream_options.include_usage`).
    pub fn usage(&self, out: &mut String, generated: u32) {
        let head = self.head.trim_end_matches(r#""choices":[{"index":0,"#);
        out.push_str("data: ");
        out.push_str(head);
        out.push_str(r#""choices":[],"usage":"#);
        out.push_str(&usage(self.prompt, generated).to_string());
        out.push_str("}\n\n");
    }

    /// Appends the stream's end.
    pub fn done(out: &mut String) {
        out.push_str("data: [DONE]\n\n");
    }

    fn event(&self, out: &mut String, body: &str, finish: &str) {
        out.push_str("data: ");
        out.push_str(&self.head);
        out.push_str(body);
        out.push_str(r#","logprobs":null,"finish_reason":"#);
        out.push_str(finish);
        out.push_str("}]}\n\n");
    }

    /// The one-body answer of a request that generated `generated` tokens.
    pub fn whole(&self, generated: u32) -> String {
        let text = TOKEN_TEXT.repeat(generated as usize);
        let (object, choice) = match self.api {
            Api::Chat => (
                "chat.completion",
                json!({"index": 0, "message": {"role": "assistant", "content": text},
                       "logprobs": null, "finish_reason": "length"}),
            ),
            Api::Completions => (
                "text_completion",
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": "length"}),
            ),
        };
        json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage(self.prompt, generated),
        })
        .to_string()
    }
}

fn usage(prompt: u32, generated: u32) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": generated,
        "total_tokens": u64::from(prompt) + u64::from(generated),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(api: Api, body: &str) -> Result<Ask, ApiError> {
        parse(api, body.as_bytes(), "m", 128)
    }

    #[test]
    fn lengths_from_words_and_max_tokens() {
        let a = ask(
            Api::Chat,
            r#"{"model":"m","messages":[{"role":"system","content":"be brief"},
                {"role":"user","content":[{"type":"text","text":"one two  three"},{"type":"image_url","image_url":{}}]}],
                "max_completion_tokens":7,"stream":true,"stream_options":{"include_usage":true}}"#,
        )
        .unwrap();
        assert_eq!(
            (a.prompt, a.output, a.stream, a.include_usage),
            (5, 7, true, true)
        );
        let a = ask(Api::Completions, r#"{"prompt":""}"#).unwrap();
        assert_eq!((a.prompt, a.output, a.stream), (1, 128, false));
        let a = ask(Api::Completions, r#"{"prompt":[1,2,3],"max_tokens":2}"#).unwrap();
        assert_eq!((a.prompt, a.output), (3, 2));
        let a = ask(Api::Completions, r#"{"prompt":[[1,2]]}"#).unwrap();
        assert_eq!(a.prompt, 2);
    }

    #[test]
    fn bad_bodies_are_400_with_an_openai_error() {
        for (api, body) in [
            (Api::Chat, "not json"),
            (Api::Chat, "[]"),
            (Api::Chat, r#"{"messages":"hi"}"#),
            (Api::Chat, r#"{"messages":[]}"#),
            (Api::Chat, r#"{"messages":[1]}"#),
            (Api::Chat, r#"{"messages":[{"content":5}]}"#),
            (Api::Chat, r#"{"messages":[{"content":[7]}]}"#),
            (Api::Chat, r#"{"model":3,"messages":[{"content":"x"}]}"#),
            (Api::Completions, r#"{}"#),
            (Api::Completions, r#"{"prompt":["a","b"]}"#),
            (Api::Completions, r#"{"prompt":[[1,-2]]}"#),
            (Api::Completions, r#"{"prompt":"x","max_tokens":0}"#),
            (Api::Completions, r#"{"prompt":"x","max_tokens":1e99}"#),
            (Api::Completions, r#"{"prompt":"x","max_tokens":"5"}"#),
            (Api::Completions, r#"{"prompt":"x","n":2}"#),
            (Api::Completions, r#"{"prompt":"x","stream":"yes"}"#),
            (Api::Completions, r#"{"prompt":"x","stream_options":1}"#),
        ] {
            let e = ask(api, body).unwrap_err();
            assert_eq!(e.status, 400, "{body}");
            let v: Value = serde_json::from_str(&e.body).unwrap();
            assert_eq!(v["error"]["code"], 400, "{body}");
            assert!(v["error"]["message"].is_string(), "{body}");
        }
        let e = ask(Api::Completions, r#"{"model":"other","prompt":"x"}"#).unwrap_err();
        assert_eq!(e.status, 404);
    }

    #[test]
    fn chunks_are_json_events() {
        let w = Writer::new(Api::Chat, 9, "a \"quoted\" model", 1, 3);
        let mut out = String::new();
        w.opening(&mut out);
        w.token(&mut out, false);
        w.token(&mut out, true);
        w.usage(&mut out, 2);
        Writer::done(&mut out);
        let events: Vec<&str> = out
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| e.strip_prefix("data: ").unwrap())
            .collect();
        assert_eq!(events.len(), 5);
        assert_eq!(events[4], "[DONE]");
        let v: Vec<Value> = events[..4]
            .iter()
            .map(|e| serde_json::from_str(e).unwrap())
            .collect();
        assert_eq!(v[0]["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(v[1]["choices"][0]["delta"]["content"], TOKEN_TEXT);
        assert_eq!(v[1]["model"], "a \"quoted\" model");
        assert_eq!(v[2]["choices"][0]["finish_reason"], "length");
        assert_eq!(v[3]["usage"]["total_tokens"], 5);
        let whole: Value = serde_json::from_str(&w.whole(2)).unwrap();
        assert_eq!(whole["choices"][0]["message"]["content"], " token token");
        let w = Writer::new(Api::Completions, 1, "m", 1, 1);
        let mut out = String::new();
        w.opening(&mut out);
        w.token(&mut out, true);
        let v: Value = serde_json::from_str(out.trim().strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(v["choices"][0]["text"], TOKEN_TEXT);
        assert_eq!(v["object"], "text_completion");
    }
}
