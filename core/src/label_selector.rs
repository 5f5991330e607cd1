//! Label selectors in the string syntax of `kubectl get pods -l`.
//!
//! `spec.drainSpec.podSelector` and `spec.waitForPodCompletion.podSelector` are strings, and users
//! write them exactly as they would for kubectl: `a=b,c!=d,e in (x,y),f notin (z),g,!h`, plus
//! `==`, and `k>n` / `k<n` for integer label values. kube-core only converts structured
//! `LabelSelector`s, so this module parses the string form itself, following the grammar and
//! validation rules of the API server's own parser, so that a selector the operator accepts is one the
//! API server would accept and means the same thing.
//!
//! Structured `LabelSelector`s (`matchLabels` and `matchExpressions`, as the config's budgets take
//! them) are converted by [`ParsedSelector::from_label_selector`] with the rules of the API
//! server's `metav1.LabelSelectorAsSelector`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use thiserror::Error;

/// A parsed label selector: every requirement must hold (requirements are AND-ed).
///
/// The empty selector (from `""` or only whitespace) selects everything, as with kubectl.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParsedSelector {
    requirements: Vec<Requirement>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Requirement {
    key: String,
    op: Operator,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Operator {
    Exists,
    DoesNotExist,
    Equals(String),
    NotEquals(String),
    In(BTreeSet<String>),
    NotIn(BTreeSet<String>),
    GreaterThan(i64),
    LessThan(i64),
}

/// A selector string that is not valid kubectl label-selector syntax.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("label selector {selector:?} is invalid: {problem}")]
pub struct SelectorParseError {
    /// The selector exactly as written.
    pub selector: String,
    /// What is wrong and where (character positions count from 1).
    pub problem: String,
}

impl ParsedSelector {
    /// Parses `input`; an empty or all-whitespace string selects everything.
    pub fn parse(input: &str) -> Result<Self, SelectorParseError> {
        let fail = |problem: String| SelectorParseError {
            selector: input.to_owned(),
            problem,
        };
        Parser {
            tokens: lex(input),
            pos: 0,
        }
        .parse()
        .map(|requirements| Self { requirements })
        .map_err(fail)
    }

    /// Converts a structured selector as the API server's `metav1.LabelSelectorAsSelector` does:
    /// `matchLabels` are equalities, `matchExpressions` use `In`, `NotIn` (with at least one value),
    /// `Exists` or `DoesNotExist` (without values); everything is AND-ed, and an empty selector
    /// selects everything. The error says which entry is wrong.
    pub fn from_label_selector(selector: &LabelSelector) -> Result<Self, String> {
        let mut requirements = Vec::new();
        for (key, value) in selector.match_labels.iter().flatten() {
            validate_key(key).map_err(|e| format!("matchLabels: label key '{key}' {e}"))?;
            validate_value(value)
                .map_err(|e| format!("matchLabels: value '{value}' of '{key}' {e}"))?;
            requirements.push(Requirement {
                key: key.clone(),
                op: Operator::Equals(value.clone()),
            });
        }
        for (index, expression) in selector.match_expressions.iter().flatten().enumerate() {
            let at = format!("matchExpressions[{index}]");
            let key = &expression.key;
            validate_key(key).map_err(|e| format!("{at}: label key '{key}' {e}"))?;
            let values: BTreeSet<String> = expression.values.iter().flatten().cloned().collect();
            for value in &values {
                validate_value(value).map_err(|e| format!("{at}: value '{value}' {e}"))?;
            }
            let op = match expression.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(format!(
                        "{at}: operator {} needs at least one value",
                        expression.operator
                    ));
                }
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return Err(format!(
                        "{at}: operator {} takes no values",
                        expression.operator
                    ));
                }
                "In" => Operator::In(values),
                "NotIn" => Operator::NotIn(values),
                "Exists" => Operator::Exists,
                "DoesNotExist" => Operator::DoesNotExist,
                other => {
                    return Err(format!(
                        "{at}: operator {other:?} is not one of In, NotIn, Exists, DoesNotExist"
                    ));
                }
            };
            requirements.push(Requirement {
                key: key.clone(),
                op,
            });
        }
        Ok(Self { requirements })
    }

    /// True when this selector has no requirements and so selects every object.
    pub fn selects_all(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether an object with these labels is selected. `None` stands for an object without labels.
    pub fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        let get = |key: &str| labels.and_then(|l| l.get(key));
        self.requirements.iter().all(|r| match &r.op {
            Operator::Exists => get(&r.key).is_some(),
            Operator::DoesNotExist => get(&r.key).is_none(),
            Operator::Equals(v) => get(&r.key) == Some(v),
            Operator::NotEquals(v) => get(&r.key) != Some(v),
            Operator::In(set) => get(&r.key).is_some_and(|v| set.contains(v)),
            Operator::NotIn(set) => get(&r.key).is_none_or(|v| !set.contains(v)),
            // As in the API server: a missing or non-integer label value never satisfies `>`/`<`.
            Operator::GreaterThan(n) => get(&r.key)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v > *n),
            Operator::LessThan(n) => get(&r.key)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v < *n),
        })
    }
}

