//! Kubernetes resource quantities (`1Gi`, `500m`, `1e3`): parsing with the
//! grammar and errors of apimachinery's `resource.ParseQuantity`, and the
//! canonical form its `String()` prints, which is what validation messages
//! quote. Values are kept as nano-units in an `i128` (the real type rounds
//! anything finer up to a nano-unit too).

use std::cmp::Ordering;

const NANOS_PER_UNIT: i128 = 1_000_000_000;

/// Why a string is not a quantity; the texts are apimachinery's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantityError {
    Format,
    Suffix,
    Numeric,
}

impl std::fmt::Display for QuantityError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            QuantityError::Format => {
                "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
            }
            QuantityError::Suffix => "unable to parse quantity's suffix",
            QuantityError::Numeric => "unable to parse numeric part of quantity",
        })
    }
}

impl std::error::Error for QuantityError {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    DecimalSI,
    BinarySI,
    DecimalExponent,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantity {
    nanos: i128,
    format: Format,
}

struct Parts<'a> {
    positive: bool,
    num: &'a str,
    denom: &'a str,
    suffix: &'a str,
}

fn split(s: &str) -> Result<Parts<'_>, QuantityError> {
    let b = s.as_bytes();
    let end = b.len();
    let mut pos = 0;
    let mut positive = true;
    match b.first() {
        Some(b'-') => {
            positive = false;
            pos = 1;
        }
        Some(b'+') => pos = 1,
        _ => {}
    }
    while pos < end && b[pos] == b'0' {
        pos += 1;
    }
    if pos >= end {
        return Ok(Parts {
            positive,
            num: "0",
            denom: "",
            suffix: "",
        });
    }
    let num_start = pos;
    while pos < end && b[pos].is_ascii_digit() {
        pos += 1;
    }
    let num = match &s[num_start..pos] {
        "" => "0",
        n => n,
    };
    let mut denom = "";
    if pos < end && b[pos] == b'.' {
        pos += 1;
        let d = pos;
        while pos < end && b[pos].is_ascii_digit() {
            pos += 1;
        }
        denom = &s[d..pos];
    }
    let suffix_start = pos;
    while pos < end && b"eEinumkKMGTP".contains(&b[pos]) {
        pos += 1;
    }
    if pos < end && matches!(b[pos], b'-' | b'+') {
        pos += 1;
    }
    while pos < end && b[pos].is_ascii_digit() {
        pos += 1;
    }
    if pos < end {
        return Err(QuantityError::Format);
    }
    Ok(Parts {
        positive,
        num,
        denom,
        suffix: &s[suffix_start..],
    })
}

/// `(base, exponent, format)` of a suffix.
fn interpret(suffix: &str) -> Option<(u32, i32, Format)> {
    let binary = |e| Some((2, e, Format::BinarySI));
    let decimal = |e| Some((10, e, Format::DecimalSI));
    match suffix {
        "Ki" => binary(10),
        "Mi" => binary(20),
        "Gi" => binary(30),
        "Ti" => binary(40),
        "Pi" => binary(50),
        "Ei" => binary(60),
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "" => decimal(0),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        s if s.starts_with(['e', 'E']) => s[1..]
            .parse::<i32>()
            .ok()
            .map(|e| (10, e, Format::DecimalExponent)),
        _ => None,
    }
}

fn pow10(e: u32) -> i128 {
    10i128.saturating_pow(e)
}

impl Quantity {
    /// `bytes` in binary SI, as Go's `resource.NewQuantity(bytes, resource.BinarySI)`.
    pub fn binary(bytes: i64) -> Self {
        Self {
            nanos: i128::from(bytes) * NANOS_PER_UNIT,
            format: Format::BinarySI,
        }
    }

    /// Parses a quantity as the API server decodes one.
    pub fn parse(s: &str) -> Result<Self, QuantityError> {
        if s.is_empty() {
            return Err(QuantityError::Format);
        }
        let p = split(s)?;
        let (base, exponent, mut format) = interpret(p.suffix).ok_or(QuantityError::Suffix)?;
        let digits = format!("{}{}", p.num, p.denom);
        let digits: i128 = digits
            .trim_start_matches('0')
            .chars()
            .try_fold(0i128, |acc, c| {
                c.to_digit(10)
                    .map(|d| acc.saturating_mul(10).saturating_add(i128::from(d)))
            })
            .ok_or(QuantityError::Numeric)?;
        // value = digits * 10^-len(denom) * base^exponent, in nano-units.
        let mut scale10 = 9 - i32::try_from(p.denom.len()).unwrap_or(i32::MAX);
        let mut magnitude = digits;
        if base == 2 {
            magnitude = magnitude.saturating_mul(1i128 << exponent.clamp(0, 100));
        } else {
            scale10 = scale10.saturating_add(exponent);
        }
        magnitude = if scale10 >= 0 {
            magnitude.saturating_mul(pow10(scale10.unsigned_abs()))
        } else {
            // Anything finer than a nano-unit rounds up, away from zero.
            let div = pow10(scale10.unsigned_abs());
            if div == i128::MAX {
                i128::from(magnitude != 0)
            } else {
                magnitude / div + i128::from(magnitude % div != 0)
            }
        };
        if format == Format::BinarySI {
            magnitude = magnitude.min(i128::from(i64::MAX) * NANOS_PER_UNIT);
            if magnitude > 0 && magnitude < NANOS_PER_UNIT {
                format = Format::DecimalSI;
            }
        }
        if magnitude == 0 {
            format = Format::DecimalSI;
        }
        Ok(Self {
            nanos: if p.positive { magnitude } else { -magnitude },
            format,
        })
    }

