//! A bucket the Lua fallback wrote: [`FallbackState`], the instant of the fallback's packed
//! string (`"rl"` and three little-endian doubles `q`, `r`, `D`) or of its older hash
//! `{a = q, b = r, d = D}` (`clients/lua/rl.lua`, and the Functions library made from it),
//! validated and converted to a [`State`] without moving it earlier.
//!
//! The fallback stores the instant its bucket is full as `q + r/D` microseconds since the Unix
//! epoch (`0 <= r < D`, `1 <= D < 2^31`, `q < 2^53` where the script's doubles are exact). The
//! string holds them as the doubles the script computed (`struct.pack`, no text to format or
//! parse: the cheapest value a script can read and write); the hash as decimal texts written
//! by `string.format('%.0f')`: plain digits, no sign, no leading zero. Knows nothing of Redis
//! (the module reads the value and hands over the bytes) and nothing of limits: an instant is
//! the same instant under any rate.

use crate::state::State;
use crate::ticks::NS_PER_US;

/// The largest denominator the fallback writes: `D < 2^31`, so its products stay exact in
/// doubles.
pub const FALLBACK_MAX_DENOMINATOR: u64 = (1 << 31) - 1;
/// The largest whole-microsecond part the fallback writes: below 2^53 µs (in 2255), where its
/// doubles are exact. Every such instant is below [`crate::MAX_FULL_AT_NS`].
pub const FALLBACK_MAX_US: u64 = (1 << 53) - 1;

/// The first bytes of the fallback's string: `"rl"`, which the script writes and reads as the
/// little-endian 16-bit number 27762 (`struct.pack('<Hddd', 27762, q, r, D)`).
pub const PACKED_PREFIX: &[u8; 2] = b"rl";
/// The length of the fallback's string: the prefix and three 8-byte doubles.
pub const PACKED_LEN: usize = 26;

/// Why a value is not a fallback bucket. A caller that meets one treats the value as someone
/// else's (the module answers `WRONGTYPE`) and leaves it alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FallbackError {
    /// The named field (`"a"`, `"b"` or `"d"`, as in the hash) is not written as the fallback
    /// writes an integer: in the hash, ASCII digits only, no sign, no leading zero, at most 20
    /// digits; in the string, a double that is a whole number, not negative (a NaN or an
    /// infinity is neither).
    NotAnInteger(&'static str),
    /// The named field is an integer out of the fallback's range: `a` above
    /// [`FALLBACK_MAX_US`], `d` outside `1..=FALLBACK_MAX_DENOMINATOR`, or `b` not below `d`.
    OutOfRange(&'static str),
    /// A string that is not [`PACKED_LEN`] bytes starting with [`PACKED_PREFIX`].
    NotTheForm,
}

/// A fallback bucket's instant, `q + r/D` µs since the Unix epoch, validated: what a string
/// (or an older hash) written by the Lua fallback holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FallbackState {
    q_us: u64,
    r: u64,
    d: u64,
}

impl FallbackState {
    /// The instant `q_us + r/d` µs.
    ///
    /// # Errors
    /// [`FallbackError::OutOfRange`] unless `q_us <= FALLBACK_MAX_US`,
    /// `1 <= d <= FALLBACK_MAX_DENOMINATOR` and `r < d`.
    pub fn new(q_us: u64, r: u64, d: u64) -> Result<Self, FallbackError> {
        if q_us > FALLBACK_MAX_US {
            return Err(FallbackError::OutOfRange("a"));
        }
        if d == 0 || d > FALLBACK_MAX_DENOMINATOR {
            return Err(FallbackError::OutOfRange("d"));
        }
        if r >= d {
            return Err(FallbackError::OutOfRange("b"));
        }
        Ok(Self { q_us, r, d })
    }

