"""Numbers as the module reads them: the text sent for a caller's number, and its exact value.

The module parses `rate`, `capacity` and `cost` as exact decimals (an optional `+`, digits with
at most one point and a digit on at least one side of it, an optional exponent `e`/`E` with an
optional sign; at most 38 significant digits), and `rate` also as `N/S`,
N tokens per S seconds. This library sends the shortest decimal that round-trips the caller's
number (`repr`, or the digits of an integer), and every local computation (the in-process
bucket, the Lua script's arguments) uses that text's exact value, not the double's: `0.1` is
one tenth. Nothing here does I/O or imports another module of the package.
"""

import datetime
import math
import re
from fractions import Fraction

#: The module's decimal grammar (rl_bucket::Decimal::parse; its 38-digit cap is not checked
#: here: `text` never writes more than 17 significant digits for a float).
DECIMAL = re.compile(r"\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


def text(value):
    """The shortest decimal text of a finite number: an int's digits, or a float's `repr`
    ("0.1", "1e-06", "2500"). Raises ValueError for anything that is not a finite number."""
    if isinstance(value, bool):
        raise ValueError("not a number")
    if isinstance(value, int):
        return str(value)
    number = float(value)  # ValueError or TypeError for what is no number
    if not math.isfinite(number):
        raise ValueError("not a finite number")
    if number.is_integer() and abs(number) < 2**53:
        return str(int(number))
    return repr(number)


def seconds_text(value):
    """A period in seconds as decimal text: a number, or a `datetime.timedelta` (exact to
    its microsecond)."""
    if isinstance(value, datetime.timedelta):
        micros = value // datetime.timedelta(microseconds=1)
        whole, frac = divmod(abs(micros), 10**6)
        sign = "-" if micros < 0 else ""
        return f"{sign}{whole}" if frac == 0 else f"{sign}{whole}.{frac:06d}".rstrip("0")
    return text(value)


def exact(value):
    """The exact value of a number as the module reads it: Fraction(text(value)). A Fraction
    passes through unchanged."""
    if isinstance(value, Fraction):
        return value
    return Fraction(text(value))


def parse(decimal_text):
    """The exact value of a decimal string in the module's grammar; ValueError otherwise."""
    if not DECIMAL.fullmatch(decimal_text):
        raise ValueError(f"not a decimal: {decimal_text!r}")
    return Fraction(decimal_text)


def parse_rate(rate_text):
    """The exact tokens per second of a rate string: a decimal, or `N/S`."""
    count, slash, period = rate_text.partition("/")
    if not slash:
        return parse(count)
    seconds = parse(period)
    if seconds == 0:
        raise ValueError(f"a rate over 0 seconds: {rate_text!r}")
    return parse(count) / seconds
