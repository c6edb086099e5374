//! Money: integer micro-units with checked arithmetic.
//!
//! 1 unit = 1_000_000 micro-units. Amounts are parsed from and formatted to exact decimals
//! (`"0.35"` is exactly 350_000 micro-units); more than six decimals is an error, never a silent
//! rounding. Overflow is an error, never a wrap.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Micro-units in one unit.
pub const MICROS_PER_UNIT: u64 = 1_000_000;

/// The unit's name as tables and bills show it: gridlease units. An accounting unit: both
/// parties sign amounts in it (offers, receipts, statements) and each node keeps the ledger,
/// but gridlease does not move money itself yet; settling a statement in a currency is the
/// parties' business.
pub const UNIT: &str = "GLU";

/// An amount of money in micro-units.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Money(u64);

/// Arithmetic or parsing failures.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MoneyError {
    /// The result does not fit in u64 micro-units.
    #[error("amount overflow")]
    Overflow,
    /// Subtracting more than there is.
    #[error("amount underflow: {have} - {take}")]
    Underflow {
        /// Minuend.
        have: Money,
        /// Subtrahend.
        take: Money,
    },
    /// Text that is not a decimal amount.
    #[error("{input:?} is not an amount: {problem}")]
    Parse {
        /// The input.
        input: String,
        /// What is wrong.
        problem: &'static str,
    },
}

impl Money {
    /// Zero.
    pub const ZERO: Self = Self(0);

    /// From micro-units.
    pub const fn from_micros(micros: u64) -> Self {
        Self(micros)
    }

    /// Whole units, checked.
    pub fn from_units(units: u64) -> Result<Self, MoneyError> {
        units
            .checked_mul(MICROS_PER_UNIT)
            .map(Self)
            .ok_or(MoneyError::Overflow)
    }

    /// The micro-units.
    pub const fn micros(self) -> u64 {
        self.0
    }

    /// `self + other`, or an overflow error.
    pub fn checked_add(self, other: Self) -> Result<Self, MoneyError> {
        self.0
            .checked_add(other.0)
            .map(Self)
            .ok_or(MoneyError::Overflow)
    }

    /// `self - other`, or an underflow error.
    pub fn checked_sub(self, other: Self) -> Result<Self, MoneyError> {
        self.0
            .checked_sub(other.0)
            .map(Self)
            .ok_or(MoneyError::Underflow {
                have: self,
                take: other,
            })
    }

    /// `self - other`, or zero.
    pub fn saturating_sub(self, other: Self) -> Self {
        Self(self.0.saturating_sub(other.0))
    }

    /// `self * n`, or an overflow error.
    pub fn checked_mul(self, n: u64) -> Result<Self, MoneyError> {
        self.0.checked_mul(n).map(Self).ok_or(MoneyError::Overflow)
    }

    /// Sums amounts, or an overflow error.
    pub fn checked_sum<I: IntoIterator<Item = Self>>(items: I) -> Result<Self, MoneyError> {
        items
            .into_iter()
            .try_fold(Self::ZERO, |acc, m| acc.checked_add(m))
    }
}

impl fmt::Display for Money {
    /// At least two decimals, at most six, trailing zeros beyond two dropped: `0.35`, `1.00`,
    /// `0.000001`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let units = self.0 / MICROS_PER_UNIT;
        let frac = self.0 % MICROS_PER_UNIT;
        let mut digits = format!("{frac:06}");
        while digits.len() > 2 && digits.ends_with('0') {
            digits.pop();
        }
        let s = format!("{units}.{digits}");
        f.pad(&s)
    }
}

impl FromStr for Money {
    type Err = MoneyError;

    /// Parses `12`, `0.35`, `.5`, `1.000001`. Refuses signs, exponents, spaces, more than six
    /// decimals and amounts over `u64::MAX` micro-units.
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = |problem| MoneyError::Parse {
            input: input.to_string(),
            problem,
        };
        if input.is_empty() {
            return Err(err("empty"));
        }
        let (int, frac) = match input.split_once('.') {
            Some((i, f)) => (i, f),
            None => (input, ""),
        };
        if int.is_empty() && frac.is_empty() {
            return Err(err("no digits"));
        }
        if !int.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err("only digits and one '.' are allowed"));
        }
        if frac.len() > 6 {
            return Err(err(
                "more than six decimals (the smallest amount is 0.000001)",
            ));
        }
        let units: u64 = if int.is_empty() {
            0
        } else {
            int.parse().map_err(|_| err("too large"))?
        };
        let mut micros_frac: u64 = 0;
        for (i, b) in frac.bytes().enumerate() {
            // frac has at most 6 digits, so 10^(5-i) is exact.
            micros_frac += u64::from(b - b'0') * 10u64.pow(5 - i as u32);
        }
        units
            .checked_mul(MICROS_PER_UNIT)
            .and_then(|m| m.checked_add(micros_frac))
            .map(Self)
            .ok_or_else(|| err("too large"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_exact_decimals() {
        assert_eq!("0.35".parse::<Money>().unwrap().micros(), 350_000);
        assert_eq!("12".parse::<Money>().unwrap().micros(), 12_000_000);
        assert_eq!(".5".parse::<Money>().unwrap().micros(), 500_000);
        assert_eq!("1.000001".parse::<Money>().unwrap().micros(), 1_000_001);
        assert_eq!("0.1".parse::<Money>().unwrap().micros(), 100_000);
    }

    #[test]
    fn refuses_bad_amounts() {
        for bad in [
            "",
            ".",
            "-1",
            "+1",
            "1e3",
            " 1",
            "1 ",
            "1.2.3",
            "0.0000001",
            "abc",
            "1,5",
            "18446744073710",
            "99999999999999999999",
        ] {
            assert!(bad.parse::<Money>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn formats_with_two_to_six_decimals() {
        assert_eq!(Money::from_micros(350_000).to_string(), "0.35");
        assert_eq!(Money::from_micros(1_000_000).to_string(), "1.00");
        assert_eq!(Money::from_micros(1).to_string(), "0.000001");
        assert_eq!(Money::from_micros(123_456_789).to_string(), "123.456789");
        assert_eq!(format!("{:>8}", Money::from_micros(500_000)), "    0.50");
    }

    #[test]
    fn overflow_is_an_error() {
        let max = Money::from_micros(u64::MAX);
        assert_eq!(
            max.checked_add(Money::from_micros(1)),
            Err(MoneyError::Overflow)
        );
        assert_eq!(max.checked_mul(2), Err(MoneyError::Overflow));
        assert!(Money::ZERO.checked_sub(Money::from_micros(1)).is_err());
        assert_eq!(Money::from_units(u64::MAX), Err(MoneyError::Overflow));
    }

    proptest! {
        #[test]
        fn display_then_parse_is_identity(m in any::<u64>()) {
            let money = Money::from_micros(m);
            prop_assert_eq!(money.to_string().parse::<Money>().unwrap(), money);
        }
    }
}
