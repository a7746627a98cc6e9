//! A hand-built HTTP/2 client for one unary gRPC call over a Unix socket.
//!
//! Client libraries refuse to send what this module exists to send: an
//! `:authority` that is no URI authority (the socket path, or its
//! percent-encoded form, as older grpc-go clients sent), and request bodies
//! that are not valid protobuf. Requests are encoded with HPACK literals
//! only; responses are decoded with a full HPACK decoder.

use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use super::Error;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
const MAX_FRAME: usize = 16_384;
/// The initial flow-control window: bodies must fit without WINDOW_UPDATEs.
const MAX_BODY: usize = 65_535;
const STREAM: u32 = 1;

/// What came back from one raw call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RawResponse {
    /// `:status` of the response headers, if any arrived.
    pub http_status: Option<u16>,
    /// `grpc-status` from the trailers (or a trailers-only response).
    pub grpc_status: Option<i32>,
    /// `grpc-message`, if any.
    pub grpc_message: Option<String>,
    /// The response body (length-prefixed gRPC messages).
    pub body: Vec<u8>,
    /// The RST_STREAM error code, if the server reset the stream.
    pub reset: Option<u32>,
}

impl RawResponse {
    /// The gRPC messages in the body, without their 5-byte prefixes.
    pub fn messages(&self) -> Result<Vec<Vec<u8>>, Error> {
        let mut out = Vec::new();
        let mut rest = &self.body[..];
        while !rest.is_empty() {
            if rest.len() < 5 {
                return Err(Error::Raw("truncated gRPC message prefix".into()));
            }
            let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
            if rest.len() < 5 + len {
                return Err(Error::Raw("truncated gRPC message".into()));
            }
            out.push(rest[5..5 + len].to_vec());
            rest = &rest[5 + len..];
        }
        Ok(out)
    }
}

/// Frames `message` as one uncompressed gRPC message.
pub fn grpc_frame(message: &[u8]) -> Vec<u8> {
    let len = u32::try_from(message.len()).expect("gRPC messages are below 4 GiB");
    let mut v = Vec::with_capacity(5 + message.len());
    v.push(0);
    v.extend_from_slice(&len.to_be_bytes());
    v.extend_from_slice(message);
    v
}

/// Sends one POST to `path` on `socket` with the given `:authority` and
/// raw request `body` (use [`grpc_frame`] for a well-formed one), and
/// collects the response until the stream ends, is reset, or `timeout`.
pub async fn call(
    socket: &Path,
    authority: &str,
    path: &str,
    body: &[u8],
    timeout: Duration,
) -> Result<RawResponse, Error> {
    if body.len() > MAX_BODY {
        return Err(Error::Raw(format!(
            "body of {} bytes exceeds {MAX_BODY}",
            body.len()
        )));
    }
    let mut conn = UnixStream::connect(socket)
        .await
        .map_err(|e| Error::Connect {
            socket: socket.to_owned(),
            message: e.to_string(),
        })?;
    tokio::time::timeout(timeout, exchange(&mut conn, authority, path, body))
        .await
        .map_err(|_| Error::Wait(timeout, format!("a response on {}", socket.display())))?
}

async fn exchange(
    conn: &mut UnixStream,
    authority: &str,
    path: &str,
    body: &[u8],
) -> Result<RawResponse, Error> {
    let io = |e: std::io::Error| Error::Raw(e.to_string());
    let mut out = PREFACE.to_vec();
    push_frame(&mut out, SETTINGS, 0, 0, &[]);
    let mut block = Vec::new();
    for (n, v) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ] {
        encode_literal(&mut block, n.as_bytes(), v.as_bytes());
    }
    push_frame(&mut out, HEADERS, END_HEADERS, STREAM, &block);
    let mut chunks = body.chunks(MAX_FRAME).peekable();
    if chunks.peek().is_none() {
        push_frame(&mut out, DATA, END_STREAM, STREAM, &[]);
    }
    while let Some(chunk) = chunks.next() {
        let flags = if chunks.peek().is_none() {
            END_STREAM
        } else {
            0
        };
        push_frame(&mut out, DATA, flags, STREAM, chunk);
    }
    conn.write_all(&out).await.map_err(io)?;

    let mut decoder = loona_hpack::Decoder::new();
    let mut resp = RawResponse::default();
    let mut open_block: Option<(u8, Vec<u8>)> = None;
    loop {
        let mut head = [0u8; 9];
        if let Err(e) = conn.read_exact(&mut head).await {
            return if e.kind() == std::io::ErrorKind::UnexpectedEof {
                Err(Error::Raw(format!(
                    "connection closed before the stream ended: {resp:?}"
                )))
            } else {
                Err(io(e))
            };
        }
        let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        conn.read_exact(&mut payload).await.map_err(io)?;
        match kind {
            SETTINGS if flags & ACK == 0 => {
                let mut ack = Vec::new();
                push_frame(&mut ack, SETTINGS, ACK, 0, &[]);
                conn.write_all(&ack).await.map_err(io)?;
            }
            PING if flags & ACK == 0 => {
                let mut pong = Vec::new();
                push_frame(&mut pong, PING, ACK, 0, &payload);
                conn.write_all(&pong).await.map_err(io)?;
            }
            GOAWAY => {
                return Err(Error::Raw(format!("server sent GOAWAY: {resp:?}")));
            }
            RST_STREAM if stream == STREAM && payload.len() == 4 => {
                resp.reset = Some(u32::from_be_bytes([
                    payload[0], payload[1], payload[2], payload[3],
                ]));
                return Ok(resp);
            }
            HEADERS if stream == STREAM => {
                let fragment = strip_headers_payload(flags, &payload)?;
                if flags & END_HEADERS == 0 {
                    open_block = Some((flags, fragment));
                } else {
                    apply_headers(&mut decoder, &mut resp, &fragment)?;
                    if flags & END_STREAM != 0 {
                        return Ok(resp);
                    }
                }
            }
            CONTINUATION if stream == STREAM => {
                let Some((first_flags, mut fragment)) = open_block.take() else {
                    return Err(Error::Raw("CONTINUATION without HEADERS".into()));
                };
                fragment.extend_from_slice(&payload);
                if flags & END_HEADERS == 0 {
                    open_block = Some((first_flags, fragment));
                } else {
                    apply_headers(&mut decoder, &mut resp, &fragment)?;
                    if first_flags & END_STREAM != 0 {
                        return Ok(resp);
                    }
                }
            }
            DATA if stream == STREAM => {
                let data = strip_padding(flags, &payload)?;
                resp.body.extend_from_slice(data);
                if flags & END_STREAM != 0 {
                    return Ok(resp);
                }
            }
            _ => {}
        }
    }
}

