//! YAML as envoyproxy/ratelimit's parser (gopkg.in/yaml.v2, YAML 1.1) reads it: the document
//! as a tree that keeps each scalar's text and whether it was plain, and the YAML 1.1
//! resolution of a plain scalar (`yes`/`no`/`on`/`off`/`y`/`n` are booleans, `0777` is octal,
//! `1_000` is a thousand, `0x1F` and `0b101` are integers). Pure: no config semantics here.
//!
//! Why not serde_yaml_ng's `Value`: it resolves by YAML 1.2, so `shadow_mode: yes` is the
//! string "yes", and it keeps no scalar's text, so `value: 01234` became "1234" where the Go
//! service compares "01234". libyaml (unsafe-libyaml, which serde_yaml_ng already builds on)
//! gives the events with the text and the style; this file turns them into [`Node`]s.

use std::collections::HashMap;

use unsafe_libyaml as libyaml_unsafe;

/// One scalar as written.
#[derive(Clone, Debug, PartialEq)]
pub struct Scalar {
    /// The text after YAML's quoting and folding rules.
    pub text: String,
    /// Unquoted (plain style): only these are resolved to null, bool, int or float.
    pub plain: bool,
    /// The explicit tag (`!!str` is `tag:yaml.org,2002:str`), if any.
    pub tag: Option<String>,
    /// The line it starts on, from 1, for error texts.
    pub line: u64,
}

/// A node of the document; aliases are resolved to copies and `<<` merges applied.
#[derive(Clone, Debug, PartialEq)]
pub enum Node {
    Scalar(Scalar),
    Seq(Vec<Node>),
    /// Entries in document order; a later duplicate key wins, as in yaml.v2.
    Map(Vec<(Node, Node)>),
}

/// What a scalar resolves to by yaml.v2's rules.
#[derive(Clone, Debug, PartialEq)]
pub enum Resolved {
    Null,
    Bool(bool),
    /// A whole number (yaml.v2 keeps it as Go's `int` or, above `i64::MAX`, `uint64`).
    Int(i128),
    Float(f64),
    Str,
}

const STR_TAG: &str = "tag:yaml.org,2002:str";

/// The deepest nesting read.
const MAX_DEPTH: usize = 128;

impl Scalar {
    /// yaml.v2's resolution: quoted scalars and `!!str` are strings; a plain scalar is null,
    /// a YAML 1.1 bool, an int (`ParseInt(text without '_', 0)`: 0x, 0o, 0b, leading-0
    /// octal, a sign), a float, or else a string.
    pub fn resolve(&self) -> Resolved {
        match self.tag.as_deref() {
            Some(STR_TAG) | Some("!") => return Resolved::Str,
            _ => {}
        }
        if !self.plain {
            return Resolved::Str;
        }
        resolve_plain(&self.text)
    }

    /// The YAML tag name of the resolved kind, as yaml.v2's errors print it (`!!str`).
    pub fn kind(&self) -> &'static str {
        match self.resolve() {
            Resolved::Null => "!!null",
            Resolved::Bool(_) => "!!bool",
            Resolved::Int(_) => "!!int",
            Resolved::Float(_) => "!!float",
            Resolved::Str => "!!str",
        }
    }
}

fn resolve_plain(text: &str) -> Resolved {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Resolved::Null,
        "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" | "true" | "True" | "TRUE" => {
            return Resolved::Bool(true)
        }
        "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" | "false" | "False" | "FALSE" => {
            return Resolved::Bool(false)
        }
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            return Resolved::Float(f64::INFINITY)
        }
        "-.inf" | "-.Inf" | "-.INF" => return Resolved::Float(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => return Resolved::Float(f64::NAN),
        _ => {}
    }
    let first = text.bytes().next().unwrap_or(b'x');
    if !(first.is_ascii_digit() || matches!(first, b'+' | b'-' | b'.')) {
        return Resolved::Str;
    }
    let plain: String = text.chars().filter(|c| *c != '_').collect();
    if let Some(n) = go_parse_int(&plain) {
        return Resolved::Int(n);
    }
    if is_yaml_float(&plain) {
        if let Ok(f) = plain.parse::<f64>() {
            return Resolved::Float(f);
        }
    }
    Resolved::Str
}

