//! Quota mode and the response's dynamic metadata, as envoyproxy/ratelimit decides them:
//! which verdicts make a request over the limit, when a post-paid bucket is over, and the
//! `dynamic_metadata` Struct Envoy's filter emits for the filters after it. Pure: no Redis,
//! no clock, no config loading.
//!
//! The rule: a request is over the limit when any plain descriptor is over its limit, or
//! when it has quota-mode descriptors and every one of them is over its quota. A quota
//! descriptor over its quota alone only reports it (in its status and in the metadata's
//! `quotaModeViolations`), so a gateway can route to a backend that still has quota.

use serde_json::{json, Map, Value};

use envoy_types::pb::google::protobuf::{
    value::Kind, ListValue, NullValue, Struct, Value as ProtoValue,
};

/// One limited descriptor's verdict, as the rule reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// The descriptor's limit is in quota mode (`quota_mode` or `GLOBAL_QUOTA_MODE`).
    pub quota: bool,
    /// Over its limit, and enforced: a shadow-mode descriptor is never `over` here.
    pub over: bool,
}

/// Whether the request is over the limit: a plain descriptor over, or every quota-mode
/// descriptor over (and at least one of them).
pub fn request_over(verdicts: &[Verdict]) -> bool {
    let plain_over = verdicts.iter().any(|v| !v.quota && v.over);
    let mut quotas = verdicts.iter().filter(|v| v.quota).peekable();
    let has_quota = quotas.peek().is_some();
    plain_over || (has_quota && quotas.all(|v| v.over))
}

/// Whether every quota-mode verdict is over (false when there is none): the request is
/// refused whatever the plain descriptors say, so they need not be asked.
pub fn all_quotas_over(verdicts: &[Verdict]) -> bool {
    request_over(
        &verdicts
            .iter()
            .filter(|v| v.quota)
            .copied()
            .collect::<Vec<_>>(),
    )
}

/// Whether a post-paid bucket is over its limit after a charge left `balance` tokens: only
/// in debt. The charge has been applied either way; a check that charges nothing
/// (`hits_addend: 0`) at a balance of exactly 0 is within the limit, as the peer's counter
/// at exactly `requests_per_unit` is.
pub fn post_paid_over(balance: i64) -> bool {
    balance < 0
}

/// One descriptor of the request, for the metadata.
pub struct MetadataDescriptor<'a> {
    pub entries: &'a [(String, String)],
    /// Its limit is in quota mode.
    pub quota: bool,
    /// Over its limit (shadow-mode overs included: a descriptor past its limit is not
    /// advertised as having room).
    pub over: bool,
    /// The configured `metadata` of its limit.
    pub metadata: Option<&'a Value>,
}

