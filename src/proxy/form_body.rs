//! Form bodies on query-keyed partition routes. Go's `FormValue`, Rack's
//! `params` and PHP's `$_REQUEST` merge a form body's parameters over the
//! query's, so `POST /x?id=mine` with the body `id=victim` is run by such an
//! app for `victim`, whose partition may be held elsewhere. The gate reads a
//! form body (up to [`FORM_LIMIT`], within [`FORM_PATIENCE`]) before it
//! decides, refuses the request when the body names the key parameter or
//! cannot be read, and passes it on unchanged otherwise.

use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{header, HeaderMap, Request};
use http_body_util::BodyExt;

use super::keys::fold_param_name;

/// The largest form body the gate reads to check it; a larger one is refused.
pub(crate) const FORM_LIMIT: usize = 64 * 1024;
/// How long the gate waits for a form body.
pub(crate) const FORM_PATIENCE: Duration = Duration::from_secs(10);

/// What a request's `Content-Type` fields say its body is.
#[derive(Debug, PartialEq, Eq)]
enum Form {
    UrlEncoded,
    Multipart(Vec<u8>),
}

/// Why a form body is refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FormRefusal {
    #[error("the form body names the key parameter `{0}` too, and many apps read the body's value over the query's")]
    NamesKey(String),
    #[error("a form body on this route must be at most {FORM_LIMIT} bytes, uncompressed, and sent within {FORM_PATIENCE:?}, to be checked for the key parameter: {0}")]
    Unreadable(&'static str),
    #[error("the form body was malformed or cut off")]
    Broken,
}

/// The form a request's body is, when any `Content-Type` field names a form
/// type; a multipart type without a boundary is refused (`Err`).
fn form_of(headers: &HeaderMap) -> Result<Option<Form>, FormRefusal> {
    let mut form = None;
    for value in headers.get_all(header::CONTENT_TYPE) {
        let text = String::from_utf8_lossy(value.as_bytes()).to_ascii_lowercase();
        if text.contains("multipart/") {
            let boundary = boundary(value.as_bytes()).ok_or(FormRefusal::Unreadable(
                "a multipart type without a boundary",
            ))?;
            form = Some(Form::Multipart(boundary));
        } else if text.contains("x-www-form-urlencoded") && form.is_none() {
            form = Some(Form::UrlEncoded);
        }
    }
    Ok(form)
}

/// The `boundary` parameter of a multipart `Content-Type`, unquoted.
fn boundary(value: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(value).ok()?;
    let (_, params) = text.split_once(';')?;
    params.split(';').find_map(|p| {
        let (k, v) = p.split_once('=')?;
        if !k.trim().eq_ignore_ascii_case("boundary") {
            return None;
        }
        let v = v.trim().trim_matches('"');
        (!v.is_empty()).then(|| v.as_bytes().to_vec())
    })
}

/// Whether a URL-encoded body has a parameter whose name folds to `want`.
fn urlencoded_names(body: &[u8], want: &str) -> bool {
    body.split(|b| *b == b'&' || *b == b';').any(|pair| {
        let name = pair.split(|b| *b == b'=').next().unwrap_or_default();
        let spaced: Vec<u8> = name
            .iter()
            .map(|b| if *b == b'+' { b' ' } else { *b })
            .collect();
        let decoded = super::canonical::percent_decode(&spaced);
        fold_param_name(&String::from_utf8_lossy(&decoded)) == want
    })
}

/// Whether a multipart body has a part whose `Content-Disposition` name
/// folds to `want`. Every part's header block is looked at, whatever the
/// framing around it, so a part a lenient parser would find is found too.
fn multipart_names(body: &[u8], boundary: &[u8], want: &str) -> bool {
    let mut delimiter = b"--".to_vec();
    delimiter.extend_from_slice(boundary);
    let mut rest = body;
    while let Some(at) = find(rest, &delimiter) {
        rest = &rest[at + delimiter.len()..];
        if rest.starts_with(b"--") {
            break;
        }
        let end = find(rest, b"\r\n\r\n")
            .or_else(|| find(rest, b"\n\n"))
            .unwrap_or(rest.len());
        let head = String::from_utf8_lossy(&rest[..end]);
        let named = head.lines().any(|line| {
            let Some((field, value)) = line.split_once(':') else {
                return false;
            };
            field.trim().eq_ignore_ascii_case("content-disposition")
                && disposition_name(value).is_some_and(|n| fold_param_name(&n) == want)
        });
        if named {
            return true;
        }
    }
    false
}