    pub fn is_zero(&self) -> bool {
        self.nanos == 0
    }

    pub fn signum(&self) -> i32 {
        self.nanos.signum() as i32
    }

    /// The value in whole units, rounded away from zero (Go's `Value()`).
    pub fn value(&self) -> i128 {
        let whole = self.nanos / NANOS_PER_UNIT;
        whole + self.nanos.signum() * i128::from(self.nanos % NANOS_PER_UNIT != 0)
    }

    /// The canonical form (Go's `String()`).
    pub fn canonical(&self) -> String {
        if self.nanos == 0 {
            return "0".into();
        }
        let mut format = self.format;
        if format == Format::BinarySI
            && (self.nanos.abs() < 1024 * NANOS_PER_UNIT || self.nanos % NANOS_PER_UNIT != 0)
        {
            format = Format::DecimalSI;
        }
        if format == Format::BinarySI {
            let mut v = self.nanos / NANOS_PER_UNIT;
            let mut power = 0;
            while power < 6 && v % 1024 == 0 {
                v /= 1024;
                power += 1;
            }
            let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][power];
            return format!("{v}{suffix}");
        }
        let mut mantissa = self.nanos;
        let mut exponent: i32 = -9;
        while mantissa % 10 == 0 {
            mantissa /= 10;
            exponent += 1;
        }
        match exponent.rem_euclid(3) {
            1 => {
                mantissa = mantissa.saturating_mul(10);
                exponent -= 1;
            }
            2 => {
                mantissa = mantissa.saturating_mul(100);
                exponent -= 2;
            }
            _ => {}
        }
        if format == Format::DecimalExponent {
            return if exponent == 0 {
                mantissa.to_string()
            } else {
                format!("{mantissa}e{exponent}")
            };
        }
        if exponent > 18 {
            mantissa = mantissa.saturating_mul(pow10((exponent - 18).unsigned_abs()));
            exponent = 18;
        }
        let suffix = match exponent {
            -9 => "n",
            -6 => "u",
            -3 => "m",
            3 => "k",
            6 => "M",
            9 => "G",
            12 => "T",
            15 => "P",
            18 => "E",
            _ => "",
        };
        format!("{mantissa}{suffix}")
    }
}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> Ordering {
        self.nanos.cmp(&other.nanos)
    }
}

/// A quantity as it appears in JSON: a string, or a number (which the Go
/// decoder accepts too). `None` for `null`.
pub fn from_json(v: &serde_json::Value) -> Option<Result<Quantity, QuantityError>> {
    match v {
        serde_json::Value::Null => None,
        serde_json::Value::String(s) => Some(Quantity::parse(s.trim())),
        serde_json::Value::Number(n) => Some(Quantity::parse(&n.to_string())),
        _ => Some(Err(QuantityError::Format)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(s: &str) -> String {
        Quantity::parse(s).unwrap().canonical()
    }

    #[test]
    fn canonical_forms_match_apimachinery() {
        for (input, want) in [
            ("1Gi", "1Gi"),
            ("0.5Gi", "512Mi"),
            ("1.5Gi", "1536Mi"),
            ("1024", "1024"),
            ("1000", "1k"),
            ("1000Mi", "1000Mi"),
            ("1024Mi", "1Gi"),
            ("1073741824", "1073741824"),
            ("-1", "-1"),
            ("-1Gi", "-1Gi"),
            ("0", "0"),
            ("-0", "0"),
            ("0Gi", "0"),
            ("100m", "100m"),
            ("0.1", "100m"),
            ("1e3", "1e3"),
            ("1E", "1E"),
            ("12e2", "1200"),
            ("512Ki", "512Ki"),
            ("0.5Ki", "512"),
            ("1.0000000001", "1000000001n"),
        ] {
            assert_eq!(canon(input), want, "{input}");
        }
    }

    #[test]
    fn errors_and_comparisons() {
        assert_eq!(Quantity::parse(""), Err(QuantityError::Format));
        assert_eq!(Quantity::parse("1x"), Err(QuantityError::Format));
        assert_eq!(Quantity::parse("1Gb"), Err(QuantityError::Format));
        assert_eq!(Quantity::parse("1Zi"), Err(QuantityError::Format));
        assert_eq!(Quantity::parse("1ki"), Err(QuantityError::Suffix));
        assert_eq!(Quantity::parse("abc"), Err(QuantityError::Format));
        assert!(Quantity::parse("1Gi").unwrap() > Quantity::parse("1G").unwrap());
        assert_eq!(
            Quantity::parse("1024Mi").unwrap(),
            Quantity::parse("1Gi").unwrap()
        );
        assert_eq!(Quantity::parse("-1").unwrap().signum(), -1);
        assert_eq!(Quantity::parse("0.5").unwrap().value(), 1);
        assert_eq!(Quantity::parse("-1.5").unwrap().value(), -2);
    }
}
