//! Makes the gRPC servers accept any `:authority`.
//!
//! The HTTP/2 server under tonic (h2) resets every stream whose
//! `:authority` is not a valid URI authority. gRPC clients on Unix sockets
//! send all sorts of them: kubelet since 1.26 sends `localhost`, but older
//! grpc-go clients send the socket path itself (`/var/lib/...`) or its
//! percent-encoded form (`%2Fvar%2Flib%2F...`), both of which h2 rejects.
//!
//! So every accepted connection is wrapped in [`AuthorityFix`], which the
//! server reads through (no task, no extra copy of what the server sends):
//! bytes from the client are parsed into HTTP/2 frames until the first
//! header block is complete, and that block is HPACK-decoded.
//! - Its `:authority` is valid (or absent), as with kubelet: the block goes
//!   to the server as it came and the connection becomes a plain pass-through
//!   (reads go straight to the socket). A gRPC client sends one authority for
//!   all calls of a connection; should a later call carry an invalid one
//!   after all, h2 resets that stream only.
//! - It is invalid: the block and every later one are decoded with the
//!   client's table, the `:authority` is replaced by `localhost`, and each is
//!   re-encoded with literals only (no dynamic table, no Huffman), so the
//!   server's decoder state never depends on what the client's encoder did.
//!
//! All other frames pass through as they are. A connection whose frames or
//! header blocks are malformed gets a read error, and the server closes it,
//! as h2 itself would.
//!
//! The frame parsing is a byte-in, byte-out filter ([`Inbound`]), so it is
//! tested without sockets and cannot depend on how reads are split.

use std::borrow::Cow;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixStream;

/// The HTTP/2 client connection preface.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Frame types this filter looks into.
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
/// Bytes read from the socket at a time while frames are still parsed.
const READ_CHUNK: usize = 8192;

/// Why a client connection is closed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectionError {
    /// The client broke HTTP/2 framing rules.
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    /// A header block could not be HPACK-decoded.
    #[error("compression error: {0:?}")]
    Compression(loona_hpack::decoder::DecoderError),
}

/// What the filter does with the client's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Expecting the connection preface.
    Preface,
    /// Parsing frames until the first header block is complete.
    Inspect,
    /// Rewriting every header block (the first one had a bad authority).
    Rewrite,
    /// Passing everything through as it is.
    Passthrough,
}

/// The client-to-server byte filter of one connection.
pub(crate) struct Inbound {
    mode: Mode,
    /// Input not yet turned into output (at most a frame or a header block).
    pending: Vec<u8>,
    /// Payload bytes of a pass-through frame still to copy.
    copying: usize,
    /// The header block being collected, and its frames as they came.
    open: Option<(OpenBlock, Vec<u8>)>,
    rewriter: Rewriter,
}

impl Inbound {
    pub(crate) fn new() -> Self {
        Self {
            mode: Mode::Preface,
            pending: Vec::new(),
            copying: 0,
            open: None,
            rewriter: Rewriter::new(),
        }
    }

    /// Whether everything from now on passes through unread.
    pub(crate) fn is_passthrough(&self) -> bool {
        self.mode == Mode::Passthrough && self.pending.is_empty()
    }

    /// Takes the next bytes from the client and appends what the server
    /// should see to `out`.
    pub(crate) fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(), ConnectionError> {
        self.pending.extend_from_slice(input);
        loop {
            if self.mode == Mode::Passthrough {
                out.append(&mut self.pending);
                return Ok(());
            }
            if self.copying > 0 {
                let n = self.copying.min(self.pending.len());
                out.extend(self.pending.drain(..n));
                self.copying -= n;
                if self.copying > 0 {
                    return Ok(());
                }
                continue;
            }
            if self.mode == Mode::Preface {
                let n = self.pending.len().min(PREFACE.len());
                if self.pending[..n] != PREFACE[..n] {
                    // Not HTTP/2 with prior knowledge: let the server reject it.
                    self.mode = Mode::Passthrough;
                    continue;
                }
                if n < PREFACE.len() {
                    return Ok(());
                }
                out.extend(self.pending.drain(..PREFACE.len()));
                self.mode = Mode::Inspect;
                continue;
            }
            if !self.next_frame(out)? {
                return Ok(());
            }
        }
    }

    /// The client closed its side: fails when it stopped inside a frame.
    pub(crate) fn end(&mut self, out: &mut Vec<u8>) -> Result<(), ConnectionError> {
        match self.mode {
            // A partial preface is handed on: the server rejects it.
            Mode::Passthrough | Mode::Preface => {
                out.append(&mut self.pending);
                Ok(())
            }
            Mode::Inspect | Mode::Rewrite if self.open.is_some() => Err(ConnectionError::Protocol(
                "connection ended inside a header block",
            )),
            Mode::Inspect | Mode::Rewrite if self.copying > 0 || !self.pending.is_empty() => {
                Err(ConnectionError::Protocol("connection ended inside a frame"))
            }
            Mode::Inspect | Mode::Rewrite => Ok(()),
        }
    }