impl FromStr for ParsedSelector {
    type Err = SelectorParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    /// A word: a key, a value, or the keywords `in` / `notin` depending on where it stands.
    Word(String),
    Not,
    Eq,
    DoubleEq,
    NotEq,
    Gt,
    Lt,
    Open,
    Close,
    Comma,
    End,
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Word(w) => write!(f, "'{w}'"),
            Tok::Not => f.write_str("'!'"),
            Tok::Eq => f.write_str("'='"),
            Tok::DoubleEq => f.write_str("'=='"),
            Tok::NotEq => f.write_str("'!='"),
            Tok::Gt => f.write_str("'>'"),
            Tok::Lt => f.write_str("'<'"),
            Tok::Open => f.write_str("'('"),
            Tok::Close => f.write_str("')'"),
            Tok::Comma => f.write_str("','"),
            Tok::End => f.write_str("the end of the selector"),
        }
    }
}

/// A token and the 1-based character position where it starts, for error messages.
type Spanned = (Tok, usize);

fn is_symbol(c: char) -> bool {
    matches!(c, '!' | '=' | '>' | '<' | '(' | ')' | ',')
}

fn lex(input: &str) -> Vec<Spanned> {
    let chars: Vec<char> = input.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let at = i + 1;
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        let next = chars.get(i + 1).copied();
        let (tok, len) = match (c, next) {
            ('!', Some('=')) => (Tok::NotEq, 2),
            ('=', Some('=')) => (Tok::DoubleEq, 2),
            ('!', _) => (Tok::Not, 1),
            ('=', _) => (Tok::Eq, 1),
            ('>', _) => (Tok::Gt, 1),
            ('<', _) => (Tok::Lt, 1),
            ('(', _) => (Tok::Open, 1),
            (')', _) => (Tok::Close, 1),
            (',', _) => (Tok::Comma, 1),
            _ => {
                let word: String = chars[i..]
                    .iter()
                    .take_while(|c| !c.is_whitespace() && !is_symbol(**c))
                    .collect();
                let len = word.chars().count();
                (Tok::Word(word), len)
            }
        };
        tokens.push((tok, at));
        i += len;
    }
    tokens.push((Tok::End, chars.len() + 1));
    tokens
}

struct Parser {
    tokens: Vec<Spanned>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> &Spanned {
        // `lex` always ends the list with `End`, and `next` never moves past it.
        &self.tokens[self.pos.min(self.tokens.len() - 1)]
    }

    fn next(&mut self) -> Spanned {
        let t = self.peek().clone();
        if t.0 != Tok::End {
            self.pos += 1;
        }
        t
    }

    fn parse(mut self) -> Result<Vec<Requirement>, String> {
        let mut requirements = Vec::new();
        if self.peek().0 == Tok::End {
            return Ok(requirements);
        }
        loop {
            requirements.push(self.requirement()?);
            match self.next() {
                (Tok::End, _) => return Ok(requirements),
                (Tok::Comma, _) => match self.peek() {
                    (Tok::Word(_) | Tok::Not, _) => {}
                    (tok, at) => {
                        return Err(format!(
                            "at character {at}: found {tok}, expected a label key or '!' after ','"
                        ));
                    }
                },
                (tok, at) => {
                    return Err(format!(
                        "at character {at}: found {tok}, expected ',' or the end of the selector"
                    ));
                }
            }
        }
    }

