//! A cost: a request's size in tokens, an exact decimal `>= 0`, parsed from its text or
//! taken from a double's shortest decimal.
//!
//! Depends on [`Decimal`] only: whether a cost fits a limit is the limit's question
//! (`Limit::cost_ticks`), not the cost's. No Redis, no clock.

use crate::decimal::Decimal;

/// A request's size in tokens: an exact decimal `>= 0`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cost(pub(crate) Decimal);

impl Cost {
    /// One token, the default cost.
    pub const ONE: Cost = Cost(Decimal::ONE);

    /// Parses a cost from its text, exactly (the grammar of [`Decimal::parse`]). `None` for
    /// anything that is not a decimal `>= 0`.
    ///
    /// ```
    /// use rl_bucket::Cost;
    ///
    /// assert_eq!(Cost::parse(b"1"), Some(Cost::ONE));
    /// assert_eq!(Cost::parse(b"-1"), None);
    /// ```
    pub fn parse(text: &[u8]) -> Option<Self> {
        Decimal::parse(text).map(Self)
    }

    /// An exact decimal cost.
    pub fn from_decimal(tokens: Decimal) -> Self {
        Self(tokens)
    }

    /// `None` unless `tokens` is finite and `>= 0`. The double is taken as the shortest
    /// decimal that reads back as it, as [`Limit::new`](crate::Limit::new) takes its numbers.
    pub fn new(tokens: f64) -> Option<Self> {
        Decimal::from_f64(tokens).map(Self)
    }

    /// The cost in tokens, as the nearest double.
    pub fn tokens(self) -> f64 {
        self.0.to_f64()
    }

    /// The cost in tokens, exactly.
    pub fn exact(self) -> Decimal {
        self.0
    }
}