/// Go's `strconv.ParseInt(s, 0, 64)`, then `ParseUint(s, 0, 64)`: an optional sign, then
/// `0x`/`0X` hex, `0o`/`0O` or a leading `0` octal, `0b`/`0B` binary, or decimal.
fn go_parse_int(text: &str) -> Option<i128> {
    let (negative, body) = match text.as_bytes().first() {
        Some(b'-') => (true, text.get(1..)?),
        Some(b'+') => (false, text.get(1..)?),
        _ => (false, text),
    };
    let lower = body.to_ascii_lowercase();
    let (radix, digits) = if let Some(d) = lower.strip_prefix("0x") {
        (16, d)
    } else if let Some(d) = lower.strip_prefix("0o") {
        (8, d)
    } else if let Some(d) = lower.strip_prefix("0b") {
        (2, d)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, lower.get(1..)?)
    } else {
        (10, lower.as_str())
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let magnitude = u64::from_str_radix(digits, radix).ok()?;
    if negative {
        // ParseInt's range: down to i64::MIN; ParseUint takes no sign.
        let n = -i128::from(magnitude);
        (n >= i128::from(i64::MIN)).then_some(n)
    } else {
        Some(i128::from(magnitude))
    }
}

/// yaml.v2's float pattern: `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`.
fn is_yaml_float(text: &str) -> bool {
    let b = text.as_bytes();
    let mut i = usize::from(matches!(b.first(), Some(b'+' | b'-')));
    let digits = |i: &mut usize| {
        let start = *i;
        while b.get(*i).is_some_and(u8::is_ascii_digit) {
            *i += 1;
        }
        *i - start
    };
    if b.get(i) == Some(&b'.') {
        i += 1;
        if digits(&mut i) == 0 {
            return false;
        }
    } else {
        if digits(&mut i) == 0 {
            return false;
        }
        if b.get(i) == Some(&b'.') {
            i += 1;
            digits(&mut i);
        }
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if digits(&mut i) == 0 {
            return false;
        }
    }
    i == b.len()
}

impl Node {
    /// The value of the last entry whose key is the plain string `key`.
    pub fn get(&self, key: &str) -> Option<&Node> {
        let Node::Map(entries) = self else {
            return None;
        };
        entries
            .iter()
            .rev()
            .find(|(k, _)| matches!(k, Node::Scalar(s) if s.text == key && s.resolve() == Resolved::Str))
            .map(|(_, v)| v)
    }

    /// Whether this is a null scalar (`~`, `null`, or nothing).
    pub fn is_null(&self) -> bool {
        matches!(self, Node::Scalar(s) if s.resolve() == Resolved::Null)
    }

    /// The node as Go's `%v` prints the value yaml.v2 decodes it to, for error texts.
    pub fn go_text(&self) -> String {
        match self {
            Node::Scalar(s) => match s.resolve() {
                Resolved::Null => "<nil>".into(),
                Resolved::Bool(b) => b.to_string(),
                Resolved::Int(n) => n.to_string(),
                Resolved::Float(f) => format!("{f}"),
                Resolved::Str => s.text.clone(),
            },
            Node::Seq(items) => {
                let inner: Vec<String> = items.iter().map(Node::go_text).collect();
                format!("[{}]", inner.join(" "))
            }
            Node::Map(entries) => {
                let inner: Vec<String> = entries
                    .iter()
                    .map(|(k, v)| format!("{}:{}", k.go_text(), v.go_text()))
                    .collect();
                format!("map[{}]", inner.join(" "))
            }
        }
    }

    /// The node as JSON, each scalar resolved (for `metadata`, which is free-form).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match self {
            Node::Scalar(s) => match s.resolve() {
                Resolved::Null => J::Null,
                Resolved::Bool(b) => J::Bool(b),
                Resolved::Int(n) => i64::try_from(n)
                    .map(J::from)
                    .or_else(|_| u64::try_from(n).map(J::from))
                    .unwrap_or_else(|_| J::String(s.text.clone())),
                Resolved::Float(f) => serde_json::Number::from_f64(f)
                    .map_or_else(|| J::String(s.text.clone()), J::Number),
                Resolved::Str => J::String(s.text.clone()),
            },
            Node::Seq(items) => J::Array(items.iter().map(Node::to_json).collect()),
            Node::Map(entries) => J::Object(
                entries
                    .iter()
                    .map(|(k, v)| {
                        let key = match k {
                            Node::Scalar(s) => s.text.clone(),
                            other => other.go_text(),
                        };
                        (key, v.to_json())
                    })
                    .collect(),
            ),
        }
    }
}

