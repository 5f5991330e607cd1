use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// Why an int-or-percent limit could not be read.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum IntOrPercentError {
    #[error("{field}: {value:?} is neither a non-negative integer nor a percentage like \"10%\"")]
    Malformed { field: &'static str, value: String },
}

/// How a percentage is turned into a node count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rounding {
    Up,
    Down,
}

/// Resolves an int-or-percent limit against `total` nodes.
///
/// `field` names the limit in errors so that a user knows which spec field to fix.
pub fn resolve_int_or_percent(
    field: &'static str,
    value: &IntOrString,
    total: u32,
    rounding: Rounding,
) -> Result<u32, IntOrPercentError> {
    let malformed = || IntOrPercentError::Malformed {
        field,
        value: match value {
            IntOrString::Int(i) => i.to_string(),
            IntOrString::String(s) => s.clone(),
        },
    };
    match value {
        IntOrString::Int(i) => u32::try_from(*i).map_err(|_| malformed()),
        IntOrString::String(s) => {
            let digits = s.trim().strip_suffix('%').ok_or_else(malformed)?;
            let percent: u64 = digits.parse().map_err(|_| malformed())?;
            if percent > 100 {
                return Err(malformed());
            }
            let scaled = percent * u64::from(total);
            let count = match rounding {
                Rounding::Up => scaled.div_ceil(100),
                Rounding::Down => scaled / 100,
            };
            // percent <= 100, so count <= total and fits.
            Ok(u32::try_from(count).unwrap_or(total))
        }
    }
}

/// The CEL rule (and its message) that the API server applies to every int-or-percent limit.
pub(crate) const INT_OR_PERCENT_RULE: &str =
    "type(self) == int ? self >= 0 && self <= 2147483647 : self.matches('^(100|[1-9]?[0-9])%$')";
/// The upper bound matters: the field is int-or-string, which has no int32 format, and a value the
/// operator cannot decode (32-bit, as IntOrString) would fail its config watch.
pub(crate) const INT_OR_PERCENT_MESSAGE: &str = "must be a non-negative integer or a percentage between 0% and 100%, like \"10%\" (an integer at most 2147483647)";

#[cfg(test)]
mod tests {
    use super::*;

    fn pct(s: &str) -> IntOrString {
        IntOrString::String(s.to_string())
    }

    #[test]
    fn integers_pass_through() {
        assert_eq!(
            resolve_int_or_percent("f", &IntOrString::Int(3), 10, Rounding::Up),
            Ok(3)
        );
    }

    #[test]
    fn percentages_round_as_asked() {
        assert_eq!(
            resolve_int_or_percent("f", &pct("15%"), 10, Rounding::Up),
            Ok(2)
        );
        assert_eq!(
            resolve_int_or_percent("f", &pct("15%"), 10, Rounding::Down),
            Ok(1)
        );
        assert_eq!(
            resolve_int_or_percent("f", &pct("100%"), 7, Rounding::Down),
            Ok(7)
        );
        assert_eq!(
            resolve_int_or_percent("f", &pct("0%"), 7, Rounding::Up),
            Ok(0)
        );
        assert_eq!(
            resolve_int_or_percent("f", &pct("1%"), 5000, Rounding::Up),
            Ok(50)
        );
    }

    #[test]
    fn garbage_is_refused_with_the_field_name() {
        for bad in ["abc", "10", "-5%", "101%", "%"] {
            let err = resolve_int_or_percent("maxUnavailable", &pct(bad), 10, Rounding::Up)
                .expect_err(bad);
            assert!(err.to_string().starts_with("maxUnavailable:"), "{err}");
        }
        assert!(resolve_int_or_percent("f", &IntOrString::Int(-1), 10, Rounding::Up).is_err());
    }
}