/// The dynamic metadata of a response: `domain`, `descriptors` (each `{"entries":
/// ["key=value", …]}`), and when a quota-mode limit matched, `quotaModeEnabled: true` and
/// `quotaModeViolations` (the indexes of the quota descriptors over their quota). The
/// configured `metadata` of every descriptor within its limit is merged in at the top
/// level, in request order; a key already set by an earlier descriptor is kept, so the
/// first descriptor with room names the backend (list descriptors in order of preference).
pub fn dynamic_metadata(domain: &str, descriptors: &[MetadataDescriptor<'_>]) -> Value {
    let mut out = Map::new();
    for d in descriptors.iter().filter(|d| !d.over) {
        if let Some(Value::Object(fields)) = d.metadata {
            for (k, v) in fields {
                out.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
    }
    out.insert("domain".into(), json!(domain));
    let listed: Vec<Value> = descriptors
        .iter()
        .map(|d| {
            let entries: Vec<String> = d.entries.iter().map(|(k, v)| format!("{k}={v}")).collect();
            json!({ "entries": entries })
        })
        .collect();
    out.insert("descriptors".into(), Value::Array(listed));
    if descriptors.iter().any(|d| d.quota) {
        out.insert("quotaModeEnabled".into(), json!(true));
        let violations: Vec<usize> = descriptors
            .iter()
            .enumerate()
            .filter(|(_, d)| d.quota && d.over)
            .map(|(i, _)| i)
            .collect();
        out.insert("quotaModeViolations".into(), json!(violations));
    }
    Value::Object(out)
}

/// A JSON object as a protobuf Struct (numbers become doubles, as Struct holds them).
pub fn to_struct(value: &Value) -> Struct {
    match value {
        Value::Object(map) => Struct {
            fields: map
                .iter()
                .map(|(k, v)| (k.clone(), to_proto_value(v)))
                .collect(),
        },
        _ => Struct::default(),
    }
}

fn to_proto_value(value: &Value) -> ProtoValue {
    let kind = match value {
        Value::Null => Kind::NullValue(NullValue::NullValue as i32),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(items) => Kind::ListValue(ListValue {
            values: items.iter().map(to_proto_value).collect(),
        }),
        Value::Object(_) => Kind::StructValue(to_struct(value)),
    };
    ProtoValue { kind: Some(kind) }
}

/// A protobuf Struct as JSON (for `/json`, protojson's mapping of Struct).
pub fn struct_to_json(value: &Struct) -> Value {
    Value::Object(
        value
            .fields
            .iter()
            .map(|(k, v)| (k.clone(), proto_value_to_json(v)))
            .collect(),
    )
}

fn proto_value_to_json(value: &ProtoValue) -> Value {
    match &value.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => json!(b),
        // protojson prints a whole double without a fraction (`0`, not `0.0`).
        Some(Kind::NumberValue(n)) if n.fract() == 0.0 && n.abs() < 9.0e15 => {
            #[allow(clippy::cast_possible_truncation)]
            let whole = *n as i64;
            json!(whole)
        }
        Some(Kind::NumberValue(n)) => json!(n),
        Some(Kind::StringValue(s)) => json!(s),
        Some(Kind::ListValue(l)) => {
            Value::Array(l.values.iter().map(proto_value_to_json).collect())
        }
        Some(Kind::StructValue(s)) => struct_to_json(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAIN_OK: Verdict = Verdict {
        quota: false,
        over: false,
    };
    const PLAIN_OVER: Verdict = Verdict {
        quota: false,
        over: true,
    };
    const QUOTA_OK: Verdict = Verdict {
        quota: true,
        over: false,
    };
    const QUOTA_OVER: Verdict = Verdict {
        quota: true,
        over: true,
    };

    #[test]
    fn over_when_a_plain_one_is_or_every_quota_one_is() {
        // (verdicts, over?)
        let cases: &[(&[Verdict], bool)] = &[
            // Nothing limited: allowed.
            (&[], false),
            // Plain descriptors: any over refuses (the Go service's rule without quotas).
            (&[PLAIN_OK], false),
            (&[PLAIN_OK, PLAIN_OVER], true),
            // One quota over its quota, alone: every quota is over, refused.
            (&[QUOTA_OVER], true),
            // One of two quotas over: the other still has room, allowed.
            (&[QUOTA_OVER, QUOTA_OK], false),
            // Both over: refused.
            (&[QUOTA_OVER, QUOTA_OVER], true),
            // A plain one over refuses even when the quotas have room.
            (&[QUOTA_OK, PLAIN_OVER], true),
            // Quotas all over refuse even when the plain ones are within their limits.
            (&[QUOTA_OVER, PLAIN_OK], true),
            // A quota with room and a plain one within: allowed.
            (&[QUOTA_OK, PLAIN_OK], false),
        ];
        for (verdicts, over) in cases {
            assert_eq!(request_over(verdicts), *over, "{verdicts:?}");
        }
        assert!(!all_quotas_over(&[PLAIN_OVER]));
        assert!(all_quotas_over(&[QUOTA_OVER, PLAIN_OK]));
        assert!(!all_quotas_over(&[QUOTA_OVER, QUOTA_OK]));
    }

    #[test]
    fn a_post_paid_bucket_is_over_only_in_debt() {
        assert!(!post_paid_over(1));
        // Exactly spent: a check that adds nothing still passes.
        assert!(!post_paid_over(0));
        assert!(post_paid_over(-1));
        assert!(post_paid_over(i64::MIN));
    }

    fn entries(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn metadata_lists_descriptors_violations_and_the_first_room_wins() {
        let one = entries(&[("service", "s1")]);
        let two = entries(&[("service", "s2")]);
        let plain = entries(&[("user", "u"), ("path", "/x")]);
        let m1 = json!({"service": "s1", "tier": "gold"});
        let m2 = json!({"service": "s2", "region": "eu"});
        let d = |entries, quota, over, metadata| MetadataDescriptor {
            entries,
            quota,
            over,
            metadata,
        };
        // s1 over its quota: s2's metadata is the top level's.
        let v = dynamic_metadata(
            "ai",
            &[
                d(&one, true, true, Some(&m1)),
                d(&two, true, false, Some(&m2)),
                d(&plain, false, false, None),
            ],
        );
        assert_eq!(
            v,
            json!({
                "domain": "ai",
                "descriptors": [
                    {"entries": ["service=s1"]},
                    {"entries": ["service=s2"]},
                    {"entries": ["user=u", "path=/x"]},
                ],
                "quotaModeEnabled": true,
                "quotaModeViolations": [0],
                "service": "s2",
                "region": "eu",
            })
        );
        // Both with room: the first in request order names the service, keys of later
        // descriptors that the first lacks are added.
        let v = dynamic_metadata(
            "ai",
            &[
                d(&one, true, false, Some(&m1)),
                d(&two, true, false, Some(&m2)),
            ],
        );
        assert_eq!(v["service"], "s1");
        assert_eq!(v["region"], "eu");
        assert_eq!(v["quotaModeViolations"], json!([]));
        // No quota-mode limit: no quota fields.
        let v = dynamic_metadata("d", &[d(&plain, false, true, None)]);
        assert_eq!(
            v,
            json!({"domain": "d", "descriptors": [{"entries": ["user=u", "path=/x"]}]})
        );
    }

    #[test]
    fn struct_round_trips_through_json() {
        let v = json!({"a": 1, "b": [true, null, "x"], "c": {"d": 2.5}});
        assert_eq!(struct_to_json(&to_struct(&v)), v);
    }
}
