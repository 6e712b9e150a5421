//! One record of Dynamo's discovery store: a worker's model card, as a
//! Dynamo 1.6.1 worker writes it under `v1/mdc/` (the file backend's
//! `DYN_FILE_KV` directory, or etcd's keys of the same names).
//!
//! The record's key is `{namespace}/{component}/{endpoint}/{instance id in
//! hex}`; its value is JSON with the same four fields and the card, whose
//! `runtime_config` carries the worker's capacities. Only the fields loadgate
//! uses are read; every other field is ignored, so newer releases that add
//! fields still parse. A record whose key and value name different workers
//! is refused: the key is what the store's owner wrote, the value what the
//! worker claims.

use serde::Deserialize;

use crate::load::WorkerSpec;

/// A worker learned from one discovery record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveredWorker {
    /// The model's name as clients send it (the card's `display_name`).
    pub model: String,
    /// The worker's instance id: the `worker_id` of its load events.
    pub instance_id: u64,
    /// Its namespace, component and endpoint.
    pub namespace: String,
    /// The component (for example `backend`).
    pub component: String,
    /// The endpoint (for example `generate`).
    pub endpoint: String,
    /// Ranks and capacities from the card's `runtime_config`.
    pub spec: WorkerSpec,
}

/// Why a record was not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CardError {
    /// Not JSON of a model card's shape (serde's message).
    Malformed(String),
    /// The key does not name `{namespace}/{component}/{endpoint}/{hex id}`,
    /// or names another worker than the value.
    Mismatched(String),
}

impl CardError {
    /// Every kind, for counters: `malformed`, `mismatched`.
    pub const KINDS: [&'static str; 2] = ["malformed", "mismatched"];

    /// This error's kind, one of [`CardError::KINDS`].
    pub fn kind(&self) -> &'static str {
        match self {
            CardError::Malformed(_) => "malformed",
            CardError::Mismatched(_) => "mismatched",
        }
    }
}

impl std::fmt::Display for CardError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CardError::Malformed(e) => write!(f, "malformed model card: {e}"),
            CardError::Mismatched(e) => write!(f, "mismatched model card: {e}"),
        }
    }
}

impl std::error::Error for CardError {}

#[derive(Deserialize)]
struct Record {
    namespace: String,
    component: String,
    endpoint: String,
    instance_id: u64,
    card_json: Card,
}

#[derive(Deserialize)]
struct Card {
    display_name: String,
    #[serde(default)]
    runtime_config: RuntimeConfig,
}

#[derive(Deserialize, Default)]
struct RuntimeConfig {
    total_kv_blocks: Option<u64>,
    max_num_batched_tokens: Option<u64>,
    max_num_seqs: Option<u64>,
    data_parallel_start_rank: Option<u32>,
    data_parallel_size: Option<u32>,
}

/// Parses the record stored under `key` (already percent-decoded, without
/// the `v1/mdc/` prefix).
pub fn parse_card(key: &str, value: &[u8]) -> Result<DiscoveredWorker, CardError> {
    let record: Record =
        serde_json::from_slice(value).map_err(|e| CardError::Malformed(e.to_string()))?;
    let want = format!(
        "{}/{}/{}/{:x}",
        record.namespace, record.component, record.endpoint, record.instance_id
    );
    if key != want {
        return Err(CardError::Mismatched(format!(
            "key {key:?} holds the card of {want:?}"
        )));
    }
    let rc = record.card_json.runtime_config;
    let spec = WorkerSpec {
        dp_start: rc.data_parallel_start_rank.unwrap_or(0),
        dp_size: rc.data_parallel_size.unwrap_or(1),
        kv_total_blocks: rc.total_kv_blocks,
        max_num_batched_tokens: rc.max_num_batched_tokens,
        max_num_seqs: rc.max_num_seqs,
    };
    Ok(DiscoveredWorker {
        model: record.card_json.display_name,
        instance_id: record.instance_id,
        namespace: record.namespace,
        component: record.component,
        endpoint: record.endpoint,
        spec,
    })
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const CARD: &str = r#"{"type":"Model","namespace":"dynamo","component":"backend",
        "endpoint":"generate","instance_id":255,"card_json":{"display_name":"tiny",
        "runtime_config":{"total_kv_blocks":64,"max_num_batched_tokens":8192,"max_num_seqs":256,
        "data_parallel_start_rank":0,"data_parallel_size":2,"future_field":[1]}}}"#;

    #[test]
    fn a_card_gives_the_worker_and_its_capacities() {
        let w = parse_card("dynamo/backend/generate/ff", CARD.as_bytes()).unwrap();
        assert_eq!(w.model, "tiny");
        assert_eq!(w.instance_id, 255);
        assert_eq!(w.spec.dp_size, 2);
        assert_eq!(w.spec.kv_total_blocks, Some(64));
        assert_eq!(w.spec.max_num_batched_tokens, Some(8192));
        assert_eq!(w.spec.max_num_seqs, Some(256));
    }

    #[test]
    fn a_card_under_another_workers_key_is_refused() {
        let e = parse_card("dynamo/backend/generate/fe", CARD.as_bytes()).unwrap_err();
        assert_eq!(e.kind(), "mismatched");
        let e = parse_card("dynamo/backend/generate/ff", b"{\"instance_id\": -1}").unwrap_err();
        assert_eq!(e.kind(), "malformed");
    }
}
