//! The HTTP side: `POST /json` (a protojson `RateLimitRequest` in, the
//! protojson `RateLimitResponse` out with 200, or 429 when over the limit; 400 on bad
//! input), and the Prometheus page. The JSON mapping is the proto3 one: lowerCamelCase
//! names (the proto names are accepted too), 64-bit numbers as numbers or strings, enums by
//! name, durations as `"1.5s"`, default values left out.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::config::rules::Unit;
use crate::decision::service::{Failure, Service};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRequest {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, alias = "hits_addend", rename = "hitsAddend")]
    hits_addend: Option<Number>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
    #[serde(default)]
    limit: Option<JsonOverride>,
    #[serde(default, alias = "hits_addend", rename = "hitsAddend")]
    hits_addend: Option<Number>,
    #[serde(default, alias = "is_negative_hits", rename = "isNegativeHits")]
    is_negative_hits: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonOverride {
    #[serde(default, alias = "requests_per_unit", rename = "requestsPerUnit")]
    requests_per_unit: Option<Number>,
    #[serde(default)]
    unit: Option<Value>,
}

/// protojson's 64-bit integers: a number or a decimal string.
#[derive(Deserialize)]
#[serde(untagged)]
enum Number {
    Int(u64),
    Text(String),
}

impl Number {
    fn get(&self, what: &str) -> Result<u64, String> {
        match self {
            Number::Int(n) => Ok(*n),
            Number::Text(t) => t
                .parse::<u64>()
                .map_err(|_| format!("{what} must be a whole number >= 0")),
        }
    }
}

/// The proto request of a protojson body.
///
/// # Errors
/// What is wrong, for a 400.
pub fn parse_request(body: &[u8]) -> Result<RateLimitRequest, String> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| format!("bad RateLimitRequest JSON: {e}"))?;
    if !value.is_object() {
        return Err("bad RateLimitRequest JSON: not an object".into());
    }
    let json: JsonRequest =
        serde_json::from_value(value).map_err(|e| format!("bad RateLimitRequest JSON: {e}"))?;
    let hits_addend = match &json.hits_addend {
        None => 0,
        Some(n) => u32::try_from(n.get("hitsAddend")?)
            .map_err(|_| "hitsAddend must be at most 4294967295".to_string())?,
    };
    let mut descriptors = Vec::with_capacity(json.descriptors.len());
    for d in json.descriptors {
        let limit = match d.limit {
            None => None,
            Some(o) => {
                let requests_per_unit = match &o.requests_per_unit {
                    None => 0,
                    Some(n) => u32::try_from(n.get("requestsPerUnit")?)
                        .map_err(|_| "requestsPerUnit must be at most 4294967295".to_string())?,
                };
                let unit = match &o.unit {
                    None => 0,
                    Some(Value::String(s)) => Unit::parse(s).map_or(0, Unit::proto),
                    Some(Value::Number(n)) => {
                        n.as_i64().and_then(|n| i32::try_from(n).ok()).unwrap_or(0)
                    }
                    Some(_) => return Err("limit.unit must be a unit name".into()),
                };
                Some(RateLimitOverride {
                    requests_per_unit,
                    unit,
                })
            }
        };
        let hits_addend = match &d.hits_addend {
            None => None,
            Some(n) => Some(UInt64Value {
                value: n.get("hitsAddend")?,
            }),
        };
        descriptors.push(RateLimitDescriptor {
            entries: d
                .entries
                .into_iter()
                .map(|e| Entry {
                    key: e.key,
                    value: e.value,
                })
                .collect(),
            limit,
            hits_addend,
            is_negative_hits: d.is_negative_hits,
        });
    }
    Ok(RateLimitRequest {
        domain: json.domain,
        descriptors,
        hits_addend,
    })
}

fn code_name(code: i32) -> &'static str {
    Code::try_from(code).map_or("UNKNOWN", |c| c.as_str_name())
}

fn unit_name(unit: i32) -> &'static str {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as P;
    P::try_from(unit).map_or("UNKNOWN", |u| u.as_str_name())
}

