//! Money: an exact decimal amount in a currency. Never a float. Rounding to the currency's minor
//! unit happens once, at the invoice line, half to even (banker's rounding).

use std::fmt;
use std::str::FromStr;

use rust_decimal::{Decimal, RoundingStrategy};
use serde::{Deserialize, Serialize};

/// An ISO 4217 currency with the number of digits of its minor unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Currency {
    Cny,
    Usd,
    Eur,
    Jpy,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown currency `{0}`; known: CNY, USD, EUR, JPY")]
pub struct UnknownCurrency(pub String);

impl Currency {
    pub fn code(self) -> &'static str {
        match self {
            Currency::Cny => "CNY",
            Currency::Usd => "USD",
            Currency::Eur => "EUR",
            Currency::Jpy => "JPY",
        }
    }

    /// Digits after the decimal point of the smallest coin or note.
    pub fn minor_units(self) -> u32 {
        match self {
            Currency::Jpy => 0,
            _ => 2,
        }
    }

    /// Rounds half to even to the minor unit.
    pub fn round(self, amount: Decimal) -> Decimal {
        let mut rounded = amount
            .round_dp_with_strategy(self.minor_units(), RoundingStrategy::MidpointNearestEven);
        rounded.rescale(self.minor_units());
        rounded
    }
}

impl FromStr for Currency {
    type Err = UnknownCurrency;
    fn from_str(code: &str) -> Result<Self, UnknownCurrency> {
        match code {
            "CNY" => Ok(Currency::Cny),
            "USD" => Ok(Currency::Usd),
            "EUR" => Ok(Currency::Eur),
            "JPY" => Ok(Currency::Jpy),
            _ => Err(UnknownCurrency(code.to_owned())),
        }
    }
}

impl TryFrom<String> for Currency {
    type Error = UnknownCurrency;
    fn try_from(code: String) -> Result<Self, UnknownCurrency> {
        code.parse()
    }
}

impl From<Currency> for String {
    fn from(c: Currency) -> String {
        c.code().to_owned()
    }
}

impl fmt::Display for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// An amount of money in a currency.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Money {
    pub amount: Decimal,
    pub currency: Currency,
}

impl Money {
    pub fn new(amount: Decimal, currency: Currency) -> Self {
        Money { amount, currency }
    }

    pub fn zero(currency: Currency) -> Self {
        Money::new(Decimal::ZERO, currency)
    }

    /// This amount rounded half to even to the currency's minor unit.
    pub fn rounded(self) -> Self {
        Money::new(self.currency.round(self.amount), self.currency)
    }
}

impl fmt::Display for Money {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.amount, self.currency)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rust_decimal_macros::dec;

    #[test]
    fn rounds_half_to_even_at_the_minor_unit() {
        assert_eq!(Currency::Cny.round(dec!(2.345)), dec!(2.34));
        assert_eq!(Currency::Cny.round(dec!(2.355)), dec!(2.36));
        assert_eq!(Currency::Cny.round(dec!(7)).to_string(), "7.00");
        assert_eq!(Currency::Jpy.round(dec!(10.5)), dec!(10));
    }

    #[test]
    fn unknown_currency_says_what_is_known() {
        assert_eq!(
            "XYZ".parse::<Currency>().unwrap_err().to_string(),
            "unknown currency `XYZ`; known: CNY, USD, EUR, JPY"
        );
    }
}