/// Parses the first document of `text`; `Ok(None)` for an empty stream.
///
/// # Errors
/// The parser's problem, as serde_yaml_ng words it (with the line and column).
pub fn parse(text: &str) -> Result<Option<Node>, String> {
    let events = match events(text) {
        Some(events) => events,
        None => {
            // libyaml refused the text: serde_yaml_ng, on the same libyaml, words why.
            return Err(
                match serde_yaml_ng::from_str::<serde_yaml_ng::Value>(text) {
                    Err(e) => e.to_string(),
                    Ok(_) => "invalid YAML".into(),
                },
            );
        }
    };
    let mut builder = Builder {
        events: events.into_iter(),
        anchors: HashMap::new(),
        alias_budget: MAX_ALIAS_NODES,
    };
    builder.document()
}

/// One libyaml event, copied out of the C structures.
enum Event {
    DocumentStart,
    DocumentEnd,
    StreamEnd,
    Alias(String),
    Scalar(Scalar, Option<String>),
    SeqStart(Option<String>),
    SeqEnd,
    MapStart(Option<String>),
    MapEnd,
    Other,
}

/// Copies a NUL-terminated libyaml string.
///
/// # Safety
/// `ptr` is null or points to a NUL-terminated string libyaml allocated for an event that
/// has not been deleted yet.
unsafe fn c_text(ptr: *const u8) -> Option<String> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: the caller guarantees a live NUL-terminated string.
    let text = unsafe { std::ffi::CStr::from_ptr(ptr.cast()) };
    Some(text.to_string_lossy().into_owned())
}

/// Runs libyaml's parser over `text`; `None` when it reports an error.
fn events(text: &str) -> Option<Vec<Event>> {
    let mut parser = Box::new(std::mem::MaybeUninit::<libyaml_unsafe::yaml_parser_t>::uninit());
    let parser = parser.as_mut_ptr();
    // SAFETY: `parser` points to writable memory for one yaml_parser_t, which
    // yaml_parser_initialize fills in; on failure nothing else touches it.
    if unsafe { libyaml_unsafe::yaml_parser_initialize(parser) }.fail {
        return None;
    }
    // SAFETY: the parser is initialized; `text` outlives it (the parser is deleted below,
    // before this function returns), and the length is the slice's own.
    unsafe {
        libyaml_unsafe::yaml_parser_set_input_string(parser, text.as_ptr(), text.len() as u64);
    }
    let mut out = Vec::new();
    let mut ok = true;
    loop {
        let mut event = std::mem::MaybeUninit::<libyaml_unsafe::yaml_event_t>::uninit();
        // SAFETY: the parser is initialized with live input; on success yaml_parser_parse
        // fills `event` completely.
        if unsafe { libyaml_unsafe::yaml_parser_parse(parser, event.as_mut_ptr()) }.fail {
            ok = false;
            break;
        }
        // SAFETY: filled by the successful parse above; its pointers are live until
        // yaml_event_delete below, and each union member read is the one `type_` names.
        let (converted, end) = unsafe {
            let e = &*event.as_ptr();
            let converted = match e.type_ {
                libyaml_unsafe::YAML_DOCUMENT_START_EVENT => Event::DocumentStart,
                libyaml_unsafe::YAML_DOCUMENT_END_EVENT => Event::DocumentEnd,
                libyaml_unsafe::YAML_STREAM_END_EVENT => Event::StreamEnd,
                libyaml_unsafe::YAML_ALIAS_EVENT => {
                    Event::Alias(c_text(e.data.alias.anchor).unwrap_or_default())
                }
                libyaml_unsafe::YAML_SCALAR_EVENT => {
                    let s = e.data.scalar;
                    let bytes = if s.value.is_null() {
                        &[][..]
                    } else {
                        std::slice::from_raw_parts(s.value, usize::try_from(s.length).unwrap_or(0))
                    };
                    Event::Scalar(
                        Scalar {
                            text: String::from_utf8_lossy(bytes).into_owned(),
                            plain: s.style == libyaml_unsafe::YAML_PLAIN_SCALAR_STYLE,
                            tag: c_text(s.tag),
                            line: e.start_mark.line.saturating_add(1),
                        },
                        c_text(s.anchor),
                    )
                }
                libyaml_unsafe::YAML_SEQUENCE_START_EVENT => {
                    Event::SeqStart(c_text(e.data.sequence_start.anchor))
                }
                libyaml_unsafe::YAML_SEQUENCE_END_EVENT => Event::SeqEnd,
                libyaml_unsafe::YAML_MAPPING_START_EVENT => {
                    Event::MapStart(c_text(e.data.mapping_start.anchor))
                }
                libyaml_unsafe::YAML_MAPPING_END_EVENT => Event::MapEnd,
                _ => Event::Other,
            };
            let end = e.type_ == libyaml_unsafe::YAML_STREAM_END_EVENT;
            libyaml_unsafe::yaml_event_delete(event.as_mut_ptr());
            (converted, end)
        };
        out.push(converted);
        if end {
            break;
        }
    }
    // SAFETY: initialized above and not used after this.
    unsafe { libyaml_unsafe::yaml_parser_delete(parser) };
    ok.then_some(out)
}