/// The protojson of a response.
pub fn response_json(r: &RateLimitResponse) -> Value {
    let mut out = Map::new();
    out.insert("overallCode".into(), json!(code_name(r.overall_code)));
    let statuses: Vec<Value> = r
        .statuses
        .iter()
        .map(|s| {
            let mut st = Map::new();
            st.insert("code".into(), json!(code_name(s.code)));
            if let Some(l) = &s.current_limit {
                let mut cl = Map::new();
                if !l.name.is_empty() {
                    cl.insert("name".into(), json!(l.name));
                }
                if l.requests_per_unit != 0 {
                    cl.insert("requestsPerUnit".into(), json!(l.requests_per_unit));
                }
                cl.insert("unit".into(), json!(unit_name(l.unit)));
                st.insert("currentLimit".into(), Value::Object(cl));
            }
            if s.limit_remaining != 0 {
                st.insert("limitRemaining".into(), json!(s.limit_remaining));
            }
            if let Some(d) = &s.duration_until_reset {
                let text = if d.nanos == 0 {
                    format!("{}s", d.seconds)
                } else {
                    format!("{}.{:03}s", d.seconds, d.nanos / 1_000_000)
                };
                st.insert("durationUntilReset".into(), json!(text));
            }
            Value::Object(st)
        })
        .collect();
    if !statuses.is_empty() {
        out.insert("statuses".into(), Value::Array(statuses));
    }
    if !r.response_headers_to_add.is_empty() {
        let headers: Vec<Value> = r
            .response_headers_to_add
            .iter()
            .map(|h| json!({"key": h.key, "value": h.value}))
            .collect();
        out.insert("responseHeadersToAdd".into(), Value::Array(headers));
    }
    if let Some(metadata) = &r.dynamic_metadata {
        out.insert(
            "dynamicMetadata".into(),
            crate::decision::quota::struct_to_json(metadata),
        );
    }
    Value::Object(out)
}

async fn json_endpoint(State(service): State<Arc<Service>>, body: axum::body::Bytes) -> Response {
    let request = match parse_request(&body) {
        Ok(r) => r,
        Err(text) => {
            service
                .metrics
                .errors
                .with_label_values(&["invalid_argument"])
                .inc();
            return (StatusCode::BAD_REQUEST, text).into_response();
        }
    };
    match service.should_rate_limit(&request, "json").await {
        Ok(response) => {
            let status = if response.overall_code == Code::OverLimit as i32 {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            (
                status,
                [("content-type", "application/json")],
                response_json(&response).to_string(),
            )
                .into_response()
        }
        Err(Failure::Invalid(text)) => (StatusCode::BAD_REQUEST, text).into_response(),
        Err(Failure::Unavailable(text)) => (StatusCode::SERVICE_UNAVAILABLE, text).into_response(),
        Err(Failure::Internal(text)) => (StatusCode::INTERNAL_SERVER_ERROR, text).into_response(),
    }
}

/// `/json` (`/healthcheck` is `health::http_router`'s).
pub fn router(service: Arc<Service>) -> Router {
    Router::new()
        .route("/json", post(json_endpoint))
        .with_state(service)
}

/// The Prometheus page at `path`.
pub fn metrics_router(service: Arc<Service>, path: &str) -> Router {
    Router::new()
        .route(
            path,
            get(|State(s): State<Arc<Service>>| async move {
                (
                    [("content-type", "text/plain; version=0.0.4")],
                    s.metrics.render(),
                )
            }),
        )
        .with_state(service)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protojson_requests_parse_in_both_spellings() {
        let r = parse_request(
            br#"{"domain":"d","hits_addend":2,"descriptors":[{"entries":[{"key":"k","value":"v"}],
                "hitsAddend":"7","limit":{"requestsPerUnit":3,"unit":"MINUTE"}}]}"#,
        )
        .unwrap();
        assert_eq!(r.hits_addend, 2);
        let d = &r.descriptors[0];
        assert_eq!(d.hits_addend.unwrap().value, 7);
        assert_eq!(d.limit.unwrap().requests_per_unit, 3);
        assert_eq!(d.limit.unwrap().unit, 2);
    }

    #[test]
    fn malformed_json_is_an_error() {
        for body in [
            &b"{"[..],
            b"[]",
            br#"{"domain":5}"#,
            br#"{"domain":"d","nope":1}"#,
            br#"{"domain":"d","descriptors":[{"hitsAddend":"-1"}]}"#,
            br#"{"domain":"d","hitsAddend":99999999999}"#,
        ] {
            assert!(
                parse_request(body).is_err(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }
}
