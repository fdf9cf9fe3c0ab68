//! The gateway's HTTP/1 response codec against hyper's client: the same
//! bytes, answered to a GET (or, if the first byte is odd, a HEAD), must
//! give the same status, version, fields and body, or be refused by both.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rolegate::fuzzing::oracle;

fuzz_target!(|data: &[u8]| {
    let Some((&first, input)) = data.split_first() else {
        return;
    };
    let head = first % 2 == 1;
    let codec = oracle::codec_response(input, head);
    let hyper = oracle::hyper_response(input, head);
    assert!(
        codec == hyper,
        "{:?} (HEAD: {head})\ncodec: {codec:?}\nhyper: {hyper:?}",
        String::from_utf8_lossy(input)
    );
});