struct Builder {
    events: std::vec::IntoIter<Event>,
    /// Each anchor's node and its size in nodes.
    anchors: HashMap<String, (Node, usize)>,
    /// Nodes aliases may still copy: nested aliases ("billion laughs") grow a document
    /// exponentially, and a bound keeps that an error, not an out-of-memory abort.
    alias_budget: usize,
}

/// The nodes all aliases of one document may copy, together.
const MAX_ALIAS_NODES: usize = 1_000_000;

fn size(node: &Node) -> usize {
    match node {
        Node::Scalar(_) => 1,
        Node::Seq(items) => items.iter().map(size).fold(1, usize::saturating_add),
        Node::Map(entries) => entries
            .iter()
            .map(|(k, v)| size(k).saturating_add(size(v)))
            .fold(1, usize::saturating_add),
    }
}

impl Builder {
    fn document(&mut self) -> Result<Option<Node>, String> {
        loop {
            match self.events.next() {
                Some(Event::DocumentStart) => break,
                Some(Event::StreamEnd) | None => return Ok(None),
                Some(_) => {}
            }
        }
        match self.events.next() {
            Some(Event::DocumentEnd) | None => Ok(None),
            Some(first) => self.node(first, 0).map(Some),
        }
    }

    fn node(&mut self, event: Event, depth: usize) -> Result<Node, String> {
        // The tree is walked recursively (here and by the config's loader): a bound keeps a
        // pathological file an error, not a stack overflow. serde_yaml_ng stops at 128 too.
        if depth > MAX_DEPTH {
            return Err(format!(
                "recursion limit exceeded: more than {MAX_DEPTH} levels of nesting"
            ));
        }
        let (node, anchor) = match event {
            Event::Scalar(s, anchor) => (Node::Scalar(s), anchor),
            Event::Alias(name) => {
                let (node, nodes) = self
                    .anchors
                    .get(&name)
                    .ok_or_else(|| format!("unknown anchor '{name}' referenced"))?;
                self.alias_budget = self.alias_budget.checked_sub(*nodes).ok_or_else(|| {
                    format!("aliases expand to more than {MAX_ALIAS_NODES} nodes")
                })?;
                return Ok(node.clone());
            }
            Event::SeqStart(anchor) => {
                let mut items = Vec::new();
                loop {
                    match self.events.next() {
                        Some(Event::SeqEnd) => break,
                        Some(e) => items.push(self.node(e, depth + 1)?),
                        None => return Err("unexpected end of a sequence".into()),
                    }
                }
                (Node::Seq(items), anchor)
            }
            Event::MapStart(anchor) => {
                let mut entries: Vec<(Node, Node)> = Vec::new();
                loop {
                    let key = match self.events.next() {
                        Some(Event::MapEnd) => break,
                        Some(e) => self.node(e, depth + 1)?,
                        None => return Err("unexpected end of a mapping".into()),
                    };
                    let value = match self.events.next() {
                        Some(e) => self.node(e, depth + 1)?,
                        None => return Err("unexpected end of a mapping".into()),
                    };
                    let merge = matches!(&key, Node::Scalar(s) if s.plain && s.tag.is_none() && s.text == "<<");
                    if merge {
                        // yaml.v2 merges a map, or each map of a sequence, in place.
                        let sources = match value {
                            Node::Map(_) => vec![value],
                            Node::Seq(items) => items,
                            _ => {
                                return Err(
                                    "map merge requires map or sequence of maps as the value"
                                        .into(),
                                )
                            }
                        };
                        for source in sources {
                            match source {
                                Node::Map(inner) => entries.extend(inner),
                                _ => {
                                    return Err(
                                        "map merge requires map or sequence of maps as the value"
                                            .into(),
                                    )
                                }
                            }
                        }
                    } else {
                        entries.push((key, value));
                    }
                }
                (Node::Map(entries), anchor)
            }
            _ => return Err("unexpected YAML event".into()),
        };
        if let Some(name) = anchor {
            self.anchors.insert(name, (node.clone(), size(&node)));
        }
        Ok(node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scalar(text: &str) -> Resolved {
        resolve_plain(text)
    }

    #[test]
    fn plain_scalars_resolve_as_yaml_1_1() {
        // (text, what yaml.v2 resolves it to)
        let cases = [
            ("yes", Resolved::Bool(true)),
            ("On", Resolved::Bool(true)),
            ("y", Resolved::Bool(true)),
            ("NO", Resolved::Bool(false)),
            ("off", Resolved::Bool(false)),
            ("n", Resolved::Bool(false)),
            ("~", Resolved::Null),
            ("", Resolved::Null),
            ("0x1F", Resolved::Int(31)),
            ("0o17", Resolved::Int(15)),
            // A leading zero is octal, as Go's ParseInt reads it.
            ("01234", Resolved::Int(668)),
            ("0b101", Resolved::Int(5)),
            ("1_000", Resolved::Int(1000)),
            ("+5", Resolved::Int(5)),
            ("-3", Resolved::Int(-3)),
            // Not octal, so the float pattern takes it.
            ("08", Resolved::Float(8.0)),
            ("1.5", Resolved::Float(1.5)),
            ("1e3", Resolved::Float(1000.0)),
            (
                "12345678901234567890",
                Resolved::Int(12_345_678_901_234_567_890),
            ),
            ("abc", Resolved::Str),
            ("yesterday", Resolved::Str),
            ("2024-01-01", Resolved::Str),
            ("1.2.3", Resolved::Str),
        ];
        for (text, expected) in cases {
            assert_eq!(scalar(text), expected, "{text}");
        }
    }

    #[test]
    fn quoted_and_str_tagged_scalars_stay_strings_and_keep_their_text() {
        let node = parse("a: \"yes\"\nb: !!str 0x10\nc: 0x10\nd: '01234'\n")
            .unwrap()
            .unwrap();
        let get = |k: &str| match node.get(k) {
            Some(Node::Scalar(s)) => (s.text.clone(), s.resolve()),
            other => panic!("{other:?}"),
        };
        assert_eq!(get("a"), ("yes".into(), Resolved::Str));
        assert_eq!(get("b"), ("0x10".into(), Resolved::Str));
        assert_eq!(get("c"), ("0x10".into(), Resolved::Int(16)));
        assert_eq!(get("d"), ("01234".into(), Resolved::Str));
    }

    #[test]
    fn anchors_aliases_and_merge_keys_resolve() {
        let text = "base: &b {unit: minute, requests_per_unit: 5}\nother:\n  <<: *b\n  requests_per_unit: 7\ncopy: *b\n";
        let node = parse(text).unwrap().unwrap();
        let other = node.get("other").unwrap();
        let rpu = |n: &Node| match n.get("requests_per_unit") {
            Some(Node::Scalar(s)) => s.text.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(rpu(other), "7");
        assert!(other.get("unit").is_some());
        assert_eq!(rpu(node.get("copy").unwrap()), "5");
    }

    #[test]
    fn empty_documents_and_errors() {
        assert_eq!(parse("").unwrap(), None);
        assert_eq!(parse("# only a comment\n").unwrap(), None);
        assert!(parse("a: [\n").is_err());
        assert!(parse("a: *nowhere\n").is_err());
        let deep = "[".repeat(1000) + &"]".repeat(1000);
        assert!(parse(&deep).unwrap_err().contains("recursion limit"));
        let mut laughs = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..10 {
            let p = i - 1;
            laughs.push_str(&format!("a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"));
        }
        assert!(parse(&laughs).unwrap_err().contains("aliases expand"));
    }
}
