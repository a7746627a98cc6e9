//! Makes the gRPC servers accept any `:authority`.
//!
//! The HTTP/2 server under tonic (h2) resets every stream whose
//! `:authority` is not a valid URI authority. gRPC clients on Unix sockets
//! send all sorts of them: kubelet since 1.26 sends `localhost`, but older
//! grpc-go clients send the socket path itself (`/var/lib/...`) or its
//! percent-encoded form (`%2Fvar%2Flib%2F...`), both of which h2 rejects.
//!
//! So every accepted connection runs through a small proxy: bytes from the
//! client are parsed into HTTP/2 frames, each header block is HPACK-decoded,
//! an invalid `:authority` is replaced by `localhost`, and the block is
//! re-encoded with literals only (no dynamic table, no Huffman), so the
//! server's decoder state never depends on what the client's encoder did.
//! All other frames, and everything the server sends, pass through as they
//! are. A connection whose frames or header blocks are malformed is closed,
//! as h2 itself would do.

use std::borrow::Cow;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::net::UnixStream;

/// The HTTP/2 client connection preface.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Frame types this proxy looks into.
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
/// Frame flags.
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// Largest frame payload the server accepts (the HTTP/2 default, which
/// tonic keeps); re-encoded header blocks are split to fit.
const MAX_FRAME: usize = 16_384;
/// Largest header block (all fragments) and largest decoded header list
/// accepted; kubelet's requests are a few hundred bytes.
const MAX_BLOCK: usize = 64 * 1024;
const MAX_HEADER_LIST: usize = 256 * 1024;
/// HPACK dynamic table size the server allows (the protocol default).
const MAX_TABLE: usize = 4096;
/// What replaces an invalid `:authority`.
const REPLACEMENT: &[u8] = b"localhost";
/// Buffer between the proxy and the in-process server.
const PIPE: usize = 64 * 1024;

/// Why a client connection was closed by the proxy.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProxyError {
    /// Reading from the client or writing to the server failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// The client broke HTTP/2 framing rules.
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    /// A header block could not be HPACK-decoded.
    #[error("compression error: {0:?}")]
    Compression(loona_hpack::decoder::DecoderError),
}

/// Starts the proxy for one accepted client connection and returns the
/// stream the gRPC server should serve instead.
pub(crate) fn proxy(client: UnixStream) -> DuplexStream {
    let (server_side, proxy_side) = tokio::io::duplex(PIPE);
    tokio::spawn(async move {
        let (client_rd, mut client_wr) = client.into_split();
        let (proxy_rd, mut proxy_wr) = tokio::io::split(proxy_side);
        let inbound = async move {
            let r = pump_inbound(client_rd, &mut proxy_wr).await;
            // Whatever happened, the server sees the end of the input.
            let _ = proxy_wr.shutdown().await;
            r
        };
        let outbound = async move {
            let mut proxy_rd = proxy_rd;
            let r = tokio::io::copy(&mut proxy_rd, &mut client_wr).await;
            let _ = client_wr.shutdown().await;
            r
        };
        tokio::pin!(inbound, outbound);
        tokio::select! {
            r = &mut inbound => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "closing client connection");
                    return;
                }
                // The client finished sending; let the server finish answering.
                let _ = outbound.await;
            }
            // The server closed the connection: drop the client side too.
            _ = &mut outbound => {}
        }
    });
    server_side
}

