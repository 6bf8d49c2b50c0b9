//! The Lua fallback every library ships (`clients/lua/rl.lua`), as the parity tests run it
//! beside the module: the script verbatim, the script deciding at a given instant, and the
//! three rates whose `1e9 / rate` ns is not whole, as the module's rate text and the
//! script's exact numbers.

/// The fallback script every library ships, verbatim.
pub const SCRIPT: &str = include_str!("../../clients/lua/rl.lua");

/// The script's one clock read.
const CLOCK_LINE: &str = "local t = redis.call('TIME')";

/// The script with its clock read replaced by its last two arguments (seconds, µs): the
/// same code, deciding at a given instant.
pub fn pinned_script() -> String {
    assert_eq!(
        SCRIPT.matches(CLOCK_LINE).count(),
        1,
        "the script's clock read moved"
    );
    SCRIPT.replacen(CLOCK_LINE, "local t = {ARGV[#ARGV - 1], ARGV[#ARGV]}", 1)
}

/// A limit of `n` tokens every `per_s` seconds with an integer capacity, as the module's
/// rate text and the script's exact numbers.
#[derive(Clone, Copy, Debug)]
pub struct Rate {
    pub text: &'static str,
    pub n: u128,
    pub per_s: u128,
    pub capacity: u128,
}

/// The three rates whose `1e9 / rate` ns is not whole.
pub const RATES: [Rate; 3] = [
    Rate {
        text: "3",
        n: 3,
        per_s: 1,
        capacity: 30,
    },
    Rate {
        text: "7",
        n: 7,
        per_s: 1,
        capacity: 70,
    },
    Rate {
        text: "3/10",
        n: 3,
        per_s: 10,
        capacity: 24,
    },
];

fn gcd(a: u128, b: u128) -> u128 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl Rate {
    /// The script's 10 numbers for `cost` (clients/lua/rl.lua's header): `T = 1e6 × per_s / n`
    /// µs over its reduced denominator `D`; with integer capacity and cost every product is a
    /// whole number of `1/D` µs, so all are exact.
    pub fn numbers(self, cost: u128) -> Vec<String> {
        let top = 1_000_000 * self.per_s;
        let g = gcd(top, self.n);
        let (t_units, d) = (top / g, self.n / g);
        let pair = |units: u128| [(units / d).to_string(), (units % d).to_string()];
        let slack = if cost > self.capacity {
            ["-1".to_string(), "0".to_string()]
        } else {
            pair((self.capacity - cost) * t_units)
        };
        let mut out = vec![d.to_string()];
        out.extend(pair(t_units));
        out.extend(pair(self.capacity * t_units));
        out.extend(slack);
        out.extend(pair(cost * t_units));
        out.push(self.capacity.to_string());
        out
    }

    /// The capacity as the module's argument.
    pub fn cap(self) -> String {
        self.capacity.to_string()
    }
}