/// Decodes a header block (headers or trailers) into `resp`.
fn apply_headers(
    decoder: &mut loona_hpack::Decoder<'static>,
    resp: &mut RawResponse,
    block: &[u8],
) -> Result<(), Error> {
    let headers = decoder
        .decode(block)
        .map_err(|e| Error::Raw(format!("cannot decode response headers: {e:?}")))?;
    for (n, v) in headers {
        let v = String::from_utf8_lossy(&v).into_owned();
        match &n[..] {
            b":status" => resp.http_status = v.parse().ok(),
            b"grpc-status" => resp.grpc_status = v.parse().ok(),
            b"grpc-message" => resp.grpc_message = Some(v),
            _ => {}
        }
    }
    Ok(())
}

fn strip_padding(flags: u8, payload: &[u8]) -> Result<&[u8], Error> {
    if flags & PADDED == 0 {
        return Ok(payload);
    }
    let (&pad, rest) = payload
        .split_first()
        .ok_or_else(|| Error::Raw("PADDED frame without pad length".into()))?;
    rest.len()
        .checked_sub(usize::from(pad))
        .map(|end| &rest[..end])
        .ok_or_else(|| Error::Raw("padding longer than the frame".into()))
}

fn strip_headers_payload(flags: u8, payload: &[u8]) -> Result<Vec<u8>, Error> {
    let mut rest = strip_padding(flags, payload)?;
    if flags & PRIORITY != 0 {
        rest = rest
            .get(5..)
            .ok_or_else(|| Error::Raw("PRIORITY HEADERS too short".into()))?;
    }
    Ok(rest.to_vec())
}

fn push_frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = u32::try_from(payload.len()).expect("frames are small");
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// HPACK "literal header field without indexing, new name", raw strings.
fn encode_literal(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0x00);
    for s in [name, value] {
        loona_hpack::encoder::encode_integer_into(s.len(), 7, 0, out)
            .expect("writing into a Vec cannot fail");
        out.extend_from_slice(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_decode_with_a_standard_decoder() {
        let mut block = Vec::new();
        let long = "x".repeat(300);
        encode_literal(&mut block, b":authority", b"%2Ftmp%2Fx.sock");
        encode_literal(&mut block, b"x-long", long.as_bytes());
        let decoded = loona_hpack::Decoder::new().decode(&block).unwrap();
        assert_eq!(
            decoded[0],
            (b":authority".to_vec(), b"%2Ftmp%2Fx.sock".to_vec())
        );
        assert_eq!(decoded[1].1.len(), 300);
    }

    #[test]
    fn messages_split_the_body() {
        let mut r = RawResponse {
            body: [grpc_frame(b"ab"), grpc_frame(b"")].concat(),
            ..RawResponse::default()
        };
        assert_eq!(r.messages().unwrap(), vec![b"ab".to_vec(), Vec::new()]);
        r.body.truncate(3);
        assert!(r.messages().is_err());
    }

    #[test]
    fn padding_is_checked() {
        assert_eq!(strip_padding(PADDED, &[1, 7, 0]).unwrap(), &[7]);
        assert!(strip_padding(PADDED, &[5, 7]).is_err());
        assert!(strip_padding(PADDED, &[]).is_err());
        assert!(strip_headers_payload(PRIORITY, &[0, 0]).is_err());
    }
}