/// The `name` parameter of a `Content-Disposition` value (`name*` too).
fn disposition_name(value: &str) -> Option<String> {
    value.split(';').skip(1).find_map(|p| {
        let (k, v) = p.split_once('=')?;
        let k = k.trim().to_ascii_lowercase();
        if k != "name" && k != "name*" {
            return None;
        }
        let v = v.trim();
        let v = v.strip_prefix("utf-8''").unwrap_or(v);
        let v = v.trim_matches('"');
        let decoded = super::canonical::percent_decode(v.as_bytes());
        Some(String::from_utf8_lossy(&decoded).into_owned())
    })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Whether `body`, of the form the headers name, names the key `name`.
fn body_names(form: &Form, body: &[u8], name: &str) -> bool {
    let want = fold_param_name(name);
    match form {
        Form::UrlEncoded => urlencoded_names(body, &want),
        Form::Multipart(boundary) => multipart_names(body, boundary, &want),
    }
}

/// Checks a request's form body for the query key `name`: a request without
/// one comes back as it was; one whose body does not name the key comes back
/// with the same body, read whole.
pub(crate) async fn check(req: Request<Body>, name: &str) -> Result<Request<Body>, FormRefusal> {
    let Some(form) = form_of(req.headers())? else {
        return Ok(req);
    };
    let encoded = req
        .headers()
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .any(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
    if encoded {
        return Err(FormRefusal::Unreadable(
            "the body is encoded (Content-Encoding)",
        ));
    }
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > FORM_LIMIT as u64) {
        return Err(FormRefusal::Unreadable("it is larger"));
    }
    let (parts, body) = req.into_parts();
    let read = http_body_util::Limited::new(body, FORM_LIMIT).collect();
    let collected = match tokio::time::timeout(FORM_PATIENCE, read).await {
        Err(_) => return Err(FormRefusal::Unreadable("it did not arrive in time")),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(FormRefusal::Unreadable("it is larger"))
        }
        Ok(Err(_)) => return Err(FormRefusal::Broken),
        Ok(Ok(collected)) => collected,
    };
    let trailers = collected.trailers().cloned();
    let bytes: Bytes = collected.to_bytes();
    if body_names(&form, &bytes, name) {
        return Err(FormRefusal::NamesKey(name.to_string()));
    }
    Ok(Request::from_parts(parts, replayed(bytes, trailers)))
}

/// The body as read, trailers included: the app gets what the client sent.
fn replayed(bytes: Bytes, trailers: Option<HeaderMap>) -> Body {
    let Some(trailers) = trailers else {
        return Body::from(bytes);
    };
    let frames = [
        Ok::<_, std::convert::Infallible>(http_body::Frame::data(bytes)),
        Ok(http_body::Frame::trailers(trailers)),
    ];
    Body::new(http_body_util::StreamBody::new(futures_util::stream::iter(
        frames,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(content_type: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, content_type.parse().unwrap());
        h
    }

    #[test]
    fn form_types_are_found_in_any_content_type_field() {
        assert_eq!(
            form_of(&headers("application/x-www-form-urlencoded; charset=utf-8")),
            Ok(Some(Form::UrlEncoded))
        );
        assert_eq!(
            form_of(&headers("Multipart/Form-Data; boundary=\"xyz\"")),
            Ok(Some(Form::Multipart(b"xyz".to_vec())))
        );
        assert!(form_of(&headers("multipart/form-data")).is_err());
        assert_eq!(form_of(&headers("application/json")), Ok(None));
        assert_eq!(form_of(&HeaderMap::new()), Ok(None));
    }

    #[test]
    fn url_encoded_bodies_naming_the_key_in_any_spelling_are_found() {
        let f = Form::UrlEncoded;
        for body in [
            "id=victim",
            "a=1&id=victim",
            "a=1;id=victim",
            "%69d=victim",
            "ID=victim",
            "id[]=victim",
            "+id=victim",
            "id",
        ] {
            assert!(body_names(&f, body.as_bytes(), "id"), "{body}");
        }
        for body in ["idx=1", "a=id", "", "i d=1"] {
            assert!(!body_names(&f, body.as_bytes(), "id"), "{body}");
        }
        assert!(body_names(&f, b"device.id=v", "device_id"));
    }

    #[test]
    fn multipart_parts_naming_the_key_are_found() {
        let f = Form::Multipart(b"B".to_vec());
        let part = |name: &str| {
            format!("--B\r\nContent-Disposition: form-data; name={name}\r\n\r\nvictim\r\n--B--\r\n")
        };
        for name in ["\"id\"", "id", "\"ID\"", "\"id[]\"", "\"%69d\""] {
            assert!(body_names(&f, part(name).as_bytes(), "id"), "{name}");
        }
        assert!(!body_names(&f, part("\"other\"").as_bytes(), "id"));
        let second = "--B\r\ncontent-disposition: form-data; name=\"a\"\r\n\r\nx\r\n--B\r\nContent-Disposition: form-data; filename=\"f\"; name=\"id\"\n\nv\n--B--";
        assert!(body_names(&f, second.as_bytes(), "id"));
    }

    #[tokio::test]
    async fn a_checked_body_reaches_the_app_unchanged_and_a_big_one_is_refused() {
        let req = |body: Vec<u8>| {
            Request::post("/x?id=a")
                .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                .body(Body::from(body))
                .unwrap()
        };
        let passed = check(req(b"a=1&b=2".to_vec()), "id").await.unwrap();
        let body = passed.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"a=1&b=2");
        assert_eq!(
            check(req(b"a=1&id=2".to_vec()), "id").await.err(),
            Some(FormRefusal::NamesKey("id".into()))
        );
        assert!(matches!(
            check(req(vec![b'a'; FORM_LIMIT + 1]), "id").await,
            Err(FormRefusal::Unreadable(_))
        ));
        let plain = Request::post("/x?id=a").body(Body::from("id=2")).unwrap();
        assert!(check(plain, "id").await.is_ok(), "not a form: not read");
        // Trailers survive the read.
        let mut t = HeaderMap::new();
        t.insert("x-checksum", "abc".parse().unwrap());
        let with = Request::post("/x?id=a")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(replayed(Bytes::from_static(b"a=1"), Some(t.clone())))
            .unwrap();
        let got = check(with, "id")
            .await
            .unwrap()
            .into_body()
            .collect()
            .await
            .unwrap();
        assert_eq!(got.trailers(), Some(&t));
        assert_eq!(&got.to_bytes()[..], b"a=1");
    }
}
