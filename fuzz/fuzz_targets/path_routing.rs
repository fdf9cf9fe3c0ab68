//! Path canonicalization and route matching (`proxy::canonical`,
//! `proxy::routes`): the gate decision must cover every reading of a path
//! that an app server behind the gateway may route on.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use rolegate::fuzzing::canonical::{
    canonical, match_readings, percent_decode, prefix_matches, reading, BadPath, Steps,
};
use rolegate::fuzzing::routes::{RouteError, RouteTable};

/// Canonical prefixes of the table, with their targets.
const PREFIXES: &[(&str, u8)] = &[
    ("/maintenance", 0),
    ("/maintenance/deep", 1),
    ("/orders", 2),
];

fn table() -> &'static RouteTable<u8> {
    static T: OnceLock<RouteTable<u8>> = OnceLock::new();
    T.get_or_init(|| {
        let mut t = RouteTable::new(true);
        for (p, target) in PREFIXES {
            t.add(&[p.to_string()], *target);
        }
        t
    })
}

/// The target of the longest prefix `r` falls under (independent of
/// `RouteTable`'s own ordering: longest prefix by length).
fn longest(r: &[u8]) -> Option<u8> {
    PREFIXES
        .iter()
        .filter(|(p, _)| prefix_matches(p.as_bytes(), r, true))
        .max_by_key(|(p, _)| p.len())
        .map(|(_, t)| *t)
}

/// One step a server applies to the raw path before routing on it.
#[derive(Clone, Copy)]
enum Op {
    /// Drop each segment's `;parameters`.
    Params,
    /// Percent-decode once.
    Decode,
    /// Read `\` as `/`.
    Backslash,
}

fn apply(path: &[u8], op: Op) -> Vec<u8> {
    match op {
        Op::Params => {
            let mut out = Vec::with_capacity(path.len());
            for (i, seg) in path.split(|b| *b == b'/').enumerate() {
                if i > 0 {
                    out.push(b'/');
                }
                out.extend_from_slice(seg.split(|b| *b == b';').next().unwrap_or_default());
            }
            out
        }
        Op::Decode => percent_decode(path).into_owned(),
        Op::Backslash => path
            .iter()
            .map(|b| if *b == b'\\' { b'/' } else { *b })
            .collect(),
    }
}

/// The orders `canonical::readings` models: any of decode, backslash,
/// params in that order, or raw params first (Tomcat, Spring).
const MODELLED: &[&[Op]] = {
    use Op::*;
    &[
        &[],
        &[Decode],
        &[Backslash],
        &[Params],
        &[Decode, Backslash],
        &[Decode, Params],
        &[Backslash, Params],
        &[Decode, Backslash, Params],
        &[Params, Decode],
        &[Params, Backslash],
        &[Params, Decode, Backslash],
    ]
};

/// The other orders (each step at most once): backslash before decoding,
/// params between decoding and backslash. No server is known here to use
/// them; always checked (finding 3 in docs/reliability.md, Fuzzing, is fixed).
const OTHER: &[&[Op]] = {
    use Op::*;
    &[
        &[Backslash, Decode],
        &[Decode, Params, Backslash],
        &[Params, Backslash, Decode],
        &[Backslash, Params, Decode],
        &[Backslash, Decode, Params],
    ]
};

fn check_known() -> bool {
    // The findings this once skipped are fixed in src/: always checked.
    true
}