    /// Parses the hash's three values, `a`, `b` and `d`, byte by byte.
    ///
    /// ```
    /// use rl_bucket::{FallbackError, FallbackState};
    ///
    /// let st = FallbackState::parse(b"1700000000000000", b"1", b"3").unwrap();
    /// assert_eq!((st.q_us(), st.r(), st.d()), (1_700_000_000_000_000, 1, 3));
    /// assert_eq!(
    ///     FallbackState::parse(b"1700000000000000", b"01", b"3"),
    ///     Err(FallbackError::NotAnInteger("b"))
    /// );
    /// ```
    ///
    /// # Errors
    /// [`FallbackError::NotAnInteger`] for a text the fallback would not write (a sign, a
    /// space, a leading zero, a decimal point, an exponent, any byte that is not a digit);
    /// [`FallbackError::OutOfRange`] as for [`FallbackState::new`].
    pub fn parse(a: &[u8], b: &[u8], d: &[u8]) -> Result<Self, FallbackError> {
        Self::new(integer(a, "a")?, integer(b, "b")?, integer(d, "d")?)
    }

    /// Reads the fallback's string: [`PACKED_PREFIX`], then `q`, `r` and `D` as little-endian
    /// IEEE doubles, [`PACKED_LEN`] bytes in all (the fields are named `a`, `b` and `d` in
    /// errors, as in the hash).
    ///
    /// ```
    /// use rl_bucket::{FallbackError, FallbackState};
    ///
    /// let mut value = b"rl".to_vec();
    /// for n in [1_700_000_000_000_000.0f64, 1.0, 3.0] {
    ///     value.extend_from_slice(&n.to_le_bytes());
    /// }
    /// let st = FallbackState::parse_packed(&value).unwrap();
    /// assert_eq!((st.q_us(), st.r(), st.d()), (1_700_000_000_000_000, 1, 3));
    /// assert_eq!(
    ///     FallbackState::parse_packed(b"rl:1700000000000000:1:3"),
    ///     Err(FallbackError::NotTheForm)
    /// );
    /// ```
    ///
    /// # Errors
    /// [`FallbackError::NotTheForm`] unless the value is [`PACKED_LEN`] bytes starting with
    /// [`PACKED_PREFIX`]; [`FallbackError::NotAnInteger`] for a double that is not a whole
    /// number at least 0 (a NaN, an infinity, a fraction, a negative); then
    /// [`FallbackError::OutOfRange`] as for [`FallbackState::new`].
    pub fn parse_packed(value: &[u8]) -> Result<Self, FallbackError> {
        if value.len() != PACKED_LEN {
            return Err(FallbackError::NotTheForm);
        }
        let numbers = value
            .strip_prefix(PACKED_PREFIX.as_slice())
            .ok_or(FallbackError::NotTheForm)?;
        // The `index`th double, named `field` in errors.
        let field = |index: usize, field: &'static str| {
            let bytes: [u8; 8] = numbers
                .get(index * 8..(index + 1) * 8)
                .and_then(|bytes| bytes.try_into().ok())
                .ok_or(FallbackError::NotTheForm)?;
            whole(f64::from_le_bytes(bytes), field)
        };
        Self::new(field(0, "a")?, field(1, "b")?, field(2, "d")?)
    }

    /// The value the fallback writes for this instant: what [`FallbackState::parse_packed`]
    /// reads back.
    pub fn packed(self) -> [u8; PACKED_LEN] {
        let mut out = [0u8; PACKED_LEN];
        let (prefix, numbers) = out.split_at_mut(PACKED_PREFIX.len());
        prefix.copy_from_slice(PACKED_PREFIX);
        // Each is below 2^53, so exact as a double.
        for (slot, n) in numbers.chunks_exact_mut(8).zip([self.q_us, self.r, self.d]) {
            slot.copy_from_slice(&(n as f64).to_le_bytes());
        }
        out
    }

    /// The whole microseconds, `q`.
    pub fn q_us(self) -> u64 {
        self.q_us
    }

    /// The remainder's numerator, `r`.
    pub fn r(self) -> u64 {
        self.r
    }

    /// The remainder's denominator, `D`.
    pub fn d(self) -> u64 {
        self.d
    }

    /// The same instant as a [`State`]: `full_at_ns = 1000 q + floor(1000 r / D)`, and the rest
    /// of the nanosecond, `(1000 r mod D) / D`, as `full_at_frac` in units of 2^-63 ns rounded
    /// up. Never earlier than the fallback's instant, and less than 2^-63 ns later.
    ///
    /// The rounding is invisible to every rate whose tick the instant is a whole number of:
    /// [`State`] decodes its fraction at such a tick exactly (see the crate docs, "Why it is
    /// exact"). That includes the rate that wrote it: the fallback's `D` for a rate is the
    /// denominator of `1e6 / rate` µs, the module's tick the denominator of `1e9 / rate` ns,
    /// which divides `D`, so `1000 r / D` ns is a whole number of ticks. At another rate (or
    /// a `D` of 2^30 from a rate the fallback rounds) the instant is re-expressed in that
    /// rate's ticks rounded up, as for any change of limit: later, never earlier.
    ///
    /// An instant within the first nanosecond of 1970 becomes 1 ns (a [`State`] is never
    /// zero): later, and full all the same.
    ///
    /// ```
    /// use rl_bucket::FallbackState;
    ///
    /// // A third of a µs past q: 333 ns and a third.
    /// let st = FallbackState::new(1_700_000_000_000_000, 1, 3).unwrap().state();
    /// assert_eq!(st.full_at_ns(), 1_700_000_000_000_000_333);
    /// assert_eq!(st.expire_at_ms(), 1_700_000_000_001);
    /// ```
    pub fn state(self) -> State {
        // q <= 2^53 - 1 and r < 2^31: 1000 q + 1000 < 2^63, and 1000 r < 2^41.
        let scaled_r = self.r.saturating_mul(NS_PER_US);
        let d = self.d.max(1);
        let full_at_ns = self
            .q_us
            .saturating_mul(NS_PER_US)
            .saturating_add(scaled_r / d);
        let rem = u128::from(scaled_r % d);
        // rem < d < 2^31, so rem × 2^63 fits in u128 and the quotient is below 2^63.
        let frac = u64::try_from((rem << 63).div_ceil(u128::from(d))).unwrap_or(u64::MAX);
        // Within the first nanosecond of 1970, 1 ns: later, and full all the same. Otherwise
        // the bounds above keep `from_parts` in range: full_at_ns < 2^63 and frac < 2^63.
        if full_at_ns == 0 {
            return State::EARLIEST;
        }
        State::from_parts(full_at_ns, frac).unwrap_or(State::EARLIEST)
    }
}

