//! Chunked transfer coding, read as hyper's HTTP/1 decoder reads it: the
//! same size lines, extension and trailer limits, and the same verdict on
//! where the body ends. It finds the data in place; it never copies it.

use super::head::{MAX_CHUNK_EXTENSION_BYTES, MAX_HEADERS};

/// Trailer bytes a body may end with (hyper's limit).
const MAX_TRAILER_BYTES: usize = 16 * 1024;

/// Where the decoder is within the coding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before a size line's first digit.
    Start,
    Size,
    /// Spaces or tabs after the size.
    SizeSpace,
    Extension,
    SizeLf,
    /// Inside a chunk's data, `remaining` bytes to go.
    Data,
    DataCr,
    DataLf,
    /// Inside a trailer line.
    Trailer,
    TrailerLf,
    /// After the last chunk or a trailer line: a blank line ends the body.
    EndCr,
    EndLf,
    Done,
}

/// A malformed chunked body (hyper's decoder refuses the same bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChunkError(pub(crate) &'static str);

/// What one call of [`Decoder::step`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Step {
    /// Input bytes taken, framing and data both.
    pub(crate) used: usize,
    /// Chunk data within those bytes, as a range of the input.
    pub(crate) data: std::ops::Range<usize>,
    /// The body's last byte has been taken.
    pub(crate) done: bool,
}

