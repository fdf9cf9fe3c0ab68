//! The gateway's own HTTP/1 codec: request and response heads parsed in
//! place with `httparse` and body framing found without copying, held to
//! hyper's reading of the same bytes (`oracle`, the fuzz targets
//! `http1_requests` and `http1_responses`, and the property tests).

pub(crate) mod chunked;
pub(crate) mod head;
#[cfg(any(test, fuzzing))]
#[allow(unreachable_pub)] // pub for the fuzz targets (`crate::fuzzing`)
pub mod oracle;

/// The longest request head the public listener reads (as hyper's buffer
/// limit there): a head not complete within it is answered 431.
pub(crate) const MAX_REQUEST_HEAD: usize = 64 * 1024;

/// The longest response head read from an upstream (the upstream read
/// buffer): a longer one makes the answer unusable.
pub(crate) const MAX_RESPONSE_HEAD: usize = 16 * 1024;