    /// Handles the frame at the start of `pending`; `false` when it is not
    /// complete yet (only HEADERS and CONTINUATION wait for their payload).
    fn next_frame(&mut self, out: &mut Vec<u8>) -> Result<bool, ConnectionError> {
        let Some(head) = self.pending.get(..9) else {
            return Ok(false);
        };
        let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        match (kind, self.open.as_mut()) {
            (HEADERS, None) => {
                if len > MAX_BLOCK {
                    return Err(ConnectionError::Protocol("header block too large"));
                }
                if self.pending.len() < 9 + len {
                    return Ok(false);
                }
                let frame: Vec<u8> = self.pending.drain(..9 + len).collect();
                let block = OpenBlock::from_headers(stream, flags, &frame[9..])?;
                if flags & END_HEADERS == 0 {
                    self.open = Some((block, frame));
                } else {
                    self.finish(block, &frame, out)?;
                }
            }
            (CONTINUATION, Some((block, _))) => {
                if stream != block.stream {
                    return Err(ConnectionError::Protocol("CONTINUATION on another stream"));
                }
                if block.fragment.len() + len > MAX_BLOCK {
                    return Err(ConnectionError::Protocol("header block too large"));
                }
                if self.pending.len() < 9 + len {
                    return Ok(false);
                }
                let (block, raw) = self.open.as_mut().expect("matched Some above");
                block.fragment.extend_from_slice(&self.pending[9..9 + len]);
                raw.extend(self.pending.drain(..9 + len));
                if flags & END_HEADERS != 0 {
                    let (block, raw) = self.open.take().expect("matched Some above");
                    self.finish(block, &raw, out)?;
                }
            }
            (_, Some(_)) => {
                return Err(ConnectionError::Protocol(
                    "frame interleaved with a header block",
                ));
            }
            (CONTINUATION, None) => {
                return Err(ConnectionError::Protocol("CONTINUATION without HEADERS"));
            }
            (_, None) => {
                out.extend(self.pending.drain(..9));
                self.copying = len;
            }
        }
        Ok(true)
    }

    /// A complete header block: `raw` is its frames as the client sent them.
    fn finish(
        &mut self,
        block: OpenBlock,
        raw: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), ConnectionError> {
        let (encoded, replaced) = self.rewriter.rewrite_block(&block.fragment)?;
        if self.mode == Mode::Inspect && !replaced {
            out.extend_from_slice(raw);
            self.mode = Mode::Passthrough;
        } else {
            out.extend(frame_block(&block, &encoded));
            self.mode = Mode::Rewrite;
        }
        Ok(())
    }
}

/// A client connection as the gRPC server reads it: see the module docs.
pub(crate) struct AuthorityFix<S> {
    inner: S,
    filter: Inbound,
    /// Filtered bytes not yet handed to the server, from `out_pos`.
    out: Vec<u8>,
    out_pos: usize,
    eof: bool,
}

impl<S> AuthorityFix<S> {
    pub(crate) fn new(inner: S) -> Self {
        Self {
            inner,
            filter: Inbound::new(),
            out: Vec::new(),
            out_pos: 0,
            eof: false,
        }
    }
}

fn closing(e: &ConnectionError) -> io::Error {
    tracing::debug!(error = %e, "closing client connection");
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.out_pos < this.out.len() {
                let n = buf.remaining().min(this.out.len() - this.out_pos);
                buf.put_slice(&this.out[this.out_pos..this.out_pos + n]);
                this.out_pos += n;
                if this.out_pos == this.out.len() {
                    this.out.clear();
                    this.out_pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            if this.filter.is_passthrough() {
                return Pin::new(&mut this.inner).poll_read(cx, buf);
            }
            let mut chunk = [0u8; READ_CHUNK];
            let mut read = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            let result = if read.filled().is_empty() {
                this.eof = true;
                this.filter.end(&mut this.out)
            } else {
                this.filter.feed(read.filled(), &mut this.out)
            };
            if let Err(e) = result {
                this.eof = true;
                this.out.clear();
                this.out_pos = 0;
                return Poll::Ready(Err(closing(&e)));
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for AuthorityFix<UnixStream> {
    type ConnectInfo = <UnixStream as tonic::transport::server::Connected>::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
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
    pub(crate) fn from_headers(
        stream: u32,
        flags: u8,
        payload: &[u8],
    ) -> Result<Self, ConnectionError> {
        let mut rest = payload;
        let mut pad = 0usize;
        if flags & PADDED != 0 {
            let (&p, tail) = rest.split_first().ok_or(ConnectionError::Protocol(
                "PADDED HEADERS without pad length",
            ))?;
            pad = usize::from(p);
            rest = tail;
        }
        let mut priority = None;
        if flags & PRIORITY != 0 {
            if rest.len() < 5 {
                return Err(ConnectionError::Protocol("PRIORITY HEADERS too short"));
            }
            let mut p = [0u8; 5];
            p.copy_from_slice(&rest[..5]);
            priority = Some(p);
            rest = &rest[5..];
        }
        if pad > rest.len() {
            return Err(ConnectionError::Protocol(
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

    /// Decodes one header block and re-encodes it with literals only,
    /// replacing an invalid `:authority`; `true` when it replaced one.
    pub(crate) fn rewrite_block(
        &mut self,
        fragment: &[u8],
    ) -> Result<(Vec<u8>, bool), ConnectionError> {
        let mut out = Vec::with_capacity(fragment.len() * 2);
        let mut size = 0usize;
        let mut too_large = false;
        let mut replaced = false;
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
                    replaced = true;
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
            .map_err(ConnectionError::Compression)?;
        if too_large {
            return Err(ConnectionError::Protocol("header list too large"));
        }
        Ok((out, replaced))
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