/// Reads a chunked body from successive slices of the stream.
#[derive(Debug)]
pub(crate) struct Decoder {
    state: State,
    /// The size being read, then the data left in the chunk.
    remaining: u64,
    extension_bytes: u64,
    /// Trailer lines as sent, kept only if the body has any.
    trailers: Vec<u8>,
    trailer_lines: usize,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Decoder {
    pub(crate) fn new() -> Self {
        Self {
            state: State::Start,
            remaining: 0,
            extension_bytes: 0,
            trailers: Vec::new(),
            trailer_lines: 0,
        }
    }

    #[cfg(any(test, fuzzing))] // the oracle's
    /// Whether the body has ended.
    pub(crate) fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Takes framing bytes from `input` until it meets chunk data (returned
    /// as a range, at most what the input holds), the body's end, or the end
    /// of the input. Call again with the bytes after `used`.
    pub(crate) fn step(&mut self, input: &[u8]) -> Result<Step, ChunkError> {
        let mut i = 0;
        while i < input.len() {
            if self.state == State::Data {
                let take = usize::try_from(self.remaining)
                    .unwrap_or(usize::MAX)
                    .min(input.len() - i);
                self.remaining -= take as u64;
                if self.remaining == 0 {
                    self.state = State::DataCr;
                }
                return Ok(Step {
                    used: i + take,
                    data: i..i + take,
                    done: false,
                });
            }
            self.byte(input[i])?;
            i += 1;
            if self.state == State::Done {
                return Ok(Step {
                    used: i,
                    data: i..i,
                    done: true,
                });
            }
        }
        Ok(Step {
            used: i,
            data: i..i,
            done: self.state == State::Done,
        })
    }

    fn byte(&mut self, b: u8) -> Result<(), ChunkError> {
        use State::*;
        self.state = match (self.state, b) {
            (Start | Size, _) if b.is_ascii_hexdigit() => {
                let digit = u64::from((b as char).to_digit(16).unwrap_or(0));
                self.remaining = self
                    .remaining
                    .checked_mul(16)
                    .and_then(|n| n.checked_add(digit))
                    .ok_or(ChunkError("chunk size overflows"))?;
                Size
            }
            (Start, _) => return Err(ChunkError("chunk size line has no digit")),
            (Size | SizeSpace, b'\t' | b' ') => SizeSpace,
            (Size | SizeSpace, b';') => Extension,
            (Size | SizeSpace, b'\r') => SizeLf,
            (Size, _) => return Err(ChunkError("invalid chunk size")),
            (SizeSpace, _) => return Err(ChunkError("invalid space after chunk size")),
            (Extension, b'\r') => SizeLf,
            (Extension, b'\n') => return Err(ChunkError("chunk extension holds a new line")),
            (Extension, _) => {
                self.extension_bytes += 1;
                if self.extension_bytes >= MAX_CHUNK_EXTENSION_BYTES {
                    return Err(ChunkError("chunk extensions over their limit"));
                }
                Extension
            }
            (SizeLf, b'\n') if self.remaining == 0 => EndCr,
            (SizeLf, b'\n') => Data,
            (SizeLf, _) => return Err(ChunkError("chunk size line without LF")),
            (DataCr, b'\r') => DataLf,
            (DataCr, _) => return Err(ChunkError("chunk data without CR")),
            (DataLf, b'\n') => Start,
            (DataLf, _) => return Err(ChunkError("chunk data without LF")),
            (Trailer, _) => {
                self.keep_trailer(b)?;
                if b == b'\r' {
                    TrailerLf
                } else {
                    Trailer
                }
            }
            (TrailerLf, b'\n') => {
                if self.trailer_lines >= MAX_HEADERS {
                    return Err(ChunkError("too many trailer fields"));
                }
                self.trailer_lines += 1;
                self.keep_trailer(b)?;
                EndCr
            }
            (TrailerLf, _) => return Err(ChunkError("trailer line without LF")),
            (EndCr, b'\r') => {
                if !self.trailers.is_empty() {
                    self.keep_trailer(b)?;
                }
                EndLf
            }
            (EndCr, _) => {
                self.keep_trailer(b)?;
                Trailer
            }
            (EndLf, b'\n') => {
                if !self.trailers.is_empty() {
                    self.keep_trailer(b)?;
                    self.check_trailers()?;
                }
                Done
            }
            (EndLf, _) => return Err(ChunkError("chunked body without its final LF")),
            (Data | Done, _) => return Err(ChunkError("bytes after the chunked body")),
        };
        Ok(())
    }

    fn keep_trailer(&mut self, b: u8) -> Result<(), ChunkError> {
        self.trailers.push(b);
        if self.trailers.len() >= MAX_TRAILER_BYTES {
            return Err(ChunkError("trailers over their limit"));
        }
        Ok(())
    }

    /// Trailer lines must parse as header fields, as hyper parses them.
    fn check_trailers(&self) -> Result<(), ChunkError> {
        let mut fields = vec![httparse::EMPTY_HEADER; self.trailer_lines];
        match httparse::parse_headers(&self.trailers, &mut fields) {
            Ok(httparse::Status::Complete((_, fields))) => {
                if fields.iter().all(|f| {
                    http::HeaderName::from_bytes(f.name.as_bytes()).is_ok()
                        && http::HeaderValue::from_bytes(f.value).is_ok()
                }) {
                    Ok(())
                } else {
                    Err(ChunkError("invalid trailer field"))
                }
            }
            Ok(httparse::Status::Partial) | Err(_) => Err(ChunkError("invalid trailer field")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `raw` in slices of `n` bytes; returns the data and the bytes
    /// the body took.
    fn decode(raw: &[u8], n: usize) -> Result<(Vec<u8>, usize), ChunkError> {
        let mut d = Decoder::new();
        let mut data = Vec::new();
        let mut at = 0;
        while at < raw.len() && !d.is_done() {
            let end = (at + n).min(raw.len());
            let step = d.step(&raw[at..end])?;
            data.extend_from_slice(&raw[at..end][step.data.clone()]);
            at += step.used;
        }
        assert!(d.is_done(), "body not ended");
        Ok((data, at))
    }

    #[test]
    fn data_extensions_and_trailers_end_where_the_body_ends() {
        let raw = b"5;a=b\r\nhello\r\n3 \r\n, w\r\n0\r\nX-T: 1\r\n\r\nNEXT";
        for n in 1..raw.len() {
            let (data, used) = decode(raw, n).unwrap();
            assert_eq!(data, b"hello, w");
            assert_eq!(used, raw.len() - 4, "slices of {n}");
        }
    }

    #[test]
    fn malformed_codings_are_refused() {
        for raw in [
            &b"x\r\n"[..],
            b"5\nhello\r\n0\r\n\r\n",
            b"5\r\nhelloX\r\n",
            b"1;a\nb\r\n",
            b"10000000000000000\r\n",
            b"0\r\nX-T 1\r\n\r\n",
        ] {
            let mut d = Decoder::new();
            let mut at = 0;
            let err = loop {
                match d.step(&raw[at..]) {
                    Err(e) => break Some(e),
                    Ok(s) if s.done || s.used == 0 => break None,
                    Ok(s) => at += s.used,
                }
            };
            assert!(err.is_some(), "{} accepted", String::from_utf8_lossy(raw));
        }
    }
}