    fn requirement(&mut self) -> Result<Requirement, String> {
        let negated = self.peek().0 == Tok::Not;
        if negated {
            self.next();
        }
        let key = match self.next() {
            (Tok::Word(w), at) => {
                validate_key(&w).map_err(|e| format!("at character {at}: label key '{w}' {e}"))?;
                w
            }
            (tok, at) => {
                return Err(format!(
                    "at character {at}: found {tok}, expected a label key"
                ));
            }
        };
        if negated {
            return Ok(Requirement {
                key,
                op: Operator::DoesNotExist,
            });
        }
        if matches!(self.peek().0, Tok::End | Tok::Comma) {
            return Ok(Requirement {
                key,
                op: Operator::Exists,
            });
        }
        let op = match self.next() {
            (Tok::Eq | Tok::DoubleEq, _) => Operator::Equals(self.exact_value()?),
            (Tok::NotEq, _) => Operator::NotEquals(self.exact_value()?),
            (Tok::Word(w), _) if w == "in" => Operator::In(self.value_set()?),
            (Tok::Word(w), _) if w == "notin" => Operator::NotIn(self.value_set()?),
            (Tok::Gt, _) => Operator::GreaterThan(self.integer_value()?),
            (Tok::Lt, _) => Operator::LessThan(self.integer_value()?),
            (tok, at) => {
                return Err(format!(
                    "at character {at}: found {tok} after key '{key}', expected one of \
                     =, ==, !=, in, notin, >, <, ',' or the end of the selector"
                ));
            }
        };
        Ok(Requirement { key, op })
    }

    /// The value after `=`, `==` or `!=`; nothing (as in `a=` or `a=,b`) means the empty value.
    fn exact_value(&mut self) -> Result<String, String> {
        match self.peek().clone() {
            (Tok::End | Tok::Comma, _) => Ok(String::new()),
            (Tok::Word(w), at) => {
                self.next();
                validate_value(&w).map_err(|e| format!("at character {at}: value '{w}' {e}"))?;
                Ok(w)
            }
            (tok, at) => Err(format!("at character {at}: found {tok}, expected a value")),
        }
    }

    /// The value after `>` or `<`, which must be an integer.
    fn integer_value(&mut self) -> Result<i64, String> {
        match self.next() {
            (Tok::Word(w), at) => w.parse::<i64>().map_err(|_| {
                format!("at character {at}: value '{w}' after '>' or '<' must be an integer")
            }),
            (tok, at) => Err(format!(
                "at character {at}: found {tok}, expected an integer after '>' or '<'"
            )),
        }
    }

    /// `( v1, v2, ... )` after `in` / `notin`. Empty entries (as in `()` or `(a,)`) stand for the
    /// empty value, exactly as the API server reads them.
    fn value_set(&mut self) -> Result<BTreeSet<String>, String> {
        match self.next() {
            (Tok::Open, _) => {}
            (tok, at) => {
                return Err(format!(
                    "at character {at}: found {tok}, expected '(' to start the list of values, \
                     as in 'key in (a,b)'"
                ));
            }
        }
        let mut values = BTreeSet::new();
        let mut expect_value = true;
        loop {
            match self.next() {
                (Tok::Word(w), at) if expect_value => {
                    validate_value(&w)
                        .map_err(|e| format!("at character {at}: value '{w}' {e}"))?;
                    values.insert(w);
                    expect_value = false;
                }
                (Tok::Comma, _) => {
                    if expect_value {
                        values.insert(String::new());
                    }
                    expect_value = true;
                }
                (Tok::Close, _) => {
                    if expect_value {
                        values.insert(String::new());
                    }
                    return Ok(values);
                }
                (Tok::End, at) => {
                    return Err(format!(
                        "at character {at}: the list of values is not closed, expected ')'"
                    ));
                }
                (tok, at) => {
                    return Err(format!(
                        "at character {at}: found {tok} in the list of values, expected ',' or ')'"
                    ));
                }
            }
        }
    }
}

