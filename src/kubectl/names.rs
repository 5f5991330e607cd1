//! Names the plugin derives from a requestor ID: request names, the rollout's Node annotation and
//! the label on the requests of a rollout. Deterministic, so that a second run finds what the
//! first one made.

use maintenance_crds::GROUP;

/// Longest object name the API server accepts (a DNS subdomain).
const MAX_NAME: usize = 253;
/// Longest label value, and longest name part of a label or annotation key.
const MAX_LABEL: usize = 63;
/// Prefix of the name part of the rollout's Node annotation.
const DONE_ANNOTATION_PREFIX: &str = "rollout-";
/// Value of the rollout's Node annotation on a finished node.
pub const DONE_VALUE: &str = "done";
/// Label on every request a rollout creates; its value is the requestor's slug.
pub const ROLLOUT_LABEL: &str = "maintenance.nvidia.com/rollout";

/// FNV-1a: a stable short hash to keep truncated names unique (not for security).
fn fnv1a(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

/// Lower-case letters, digits, `-` and `.`, each dot-separated part starting and ending with a
/// letter or digit: valid as an object name, a label value and the name part of a key.
fn slug(text: &str) -> String {
    let mapped: String = text
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    mapped
        .split('.')
        .map(|part| part.trim_matches('-'))
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join(".")
}

/// `text` as a slug of at most `max` characters; a shortened one ends in a hash of the whole.
fn bounded_slug(text: &str, max: usize) -> String {
    let full = slug(text);
    if full.is_empty() {
        return format!("x{:08x}", fnv1a(text));
    }
    if full.len() <= max {
        return full;
    }
    let hash = format!("{:08x}", fnv1a(text));
    let head = slug(&full[..max - hash.len() - 1]);
    format!("{head}-{hash}")
}

/// The name of the request for `node`: `<prefix>-<node>`, where the prefix is `--name-prefix` or
/// the requestor ID made into a name (`upgrade.example.com-node-7`).
pub fn request_name(prefix: &str, node: &str) -> String {
    let name = format!("{prefix}-{node}");
    if name.len() <= MAX_NAME {
        name
    } else {
        bounded_slug(&name, MAX_NAME)
    }
}

/// The default `--name-prefix` for a requestor.
pub fn default_prefix(requestor: &str) -> String {
    bounded_slug(requestor, MAX_NAME / 2)
}

/// Checks a `--name-prefix` given by the user; the error says what is allowed.
pub fn check_prefix(prefix: &str) -> Result<(), String> {
    if prefix.len() <= MAX_NAME / 2 && slug(prefix) == prefix {
        Ok(())
    } else {
        Err(format!(
            "--name-prefix {prefix:?} cannot start a Kubernetes name: use at most {} lower-case \
             letters, digits, '-' and '.', starting and ending with a letter or digit (e.g. {:?})",
            MAX_NAME / 2,
            default_prefix(prefix)
        ))
    }
}

/// The Node annotation that marks a node as finished by the rollout of `requestor`:
/// `maintenance.nvidia.com/rollout-<requestor>` = `done`.
pub fn done_annotation(requestor: &str) -> String {
    let name = bounded_slug(requestor, MAX_LABEL - DONE_ANNOTATION_PREFIX.len());
    format!("{GROUP}/{DONE_ANNOTATION_PREFIX}{name}")
}

/// The value of [`ROLLOUT_LABEL`] on the requests of the rollout of `requestor`.
pub fn rollout_label_value(requestor: &str) -> String {
    bounded_slug(requestor, MAX_LABEL)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_dns_subdomain(name: &str) -> bool {
        !name.is_empty()
            && name.len() <= MAX_NAME
            && name.split('.').all(|part| {
                !part.is_empty()
                    && part
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            })
    }

    #[test]
    fn requestor_ids_become_valid_names() {
        assert_eq!(default_prefix("upgrade.example.com"), "upgrade.example.com");
        assert_eq!(default_prefix("Team/Kernel Upgrade"), "team-kernel-upgrade");
        assert_eq!(default_prefix("-a.-b-.c_"), "a.b.c");
        assert_eq!(
            request_name(&default_prefix("demo.example.com"), "kwok-node-7"),
            "demo.example.com-kwok-node-7"
        );
        for requestor in ["", "...", "__", &"x".repeat(400), "A.B/C:D"] {
            let prefix = default_prefix(requestor);
            assert!(is_dns_subdomain(&prefix), "{requestor:?} -> {prefix:?}");
            assert!(check_prefix(&prefix).is_ok(), "{prefix:?}");
            let name = request_name(&prefix, &"n".repeat(200));
            assert!(is_dns_subdomain(&name), "{name:?}");
        }
    }

    #[test]
    fn long_names_stay_unique() {
        let a = request_name(&"a".repeat(120), &format!("{}-1", "n".repeat(200)));
        let b = request_name(&"a".repeat(120), &format!("{}-2", "n".repeat(200)));
        assert_ne!(a, b);
        assert!(a.len() <= MAX_NAME && b.len() <= MAX_NAME);
    }

    #[test]
    fn keys_and_label_values_fit_their_limits() {
        assert_eq!(
            done_annotation("demo.example.com"),
            "maintenance.nvidia.com/rollout-demo.example.com"
        );
        let long = "very-long-requestor.".repeat(10);
        let key = done_annotation(&long);
        let name = key.split_once('/').map(|(_, n)| n).unwrap_or_default();
        assert!(name.len() <= MAX_LABEL, "{key}");
        assert_ne!(done_annotation(&long), done_annotation(&format!("{long}x")));
        assert!(rollout_label_value(&long).len() <= MAX_LABEL);
    }

    #[test]
    fn bad_prefixes_are_refused_with_a_suggestion() {
        assert!(check_prefix("fw-update").is_ok());
        let error = check_prefix("FW_Update").unwrap_err();
        assert!(error.contains("\"fw-update\""), "{error}");
        assert!(check_prefix("a..b").is_err());
        assert!(check_prefix("-a").is_err());
    }
}