/// Copies the client's byte stream to the server, rewriting header blocks.
pub(crate) async fn pump_inbound<R, W>(mut rd: R, wr: &mut W) -> Result<(), ProxyError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut preface = [0u8; PREFACE.len()];
    if !read_exact_or_eof(&mut rd, &mut preface).await? {
        return Ok(());
    }
    wr.write_all(&preface).await?;
    if &preface != PREFACE {
        // Not HTTP/2 with prior knowledge: let the server reject it.
        tokio::io::copy(&mut rd, wr).await?;
        return Ok(());
    }
    let mut rewriter = Rewriter::new();
    // The header block being collected: stream id, HEADERS flags, priority
    // bytes, fragments so far.
    let mut open: Option<OpenBlock> = None;
    loop {
        let mut head = [0u8; 9];
        if !read_exact_or_eof(&mut rd, &mut head).await? {
            return if open.is_some() {
                Err(ProxyError::Protocol(
                    "connection ended inside a header block",
                ))
            } else {
                Ok(())
            };
        }
        let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
        let kind = head[3];
        let flags = head[4];
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        match (kind, open.as_mut()) {
            (HEADERS, None) => {
                if len > MAX_BLOCK {
                    return Err(ProxyError::Protocol("header block too large"));
                }
                let payload = read_payload(&mut rd, len).await?;
                let block = OpenBlock::from_headers(stream, flags, &payload)?;
                if flags & END_HEADERS == 0 {
                    open = Some(block);
                } else {
                    wr.write_all(&rewriter.finish(block)?).await?;
                }
            }
            (CONTINUATION, Some(block)) => {
                if stream != block.stream {
                    return Err(ProxyError::Protocol("CONTINUATION on another stream"));
                }
                if block.fragment.len() + len > MAX_BLOCK {
                    return Err(ProxyError::Protocol("header block too large"));
                }
                let payload = read_payload(&mut rd, len).await?;
                block.fragment.extend_from_slice(&payload);
                if flags & END_HEADERS != 0 {
                    let done = open.take().expect("matched Some above");
                    wr.write_all(&rewriter.finish(done)?).await?;
                }
            }
            (_, Some(_)) => {
                return Err(ProxyError::Protocol(
                    "frame interleaved with a header block",
                ));
            }
            (CONTINUATION, None) => {
                return Err(ProxyError::Protocol("CONTINUATION without HEADERS"));
            }
            (_, None) => {
                wr.write_all(&head).await?;
                let copied = tokio::io::copy(&mut (&mut rd).take(len as u64), wr).await?;
                if copied != len as u64 {
                    return Err(ProxyError::Protocol("connection ended inside a frame"));
                }
            }
        }
    }
}

/// Reads exactly `buf.len()` bytes; `false` on a clean end of stream before
/// the first byte.
async fn read_exact_or_eof<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut [u8],
) -> Result<bool, ProxyError> {
    let mut got = 0;
    while got < buf.len() {
        let n = rd.read(&mut buf[got..]).await?;
        if n == 0 {
            return if got == 0 {
                Ok(false)
            } else {
                Err(ProxyError::Protocol("connection ended inside a frame"))
            };
        }
        got += n;
    }
    Ok(true)
}

async fn read_payload<R: AsyncRead + Unpin>(rd: &mut R, len: usize) -> Result<Vec<u8>, ProxyError> {
    let mut payload = vec![0u8; len];
    if len > 0 && !read_exact_or_eof(rd, &mut payload).await? {
        return Err(ProxyError::Protocol("connection ended inside a frame"));
    }
    Ok(payload)
}

/// A header block being collected from HEADERS + CONTINUATION frames.
#[derive(Debug)]
pub(crate) struct OpenBlock {
    stream: u32,
    /// END_STREAM of the HEADERS frame (the only flag carried over besides PRIORITY).
    flags: u8,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
}

impl OpenBlock {
    /// Parses a HEADERS payload: padding and priority are split off.
    pub(crate) fn from_headers(stream: u32, flags: u8, payload: &[u8]) -> Result<Self, ProxyError> {
        let mut rest = payload;
        let mut pad = 0usize;
        if flags & PADDED != 0 {
            let (&p, tail) = rest
                .split_first()
                .ok_or(ProxyError::Protocol("PADDED HEADERS without pad length"))?;
            pad = usize::from(p);
            rest = tail;
        }
        let mut priority = None;
        if flags & PRIORITY != 0 {
            if rest.len() < 5 {
                return Err(ProxyError::Protocol("PRIORITY HEADERS too short"));
            }
            let mut p = [0u8; 5];
            p.copy_from_slice(&rest[..5]);
            priority = Some(p);
            rest = &rest[5..];
        }
        if pad > rest.len() {
            return Err(ProxyError::Protocol(
                "padding longer than the HEADERS payload",
            ));
        }
        Ok(Self {
            stream,
            flags: flags & 0x1,
            priority,
            fragment: rest[..rest.len() - pad].to_vec(),
        })
    }
}

