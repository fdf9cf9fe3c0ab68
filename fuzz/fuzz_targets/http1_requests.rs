//! The gateway's HTTP/1 request codec against hyper's server: the same
//! bytes, read by both, must give the same requests (method, target,
//! version, fields, body), the same refusal status, and the same place where
//! each body ends.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rolegate::fuzzing::oracle;

fuzz_target!(|data: &[u8]| {
    let codec = oracle::codec_requests(data);
    let hyper = oracle::hyper_requests(data);
    assert!(
        codec.agrees_with(&hyper),
        "{:?}\ncodec: {codec:?}\nhyper: {hyper:?}",
        String::from_utf8_lossy(data)
    );
});