/// Readings of servers that apply the steps in each of `orders`, then merge
/// and/or remove dot segments: an oracle written independently of
/// `canonical::reading`'s step flags.
fn order_readings(path: &[u8], orders: &[&[Op]]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for order in orders {
        let mut p = path.to_vec();
        for op in *order {
            p = apply(&p, *op);
        }
        for bits in 0u8..4 {
            let steps = Steps {
                decode: false,
                backslash: false,
                params: false,
                merge: bits & 1 != 0,
                dots: bits & 2 != 0,
                raw_params: false,
                cut_query: false,
            };
            if let Ok(r) = reading(&p, steps) {
                if !out.contains(&r) {
                    out.push(r);
                }
            }
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let Ok(path) = std::str::from_utf8(data) else {
        return;
    };
    let canon = canonical(path, true);
    // With case folding: every reading, and those with non-ASCII letters a
    // router folds to ASCII folded.
    let reads = match_readings(path, true);
    let found = table().find(path);

    // The three entry points agree on what is not a gateable path.
    match (&canon, &reads, &found) {
        (Ok(_), Ok(_), Ok(_) | Err(RouteError::Ambiguous)) => {}
        (Err(a), Err(b), Err(RouteError::BadPath(c))) if a == b && b == c => {}
        _ => panic!(
            "disagreement on {path:?}: canonical {canon:?} readings {reads:?} find {found:?}"
        ),
    }
    if !path.starts_with('/') {
        assert_eq!(canon, Err(BadPath::NotAPath));
        return;
    }
    let (Ok(canon), Ok(reads)) = (canon, reads) else {
        return;
    };

    // Shape of the canonical form.
    assert!(canon.starts_with(b"/"), "{path:?} -> {canon:?}");
    assert!(
        !canon.windows(2).any(|w| w == b"//"),
        "`//` in {canon:?} from {path:?}"
    );
    assert!(
        !canon.split(|b| *b == b'/').any(|s| s == b"." || s == b".."),
        "dot segment in {canon:?} from {path:?}"
    );
    assert!(
        !canon.iter().any(|b| b.is_ascii_control()),
        "control byte in {canon:?}"
    );
    assert!(
        !canon.iter().any(|b| b.is_ascii_uppercase()),
        "case not folded: {canon:?}"
    );
    assert!(
        canon == b"/" || !canon.ends_with(b"/"),
        "trailing slash: {canon:?}"
    );
    // The canonical form is the first reading (case folded).
    assert_eq!(reads[0].to_ascii_lowercase(), canon, "{path:?}");

    // Idempotent where a second pass has nothing left to decode or split.
    if let Ok(c) = std::str::from_utf8(&canon) {
        if !c.contains(['%', '\\', ';']) {
            assert_eq!(
                canonical(c, true).as_deref(),
                Ok(&canon[..]),
                "canonical not idempotent: {path:?} -> {c:?}"
            );
        }
    }

    // find() against an independent longest-prefix oracle over the readings.
    let targets: Vec<Option<u8>> = reads.iter().map(|r| longest(r)).collect();
    let mut hit: Vec<u8> = targets.iter().flatten().copied().collect();
    hit.sort_unstable();
    hit.dedup();
    match (&found, hit.as_slice()) {
        (Ok(None), []) => {}
        (Ok(Some(t)), [u]) if *t == u => {}
        (Err(RouteError::Ambiguous), [_, _, ..]) => {}
        _ => panic!("find({path:?}) = {found:?} but readings {reads:?} fall under {hit:?}"),
    }
    if let Ok(None) = found {
        for r in &reads {
            for (p, _) in PREFIXES {
                assert!(
                    !prefix_matches(p.as_bytes(), r, true),
                    "ungated {path:?}: reading {r:?} is under {p}"
                );
            }
        }
    }
    if prefix_matches(b"/maintenance", &canon, true) {
        assert!(
            !matches!(found, Ok(None)),
            "canonical {canon:?} is gated, find said no route"
        );
    }

    // A path that a server applying params / decode / backslash in a
    // modelled order (or, with ROLEGATE_FUZZ_KNOWN=1, in any order) routes
    // under a prefix is not let through ungated.
    if matches!(found, Ok(None)) {
        let mut r = order_readings(path.as_bytes(), MODELLED);
        if check_known() {
            r.extend(order_readings(path.as_bytes(), OTHER));
        }
        // Routers that decode, split off a decoded `?`/`#`, and fold case as
        // JavaScript's toLowerCase or Python's str.lower do (beyond ASCII).
        let decoded = percent_decode(path.as_bytes()).into_owned();
        let cut: Vec<u8> = decoded
            .split(|b| *b == b'?' || *b == b'#')
            .next()
            .unwrap_or_default()
            .to_vec();
        for d in [decoded, cut] {
            if let Ok(text) = std::str::from_utf8(&d) {
                let lowered = text.to_lowercase();
                r.extend(order_readings(lowered.as_bytes(), &[&[]]));
                let upper_lowered = text.to_uppercase().to_lowercase();
                r.extend(order_readings(upper_lowered.as_bytes(), &[&[]]));
            }
        }
        for r in r {
            for (p, _) in PREFIXES {
                assert!(
                    !prefix_matches(p.as_bytes(), &r, true),
                    "ungated {path:?}: a server may read {:?}, under {p}",
                    String::from_utf8_lossy(&r)
                );
            }
        }
    }
});