/// Per-connection HPACK state: decodes with the client's table, re-encodes
/// without any table.
pub(crate) struct Rewriter {
    decoder: loona_hpack::Decoder<'static>,
}

impl Rewriter {
    pub(crate) fn new() -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(MAX_TABLE);
        Self { decoder }
    }

    /// Decodes a complete block, fixes `:authority`, and returns the
    /// HEADERS (+ CONTINUATION) frames to send to the server.
    pub(crate) fn finish(&mut self, block: OpenBlock) -> Result<Vec<u8>, ProxyError> {
        let encoded = self.rewrite_block(&block.fragment)?;
        Ok(frame_block(&block, &encoded))
    }

    /// Decodes one header block and re-encodes it with literals only,
    /// replacing an invalid `:authority`.
    pub(crate) fn rewrite_block(&mut self, fragment: &[u8]) -> Result<Vec<u8>, ProxyError> {
        let mut out = Vec::with_capacity(fragment.len() * 2);
        let mut size = 0usize;
        let mut too_large = false;
        self.decoder
            .decode_with_cb(fragment, |name: Cow<[u8]>, value: Cow<[u8]>| {
                // RFC 7541 §4.1 entry size; stops collecting (not decoding,
                // which must go on to keep the table in sync) past the cap.
                size += name.len() + value.len() + 32;
                if size > MAX_HEADER_LIST {
                    too_large = true;
                }
                if too_large {
                    return;
                }
                let value: &[u8] = if name.as_ref() == b":authority" && !valid_authority(&value) {
                    tracing::debug!(
                        authority = %String::from_utf8_lossy(&value),
                        "replacing an :authority the HTTP/2 server would reject"
                    );
                    REPLACEMENT
                } else {
                    &value
                };
                encode_literal(&mut out, &name, value);
            })
            .map_err(ProxyError::Compression)?;
        if too_large {
            return Err(ProxyError::Protocol("header list too large"));
        }
        Ok(out)
    }
}

/// Whether h2 would accept `value` as an `:authority`.
pub(crate) fn valid_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

/// Appends a "literal header field without indexing, new name" (RFC 7541
/// §6.2.2) with raw (non-Huffman) strings.
pub(crate) fn encode_literal(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0x00);
    encode_string(out, name);
    encode_string(out, value);
}

fn encode_string(out: &mut Vec<u8>, s: &[u8]) {
    // H bit clear: raw octets; 7-bit prefix length.
    loona_hpack::encoder::encode_integer_into(s.len(), 7, 0, out)
        .expect("writing into a Vec cannot fail");
    out.extend_from_slice(s);
}

/// Frames an encoded block as HEADERS plus as many CONTINUATION frames as
/// needed, each at most [`MAX_FRAME`] bytes.
fn frame_block(block: &OpenBlock, encoded: &[u8]) -> Vec<u8> {
    let prio_len = if block.priority.is_some() { 5 } else { 0 };
    let first_len = encoded.len().min(MAX_FRAME - prio_len);
    let (first, mut rest) = encoded.split_at(first_len);
    let mut out = Vec::with_capacity(encoded.len() + 9 * (2 + encoded.len() / MAX_FRAME));
    let mut flags = block.flags;
    if block.priority.is_some() {
        flags |= PRIORITY;
    }
    if rest.is_empty() {
        flags |= END_HEADERS;
    }
    push_frame_head(
        &mut out,
        first.len() + prio_len,
        HEADERS,
        flags,
        block.stream,
    );
    if let Some(p) = block.priority {
        out.extend_from_slice(&p);
    }
    out.extend_from_slice(first);
    while !rest.is_empty() {
        let n = rest.len().min(MAX_FRAME);
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        let flags = if rest.is_empty() { END_HEADERS } else { 0 };
        push_frame_head(&mut out, chunk.len(), CONTINUATION, flags, block.stream);
        out.extend_from_slice(chunk);
    }
    out
}

fn push_frame_head(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    let len = u32::try_from(len).expect("frames are at most MAX_FRAME bytes");
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
}

#[cfg(test)]
mod tests;