const NAME_MAX: usize = 63;
const PREFIX_MAX: usize = 253;

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`: the name part of a key, and a non-empty value.
fn check_name(s: &str) -> Result<(), String> {
    let bytes = s.as_bytes();
    let alnum = |b: &u8| b.is_ascii_alphanumeric();
    let inner = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) if alnum(first) && alnum(last) && bytes.iter().all(inner) => {
            Ok(())
        }
        _ => Err(
            "must consist of letters, digits, '-', '_' or '.', and start and end with a letter or digit"
                .to_owned(),
        ),
    }
}

/// Checks a label key (`[prefix/]name`) as the API server does; the error completes "label key
/// 'k' ...".
pub fn validate_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if name.contains('/') {
            return Err("may contain at most one '/' (prefix/name)".to_owned());
        }
        if prefix.is_empty() || prefix.len() > PREFIX_MAX || !is_dns_subdomain(prefix) {
            return Err(format!(
                "has an invalid prefix '{prefix}': it must be a lowercase DNS subdomain of at most \
                 {PREFIX_MAX} characters, such as 'example.com'"
            ));
        }
    }
    if name.is_empty() {
        return Err("has an empty name".to_owned());
    }
    if name.len() > NAME_MAX {
        return Err(format!("has a name longer than {NAME_MAX} characters"));
    }
    check_name(name)
}

fn validate_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    if value.len() > NAME_MAX {
        return Err(format!("is longer than {NAME_MAX} characters"));
    }
    check_name(value)
}

/// RFC 1123 subdomain: dot-separated labels of `[a-z0-9]([-a-z0-9]*[a-z0-9])?`.
fn is_dns_subdomain(s: &str) -> bool {
    s.split('.').all(|label| {
        let b = label.as_bytes();
        let edge = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
        match (b.first(), b.last()) {
            (Some(first), Some(last)) => {
                edge(first) && edge(last) && b.iter().all(|c| edge(c) || *c == b'-')
            }
            _ => false,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn sel(s: &str) -> ParsedSelector {
        match ParsedSelector::parse(s) {
            Ok(sel) => sel,
            Err(e) => panic!("{s:?} should parse: {e}"),
        }
    }

    fn err(s: &str) -> SelectorParseError {
        match ParsedSelector::parse(s) {
            Ok(sel) => panic!("{s:?} should not parse, got {sel:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn structured_selectors_follow_label_selector_as_selector() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
        let expression = |key: &str, operator: &str, values: &[&str]| LabelSelectorRequirement {
            key: key.to_string(),
            operator: operator.to_string(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        };
        let selector = LabelSelector {
            match_labels: Some(labels(&[("pool", "gpu")])),
            match_expressions: Some(vec![
                expression("topology.kubernetes.io/zone", "In", &["a", "b"]),
                expression("drained", "DoesNotExist", &[]),
            ]),
        };
        let parsed = ParsedSelector::from_label_selector(&selector).unwrap();
        let zone = "topology.kubernetes.io/zone";
        assert!(parsed.matches(Some(&labels(&[("pool", "gpu"), (zone, "a")]))));
        assert!(!parsed.matches(Some(&labels(&[("pool", "gpu"), (zone, "c")]))));
        assert!(!parsed.matches(Some(&labels(&[("pool", "cpu"), (zone, "a")]))));
        assert!(!parsed.matches(Some(&labels(&[
            ("pool", "gpu"),
            (zone, "a"),
            ("drained", "")
        ]))));
        let everything = ParsedSelector::from_label_selector(&LabelSelector::default()).unwrap();
        assert!(everything.selects_all());

        for (bad, needle) in [
            (
                expression("a", "In", &[]),
                "matchExpressions[0]: operator In needs at least one value",
            ),
            (
                expression("a", "Exists", &["x"]),
                "operator Exists takes no values",
            ),
            (
                expression("a", "Gt", &["1"]),
                "operator \"Gt\" is not one of",
            ),
            (expression("-a", "Exists", &[]), "label key '-a'"),
        ] {
            let selector = LabelSelector {
                match_expressions: Some(vec![bad]),
                ..LabelSelector::default()
            };
            let err = ParsedSelector::from_label_selector(&selector).unwrap_err();
            assert!(err.contains(needle), "{err}");
        }
    }

    #[test]
    fn empty_and_blank_select_everything() {
        for s in ["", "   ", "\t\n"] {
            let s = sel(s);
            assert!(s.selects_all());
            assert!(s.matches(None));
            assert!(s.matches(Some(&labels(&[("a", "b")]))));
        }
    }

    #[test]
    fn equals_and_double_equals() {
        for s in ["app=web", "app==web", " app = web "] {
            let s = sel(s);
            assert!(!s.selects_all());
            assert!(s.matches(Some(&labels(&[("app", "web")]))));
            assert!(!s.matches(Some(&labels(&[("app", "db")]))));
            assert!(!s.matches(None));
        }
    }

    #[test]
    fn not_equals_matches_missing_key() {
        let s = sel("app!=web");
        assert!(!s.matches(Some(&labels(&[("app", "web")]))));
        assert!(s.matches(Some(&labels(&[("app", "db")]))));
        assert!(s.matches(None));
    }

    #[test]
    fn empty_value_after_equals() {
        let s = sel("a=,b");
        assert!(s.matches(Some(&labels(&[("a", ""), ("b", "x")]))));
        assert!(!s.matches(Some(&labels(&[("a", "x"), ("b", "x")]))));
        assert!(!s.matches(Some(&labels(&[("b", "x")]))));
    }

    #[test]
    fn in_and_notin() {
        let s = sel("tier in (a, b)");
        assert!(s.matches(Some(&labels(&[("tier", "a")]))));
        assert!(s.matches(Some(&labels(&[("tier", "b")]))));
        assert!(!s.matches(Some(&labels(&[("tier", "c")]))));
        assert!(!s.matches(None));

        let s = sel("tier notin (a,b)");
        assert!(!s.matches(Some(&labels(&[("tier", "a")]))));
        assert!(s.matches(Some(&labels(&[("tier", "c")]))));
        assert!(s.matches(None));
    }

    #[test]
    fn empty_entries_in_a_set_are_the_empty_value() {
        for s in ["a in ()", "a in (,)", "a in (x,)", "a in (,x)"] {
            let s = sel(s);
            assert!(s.matches(Some(&labels(&[("a", "")]))), "{s:?}");
        }
        assert!(!sel("a in ()").matches(Some(&labels(&[("a", "x")]))));
    }

    #[test]
    fn keywords_are_plain_words_outside_operator_position() {
        // As with the API server, `in` is only an operator after a key.
        let s = sel("in in (in,notin)");
        assert!(s.matches(Some(&labels(&[("in", "notin")]))));
        assert!(sel("a=in").matches(Some(&labels(&[("a", "in")]))));
    }

    #[test]
    fn exists_and_does_not_exist() {
        let s = sel("gpu");
        assert!(s.matches(Some(&labels(&[("gpu", "")]))));
        assert!(!s.matches(None));
        let s = sel("!gpu");
        assert!(!s.matches(Some(&labels(&[("gpu", "x")]))));
        assert!(s.matches(None));
        assert!(sel("! gpu").matches(None));
    }

    #[test]
    fn greater_and_less_than() {
        let s = sel("rank>3");
        assert!(s.matches(Some(&labels(&[("rank", "4")]))));
        assert!(!s.matches(Some(&labels(&[("rank", "3")]))));
        assert!(!s.matches(Some(&labels(&[("rank", "x")]))));
        assert!(!s.matches(None));
        let s = sel("rank < -1");
        assert!(s.matches(Some(&labels(&[("rank", "-2")]))));
        assert!(!s.matches(Some(&labels(&[("rank", "-1")]))));
    }

    #[test]
    fn requirements_are_anded() {
        let s = sel("a=b, c!=d ,e in (x,y),f notin (z),g,!h");
        let good = labels(&[("a", "b"), ("e", "x"), ("g", "1")]);
        assert!(s.matches(Some(&good)));
        for (k, v) in [("a", "z"), ("c", "d"), ("e", "q"), ("f", "z"), ("h", "1")] {
            let mut bad = good.clone();
            bad.insert(k.into(), v.into());
            assert!(!s.matches(Some(&bad)), "{k}={v} should not match");
        }
        let mut no_g = good.clone();
        no_g.remove("g");
        assert!(!s.matches(Some(&no_g)));
    }

    #[test]
    fn prefixed_keys() {
        let s = sel("app.kubernetes.io/name=web,example.com/x");
        assert!(s.matches(Some(&labels(&[
            ("app.kubernetes.io/name", "web"),
            ("example.com/x", "")
        ]))));
    }

    #[test]
    fn from_str_parses() {
        let s: ParsedSelector = match "a=b".parse() {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(s, sel("a=b"));
    }

    #[test]
    fn errors_name_the_selector_and_the_problem() {
        let cases = [
            ("a in b", "expected '('"),
            ("a in (b", "not closed"),
            ("a in (b c)", "expected ',' or ')'"),
            ("a in (b,=)", "in the list of values"),
            ("a=b,", "after ','"),
            (",a", "expected a label key"),
            ("a=b c", "expected ',' or the end"),
            ("a b", "after key 'a'"),
            ("!a=b", "expected ',' or the end"),
            ("!", "expected a label key"),
            ("a=(", "expected a value"),
            ("a>b", "must be an integer"),
            ("a<", "expected an integer"),
            ("-a=b", "label key '-a'"),
            ("a=b-", "value 'b-'"),
            ("Example.com/a=b", "invalid prefix"),
            ("/a", "invalid prefix"),
            ("a/", "empty name"),
            ("a/b/c", "at most one '/'"),
            ("a=é", "value 'é'"),
        ];
        for (input, needle) in cases {
            let e = err(input);
            assert_eq!(e.selector, input);
            let text = e.to_string();
            assert!(text.contains(needle), "{input:?}: {text}");
            assert!(text.contains(&format!("{input:?}")), "{text}");
        }
    }

    #[test]
    fn error_positions_point_at_the_token() {
        assert!(err("a in b").problem.starts_with("at character 6:"));
        assert!(err("app=web,,x").problem.starts_with("at character 9:"));
    }

    #[test]
    fn length_limits() {
        let long = "a".repeat(64);
        assert!(err(&format!("{long}=x")).problem.contains("longer than 63"));
        assert!(err(&format!("k={long}")).problem.contains("longer than 63"));
        let ok = "a".repeat(63);
        sel(&format!("{ok}={ok}"));
    }
}

/// Whether a structured `LabelSelector` (as PodDisruptionBudgets carry) selects these labels.
/// An empty selector selects everything, as the API server reads it for policy/v1 PDBs.
pub fn matches_label_selector(
    selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    labels: &BTreeMap<String, String>,
) -> bool {
    let match_labels = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let expressions = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        let value = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            // An operator the API server would have refused: select nothing rather than guess.
            _ => false,
        }
    });
    match_labels && expressions
}

#[cfg(test)]
mod structured_selector_tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn match_labels_and_expressions_are_anded() {
        let selector = LabelSelector {
            match_labels: Some(labels(&[("app", "web")])),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: "In".into(),
                values: Some(vec!["front".into(), "edge".into()]),
            }]),
        };
        assert!(matches_label_selector(
            &selector,
            &labels(&[("app", "web"), ("tier", "edge")])
        ));
        assert!(!matches_label_selector(
            &selector,
            &labels(&[("app", "web")])
        ));
        assert!(!matches_label_selector(
            &selector,
            &labels(&[("app", "db"), ("tier", "edge")])
        ));
        assert!(matches_label_selector(
            &LabelSelector::default(),
            &labels(&[])
        ));
    }

    #[test]
    fn exists_and_not_in() {
        let selector = LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![
                LabelSelectorRequirement {
                    key: "a".into(),
                    operator: "Exists".into(),
                    values: None,
                },
                LabelSelectorRequirement {
                    key: "b".into(),
                    operator: "NotIn".into(),
                    values: Some(vec!["x".into()]),
                },
            ]),
        };
        assert!(matches_label_selector(&selector, &labels(&[("a", "1")])));
        assert!(!matches_label_selector(
            &selector,
            &labels(&[("a", "1"), ("b", "x")])
        ));
        assert!(!matches_label_selector(&selector, &labels(&[("b", "y")])));
    }
}
