//! Secrets in URLs (`user:password@`, `?password=`, `sslpassword=`, tokens)
//! are replaced by `<redacted>` wherever a URL is printed: `check-config`,
//! logs and error messages.

/// Query parameters whose values are secrets (compared ignoring ASCII case).
const SECRET_PARAMS: &[&str] = &[
    "password",
    "passwd",
    "pass",
    "pwd",
    "sslpassword",
    "secret",
    "token",
    "access_token",
    "auth",
    "auth_token",
    "api_key",
    "apikey",
    "key",
    "private_key",
    "client_secret",
];

/// A URL with the password in its userinfo and every secret-looking query
/// value replaced by `<redacted>`.
pub(crate) fn redact_url(url: &str) -> String {
    let mut out = String::with_capacity(url.len());
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    match base.find("://") {
        Some(scheme) => {
            let rest = &base[scheme + 3..];
            let authority_end = rest.find('/').unwrap_or(rest.len());
            let authority = &rest[..authority_end];
            out.push_str(&base[..scheme + 3]);
            match authority.rfind('@') {
                Some(at) => {
                    let creds = &authority[..at];
                    match creds.split_once(':') {
                        Some((user, _)) => {
                            out.push_str(user);
                            out.push_str(":<redacted>");
                        }
                        None => out.push_str(creds),
                    }
                    out.push_str(&authority[at..]);
                }
                None => out.push_str(authority),
            }
            out.push_str(&rest[authority_end..]);
        }
        None => out.push_str(base),
    }
    if let Some(q) = query {
        out.push('?');
        for (i, pair) in q.split('&').enumerate() {
            if i > 0 {
                out.push('&');
            }
            match pair.split_once('=') {
                Some((k, _)) if SECRET_PARAMS.iter().any(|s| s.eq_ignore_ascii_case(k)) => {
                    out.push_str(k);
                    out.push_str("=<redacted>");
                }
                _ => out.push_str(pair),
            }
        }
    }
    out
}

/// `text` with every `scheme://…` word in it redacted (error messages that
/// quote a URL).
pub(crate) fn redact_text(text: &str) -> String {
    if !text.contains("://") {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find("://") {
        // The URL starts at the scheme: back up over [A-Za-z0-9+.-].
        let start = rest[..pos]
            .char_indices()
            .rev()
            .find(|(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '.' | '-')))
            .map_or(0, |(i, c)| i + c.len_utf8());
        let end = rest[pos..]
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '`' | '<' | '>'))
            .map_or(rest.len(), |i| pos + i);
        out.push_str(&rest[..start]);
        out.push_str(&redact_url(&rest[start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_in_userinfo_and_query_are_redacted() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/app"),
            "postgres://app:<redacted>@db:5432/app"
        );
        assert_eq!(
            redact_url("postgres://db/app?user=app&password=s3cret&sslmode=require"),
            "postgres://db/app?user=app&password=<redacted>&sslmode=require"
        );
        assert_eq!(
            redact_url("redis://:tok@host:6379/0?PASSWORD=x&sslpassword=y"),
            "redis://:<redacted>@host:6379/0?PASSWORD=<redacted>&sslpassword=<redacted>"
        );
        assert_eq!(redact_url("sqlite://rolegate.db"), "sqlite://rolegate.db");
        assert_eq!(
            redact_url("http://u@host/p@x"),
            "http://u@host/p@x",
            "no password, and @ in the path is not userinfo"
        );
        assert_eq!(
            redact_text("é://x:y@h"),
            "é://x:<redacted>@h",
            "a multi-byte character before :// is kept whole"
        );
        assert_eq!(
            redact_text("bad url `postgres://a:b@h/d?password=c` here"),
            "bad url `postgres://a:<redacted>@h/d?password=<redacted>` here"
        );
    }
}
