//! The table-driven shape of the command tests (RedisBloom's `test_validation`): one table of
//! rows, each the arguments after a command's name and the exact reply or error text it must
//! get, run in order, with every wrong row listed in one failure.
//!
//! [`assert_table`] runs a table on a connection, so rows see what earlier rows wrote (a
//! transcript); [`assert_rejected_on_empty_server`] runs a table of bad arguments on a new,
//! empty server and also checks that no row created a key and the server still answers.

use redis::{Connection, Value};

use crate::{command, dbsize, error_reply_text, exists, show, Server};

/// What a row must get back.
#[derive(Clone, Copy, Debug)]
pub enum Want<'a> {
    /// A reply of exactly these integers (a flat array, or one integer).
    Ints(&'a [i64]),
    /// An error reply of exactly this text, code first.
    Error(&'a str),
}

/// What a table's second column may be: an error text (`&str`, `String`, `&String`), or a
/// [`Want`].
pub trait Expected {
    /// The row's expectation.
    fn want(&self) -> Want<'_>;
}

impl<T: Expected + ?Sized> Expected for &T {
    fn want(&self) -> Want<'_> {
        (**self).want()
    }
}

impl Expected for str {
    fn want(&self) -> Want<'_> {
        Want::Error(self)
    }
}

impl Expected for String {
    fn want(&self) -> Want<'_> {
        Want::Error(self)
    }
}

impl Expected for Want<'_> {
    fn want(&self) -> Want<'_> {
        *self
    }
}

/// Runs `name args…` and says how the reply differs from `want`, or `None` when it matches.
fn mismatch(con: &mut Connection, name: &str, args: &[&[u8]], want: Want<'_>) -> Option<String> {
    let got = match command(name, args).query::<Value>(con) {
        Err(e) => Want::Error(&error_reply_text(&e)).describe_match(want)?,
        Ok(reply) => match redis::from_redis_value::<Vec<i64>>(reply.clone()) {
            Ok(ints) => Want::Ints(&ints).describe_match(want)?,
            Err(_) => format!("{reply:?}"),
        },
    };
    Some(format!(
        "{name} {}\n   got: {got}\n  want: {}",
        show(args),
        want.describe()
    ))
}

impl Want<'_> {
    fn describe(self) -> String {
        match self {
            Want::Ints(ints) => format!("{ints:?}"),
            Want::Error(text) => text.to_string(),
        }
    }

    /// `None` when `self` (what came back) is `want`, else what came back, described.
    fn describe_match(self, want: Want<'_>) -> Option<String> {
        let same = match (self, want) {
            (Want::Ints(got), Want::Ints(want)) => got == want,
            (Want::Error(got), Want::Error(want)) => got == want,
            _ => false,
        };
        (!same).then(|| self.describe())
    }
}

/// Each row's arguments as the byte strings `command` sends.
fn row_args<'r, A, S>(args: &'r A) -> Vec<&'r [u8]>
where
    A: AsRef<[S]>,
    S: AsRef<[u8]> + 'r,
{
    args.as_ref().iter().map(AsRef::as_ref).collect()
}

/// Fails listing every wrong row, or passes when there is none.
fn assert_no_wrong_rows(wrong: &[String], rows: usize) {
    assert!(
        wrong.is_empty(),
        "{} of {rows} rows got the wrong reply:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// Runs each row, `name args…`, in order on `con`: each must get exactly its reply (the
/// integers, or the error text). Later rows see what earlier ones wrote.
pub fn assert_table<A, S, W>(con: &mut Connection, name: &str, rows: &[(A, W)])
where
    A: AsRef<[S]>,
    S: AsRef<[u8]>,
    W: Expected,
{
    let wrong: Vec<String> = rows
        .iter()
        .filter_map(|(args, want)| mismatch(con, name, &row_args(args), want.want()))
        .collect();
    assert_no_wrong_rows(&wrong, rows.len());
}

/// Runs each row, `name args…` with the exact error text it must get, against a new, empty
/// server: the exact error text, no key created (`k` nor any other), and PING still answers.
pub fn assert_rejected_on_empty_server<A, S, W>(name: &str, rows: &[(A, W)])
where
    A: AsRef<[S]>,
    S: AsRef<[u8]>,
    W: Expected,
{
    let server = Server::start();
    let mut con = server.conn();
    // Wrong texts are collected so one run lists every failing row.
    let mut wrong = Vec::new();
    for (args, want) in rows {
        let args = row_args(args);
        wrong.extend(mismatch(&mut con, name, &args, want.want()));
        assert!(
            !exists(&mut con, b"k"),
            "{name} {} created the key",
            show(&args)
        );
        assert_eq!(dbsize(&mut con), 0, "{name} {} created a key", show(&args));
        server.assert_alive();
    }
    assert_no_wrong_rows(&wrong, rows.len());
}
