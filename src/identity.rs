//! Who this process is: a fresh instance id per start.

use rand::Rng;

/// `{name or hostname}-{8 random hex}`: two processes on one machine, or one
/// process restarted, never share an identity.
pub(crate) fn instance_id(name: Option<&str>) -> String {
    let base = match name {
        Some(n) if !n.is_empty() => n.to_string(),
        _ => hostname(),
    };
    let suffix: u32 = rand::thread_rng().gen();
    format!("{base}-{suffix:08x}")
}

fn hostname() -> String {
    let raw = gethostname::gethostname().to_string_lossy().into_owned();
    let clean: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .take(64)
        .collect();
    if clean.is_empty() {
        "rolegate".into()
    } else {
        clean
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_fresh_and_named() {
        let a = instance_id(Some("web"));
        let b = instance_id(Some("web"));
        assert_ne!(a, b);
        assert!(a.starts_with("web-") && a.len() == 12, "{a}");
        assert!(a[4..].chars().all(|c| c.is_ascii_hexdigit()));
        assert!(!instance_id(None).is_empty());
    }
}