/// A double the fallback wrote as a whole number: finite, no fraction, at least 0 (`-0.0`, which
/// the script's comparisons take as 0, is 0), and below 2^64 (the range checks come after).
fn whole(n: f64, field: &'static str) -> Result<u64, FallbackError> {
    // 2^64 as a double; every whole double below it converts to u64 exactly.
    const TWO_POW_64: f64 = 18_446_744_073_709_551_616.0;
    if !(n.is_finite() && n.fract() == 0.0 && n >= 0.0) {
        return Err(FallbackError::NotAnInteger(field));
    }
    if n >= TWO_POW_64 {
        return Err(FallbackError::OutOfRange(field));
    }
    // Whole, non-negative and below 2^64: the cast is exact.
    Ok(n as u64)
}

/// A non-negative integer written as `%.0f` writes one: one or more ASCII digits, no leading
/// zero unless it is `0` itself, and (to bound the work) at most 20 digits.
fn integer(text: &[u8], field: &'static str) -> Result<u64, FallbackError> {
    let canonical = !text.is_empty()
        && text.len() <= 20
        && text.iter().all(u8::is_ascii_digit)
        && (text.len() == 1 || text.first() != Some(&b'0'));
    if !canonical {
        return Err(FallbackError::NotAnInteger(field));
    }
    text.iter()
        .try_fold(0u64, |n, &digit| {
            n.checked_mul(10)?
                .checked_add(u64::from(digit.checked_sub(b'0')?))
        })
        .ok_or(FallbackError::OutOfRange(field))
}
