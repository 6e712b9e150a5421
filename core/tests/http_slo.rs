//! `/slo` (`http::serve_slo`): a model's SLO set, read and cleared at run
//! time, refused as `/busy_threshold` refuses (405, 415, 413, 400, 422,
//! 404), and guarded by the same bearer token.

use loadgate::http::{serve_slo, BusyThresholdRequest, ControlAuth, MAX_BODY_BYTES};
use loadgate::{Monitor, SloMode, WorkerSpec};
use serde_json::Value;

fn monitor() -> Monitor {
    let m = Monitor::new();
    m.add_worker("m", 1, WorkerSpec::default()).unwrap();
    m
}

fn post(m: &Monitor, auth: Option<&ControlAuth>, bearer: Option<&str>, body: &str) -> (u16, Value) {
    let r = serve_slo(
        m,
        auth,
        &BusyThresholdRequest {
            method: "POST",
            content_type: Some("application/json"),
            authorization: bearer,
            body: body.as_bytes(),
        },
    );
    let json = serde_json::from_str(&r.body).unwrap_or(Value::Null);
    (r.status, json)
}

#[test]
fn an_slo_is_set_read_listed_and_cleared() {
    let m = monitor();
    let (status, body) = post(&m, None, None, r#"{"model": "m"}"#);
    assert_eq!(status, 200);
    assert_eq!(body["ttft"], Value::Null);
    let (status, body) = post(
        &m,
        None,
        None,
        r#"{"model": "m", "ttft": 2, "tpot": 0.1, "advisory": true}"#,
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (body["ttft"].as_f64(), body["tpot"].as_f64()),
        (Some(2.0), Some(0.1))
    );
    assert_eq!(body["advisory"], Value::Bool(true));
    assert_eq!(m.slo("m").unwrap().1, SloMode::Advisory);
    let list = serve_slo(
        &m,
        None,
        &BusyThresholdRequest {
            method: "GET",
            ..Default::default()
        },
    );
    let list: Value = serde_json::from_str(&list.body).unwrap();
    assert_eq!(list["slos"][0]["model"], "m");
    assert_eq!(list["slos"][0]["would_admit"], 0);
    let (status, body) = post(&m, None, None, r#"{"model": "m", "clear": true}"#);
    assert_eq!((status, body["ttft"].clone()), (200, Value::Null));
    assert_eq!(m.slo("m"), None);
}

#[test]
fn refusals_name_what_was_wrong_and_change_nothing() {
    let m = monitor();
    post(&m, None, None, r#"{"model": "m", "ttft": 2, "tpot": 0.1}"#);
    let before = m.slo("m");
    for (body, status, says) in [
        (r#"{"model": "m", "ttft": 0, "tpot": 0.1}"#, 400, "ttft"),
        (r#"{"model": "m", "ttft": 2, "tpot": 1e9}"#, 400, "tpot"),
        (r#"{"model": "m", "ttft": 2}"#, 400, "together"),
        (
            r#"{"model": "m", "ttft": 2, "tpot": 0.1, "clear": true}"#,
            400,
            "together",
        ),
        (r#"{"model": "nope", "ttft": 2, "tpot": 0.1}"#, 404, "nope"),
        (r#"{"model": "m", "ttft": "2", "tpot": 0.1}"#, 422, "ttft"),
        (r#"{"model": "m", "speed": 1}"#, 422, "speed"),
    ] {
        let r = serve_slo(
            &m,
            None,
            &BusyThresholdRequest {
                method: "POST",
                content_type: Some("application/json"),
                body: body.as_bytes(),
                ..Default::default()
            },
        );
        assert_eq!(r.status, status, "{body}: {}", r.body);
        assert!(r.body.contains(says), "{body}: {}", r.body);
    }
    let text = |ct: Option<&'static str>, body: &[u8]| {
        serve_slo(
            &m,
            None,
            &BusyThresholdRequest {
                method: "POST",
                content_type: ct,
                body,
                ..Default::default()
            },
        )
        .status
    };
    assert_eq!(text(Some("text/plain"), b"{}"), 415);
    assert_eq!(
        text(Some("application/json"), &vec![b' '; MAX_BODY_BYTES + 1]),
        413
    );
    assert_eq!(text(Some("application/json"), b"{\"model\": "), 400);
    let put = BusyThresholdRequest {
        method: "PUT",
        ..Default::default()
    };
    assert_eq!(serve_slo(&m, None, &put).status, 405);
    assert_eq!(m.slo("m"), before);
}

#[test]
fn a_write_needs_the_bearer_token_and_a_read_does_not() {
    let m = monitor();
    let auth = ControlAuth::new("s3cret", false).unwrap();
    let body = r#"{"model": "m", "ttft": 2, "tpot": 0.1}"#;
    assert_eq!(post(&m, Some(&auth), None, body).0, 401);
    assert_eq!(post(&m, Some(&auth), Some("Bearer wrong"), body).0, 401);
    assert_eq!(m.slo("m"), None);
    assert_eq!(post(&m, Some(&auth), None, r#"{"model": "m"}"#).0, 200);
    assert_eq!(post(&m, Some(&auth), Some("Bearer s3cret"), body).0, 200);
    assert!(m.slo("m").is_some());
}
