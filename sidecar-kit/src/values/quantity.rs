//! Kubernetes resource quantities (`1Gi`, `500M`, `1.5e9`) as byte counts, and byte counts in
//! the canonical form the API server writes.

/// Why a quantity could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {0:?}"
)]
pub struct QuantityError(pub String);

/// The value of a quantity in whole units, rounded up as `resource.Quantity.Value()` rounds;
/// `None` is never returned for a valid quantity (values beyond `i128` are errors).
pub fn parse(text: &str) -> Result<i128, QuantityError> {
    let bad = || QuantityError(text.to_string());
    let trimmed = text.trim();
    let (negative, unsigned) = match trimmed.as_bytes().first() {
        Some(b'-') => (true, &trimmed[1..]),
        Some(b'+') => (false, &trimmed[1..]),
        _ => (false, trimmed),
    };
    let number_end = unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(number_end);
    if number.is_empty() || number == "." || number.matches('.').count() > 1 {
        return Err(bad());
    }
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    // The value is digits × 10^exp10 × 2^exp2.
    let digits: String = format!("{whole}{fraction}");
    let mut mantissa: i128 = 0;
    for d in digits.bytes() {
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(i128::from(d - b'0')))
            .ok_or_else(bad)?;
    }
    let mut exp10 = -(fraction.len() as i32);
    let mut exp2 = 0u32;
    match suffix {
        "" => {}
        "Ki" => exp2 = 10,
        "Mi" => exp2 = 20,
        "Gi" => exp2 = 30,
        "Ti" => exp2 = 40,
        "Pi" => exp2 = 50,
        "Ei" => exp2 = 60,
        "n" => exp10 -= 9,
        "u" => exp10 -= 6,
        "m" => exp10 -= 3,
        "k" => exp10 += 3,
        "M" => exp10 += 6,
        "G" => exp10 += 9,
        "T" => exp10 += 12,
        "P" => exp10 += 15,
        "E" => exp10 += 18,
        other => {
            let exponent = other
                .strip_prefix('e')
                .or_else(|| other.strip_prefix('E'))
                .ok_or_else(bad)?;
            let value: i32 = exponent.parse().map_err(|_| bad())?;
            if exponent.is_empty() || !(-100..=100).contains(&value) {
                return Err(bad());
            }
            exp10 += value;
        }
    }
    let mut value = mantissa.checked_mul(1i128 << exp2).ok_or_else(bad)?;
    if exp10 >= 0 {
        for _ in 0..exp10 {
            value = value.checked_mul(10).ok_or_else(bad)?;
        }
    } else {
        let divisor = (0..-exp10).try_fold(1i128, |acc, _| acc.checked_mul(10));
        value = match divisor {
            Some(divisor) => (value + divisor - 1) / divisor,
            // Far below one unit: rounds up to one unless zero.
            None => i128::from(value > 0),
        };
    }
    Ok(if negative { -value } else { value })
}

/// A byte count as `resource.NewQuantity(bytes, BinarySI)` prints it: the largest binary
/// suffix that divides it exactly, else the plain number.
pub fn format_binary(bytes: i64) -> String {
    const SUFFIXES: [(&str, u32); 6] = [
        ("Ei", 60),
        ("Pi", 50),
        ("Ti", 40),
        ("Gi", 30),
        ("Mi", 20),
        ("Ki", 10),
    ];
    if bytes == 0 {
        return "0".to_string();
    }
    for (suffix, shift) in SUFFIXES {
        let unit = 1i64 << shift;
        if bytes % unit == 0 {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_suffixes_kubernetes_accepts() {
        assert_eq!(parse("1Gi"), Ok(1 << 30));
        assert_eq!(parse("1.5Gi"), Ok(3 << 29));
        assert_eq!(parse("500M"), Ok(500_000_000));
        assert_eq!(parse("1k"), Ok(1000));
        assert_eq!(parse("100"), Ok(100));
        assert_eq!(parse("1e3"), Ok(1000));
        assert_eq!(parse("1E9"), Ok(1_000_000_000));
        assert_eq!(parse("+2Ki"), Ok(2048));
        assert_eq!(parse("-1Mi"), Ok(-(1 << 20)));
        assert_eq!(parse("0"), Ok(0));
        assert_eq!(parse("10Ei"), Ok(10i128 << 60));
    }

    #[test]
    fn fractions_round_up_to_whole_units() {
        assert_eq!(parse("100m"), Ok(1));
        assert_eq!(parse("1500m"), Ok(2));
        assert_eq!(parse("0.1"), Ok(1));
        assert_eq!(parse("1.0001k"), Ok(1001));
        assert_eq!(parse("1n"), Ok(1));
        assert_eq!(parse("0m"), Ok(0));
    }

    #[test]
    fn rejects_what_kubernetes_rejects() {
        for bad in [
            "", "Gi", "1GB", "1..5", ".", "abc", "1 Gi x", "1e", "1e1000", "1Xi",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} should be rejected");
        }
        assert!(
            parse("99999999999999999999999999999999999999999Ei").is_err(),
            "overflow"
        );
    }

    #[test]
    fn formats_as_binary_si() {
        assert_eq!(format_binary(1 << 30), "1Gi");
        assert_eq!(format_binary(3 << 29), "1536Mi");
        assert_eq!(format_binary(1536), "1536");
        assert_eq!(format_binary(1000), "1000");
        assert_eq!(format_binary(0), "0");
        assert_eq!(format_binary(5 << 40), "5Ti");
    }
}
