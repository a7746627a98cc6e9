use super::*;

type Headers = Vec<(Vec<u8>, Vec<u8>)>;

fn request(authority: &str, path: &str) -> Headers {
    [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    .iter()
    .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
    .collect()
}

fn encode(enc: &mut loona_hpack::Encoder<'_>, h: &Headers) -> Vec<u8> {
    enc.encode(h.iter().map(|(n, v)| (&n[..], &v[..])))
}

fn authority_of(h: &Headers) -> String {
    let (_, v) = h.iter().find(|(n, _)| n == b":authority").unwrap();
    String::from_utf8(v.clone()).unwrap()
}

#[test]
fn valid_authority_matches_h2s_rules() {
    assert!(valid_authority(b"localhost"));
    assert!(valid_authority(b"localhost:1234"));
    assert!(!valid_authority(b"%2Ftmp%2Fx%2Fdra.sock"));
    assert!(!valid_authority(b"/var/lib/kubelet/plugins/x/dra.sock"));
    assert!(!valid_authority(b""));
}

#[test]
fn invalid_authorities_are_replaced_and_valid_ones_kept() {
    // The client encoder uses its dynamic table across blocks; the output
    // must decode with a fresh decoder (the server's) every time.
    let mut client = loona_hpack::Encoder::new();
    let mut rw = Rewriter::new();
    let mut server = loona_hpack::Decoder::new();
    for (sent, seen) in [
        ("%2Ftmp%2Fx%2Fdra.sock", "localhost"),
        ("%2Ftmp%2Fx%2Fdra.sock", "localhost"),
        ("/tmp/x/dra.sock", "localhost"),
        ("localhost", "localhost"),
        ("example:80", "example:80"),
    ] {
        let block = encode(&mut client, &request(sent, "/a.B/C"));
        let (out, replaced) = rw.rewrite_block(&block).unwrap();
        assert_eq!(replaced, sent != seen, "sent {sent}");
        let decoded = server.decode(&out).unwrap();
        assert_eq!(authority_of(&decoded), seen, "sent {sent}");
        // Everything else is untouched, in order.
        assert_eq!(decoded, request(seen, "/a.B/C"));
    }
}

#[test]
fn garbage_blocks_are_compression_errors_not_panics() {
    for bad in [
        &[0xffu8, 0xff, 0xff, 0xff, 0xff, 0xff][..],
        &[0x80],
        &[0x7f, 0xff, 0xff],
        &[0x3f],
    ] {
        let mut rw = Rewriter::new();
        assert!(rw.rewrite_block(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn oversized_table_updates_are_refused() {
    let mut rw = Rewriter::new();
    // Dynamic table size update to 1 MiB, then an indexed :method GET.
    let mut block = Vec::new();
    loona_hpack::encoder::encode_integer_into(1 << 20, 5, 0x20, &mut block).unwrap();
    block.push(0x82);
    assert!(matches!(
        rw.rewrite_block(&block),
        Err(ConnectionError::Compression(_))
    ));
}

#[test]
fn header_blocks_that_expand_too_much_are_refused() {
    // One 4000-byte header in the dynamic table, then referenced 100 times:
    // a small block that would decode to ~400 KB.
    let mut client = loona_hpack::Encoder::new();
    let big = vec![(b"x-big".to_vec(), vec![b'a'; 4000])];
    let first = encode(&mut client, &big);
    let mut rw = Rewriter::new();
    rw.rewrite_block(&first).unwrap();
    let block = vec![0xbe; 100]; // indexed field 62: the newest dynamic entry
    assert!(matches!(
        rw.rewrite_block(&block),
        Err(ConnectionError::Protocol(_))
    ));
}

#[test]
fn headers_frames_lose_padding_and_keep_priority_and_end_stream() {
    let payload = [3u8, 0, 0, 0, 7, 16, 0x82, 0x84, 0, 0, 0];
    let b = OpenBlock::from_headers(5, PADDED | PRIORITY | 0x1, &payload).unwrap();
    assert_eq!(b.priority, Some([0, 0, 0, 7, 16]));
    assert_eq!(b.fragment, vec![0x82, 0x84]);
    let framed = frame_block(&b, &[1, 2]);
    assert_eq!(
        framed[..9],
        [0, 0, 7, HEADERS, PRIORITY | END_HEADERS | 0x1, 0, 0, 0, 5]
    );
    assert_eq!(framed[9..], [0, 0, 0, 7, 16, 1, 2]);

    assert!(OpenBlock::from_headers(1, PADDED, &[]).is_err());
    assert!(OpenBlock::from_headers(1, PADDED, &[9, 1, 2]).is_err());
    assert!(OpenBlock::from_headers(1, PRIORITY, &[0, 0]).is_err());
}

#[test]
fn large_blocks_are_split_into_continuation_frames() {
    let b = OpenBlock {
        stream: 3,
        flags: 0,
        priority: None,
        fragment: Vec::new(),
    };
    let encoded = vec![7u8; MAX_FRAME * 2 + 10];
    let framed = frame_block(&b, &encoded);
    let mut kinds = Vec::new();
    let mut rest = &framed[..];
    let mut total = 0;
    while !rest.is_empty() {
        let len = (usize::from(rest[0]) << 16) | (usize::from(rest[1]) << 8) | usize::from(rest[2]);
        assert!(len <= MAX_FRAME);
        kinds.push((rest[3], rest[4] & END_HEADERS != 0));
        total += len;
        rest = &rest[9 + len..];
    }
    assert_eq!(total, encoded.len());
    assert_eq!(
        kinds,
        vec![
            (HEADERS, false),
            (CONTINUATION, false),
            (CONTINUATION, true)
        ]
    );
}

/// Runs `input` through a fresh filter in chunks of `chunk` bytes.
fn filter_in_chunks(input: &[u8], chunk: usize) -> (Result<(), ConnectionError>, Vec<u8>) {
    let mut f = Inbound::new();
    let mut out = Vec::new();
    for piece in input.chunks(chunk.max(1)) {
        if let Err(e) = f.feed(piece, &mut out) {
            return (Err(e), out);
        }
    }
    let r = f.end(&mut out);
    (r, out)
}

/// Runs `input` through a fresh filter, at once and byte by byte; both
/// must give the same.
fn filter(input: &[u8]) -> (Result<(), ConnectionError>, Vec<u8>) {
    let whole = filter_in_chunks(input, input.len());
    let bytewise = filter_in_chunks(input, 1);
    assert_eq!(
        format!("{:?}", whole.0),
        format!("{:?}", bytewise.0),
        "outcome depends on read sizes"
    );
    if whole.0.is_ok() {
        assert_eq!(whole.1, bytewise.1, "output depends on read sizes");
    }
    whole
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    push_frame_head(&mut v, payload.len(), kind, flags, stream);
    v.extend_from_slice(payload);
    v
}

const SETTINGS: u8 = 0x4;
const DATA: u8 = 0x0;

#[test]
fn a_bad_first_authority_rewrites_every_block_split_or_not() {
    let mut client = loona_hpack::Encoder::new();
    let first = encode(&mut client, &request("%2Fx.sock", "/p"));
    // The second block leans on the client's dynamic table.
    let second = encode(&mut client, &request("%2Fx.sock", "/q"));
    let (a, b) = first.split_at(5);
    let mut input = PREFACE.to_vec();
    input.extend(frame(SETTINGS, 0, 0, &[]));
    input.extend(frame(HEADERS, 0, 1, a));
    input.extend(frame(CONTINUATION, END_HEADERS, 1, b));
    input.extend(frame(DATA, 0x1, 1, &[0, 0, 0, 0, 2, 8, 1]));
    input.extend(frame(HEADERS, END_HEADERS, 3, &second));
    let (r, out) = filter(&input);
    r.unwrap();
    assert_eq!(&out[..24], PREFACE);
    assert_eq!(out[24..33], frame(SETTINGS, 0, 0, &[])[..]);
    // HEADERS comes out as one frame with END_HEADERS.
    let mut server = loona_hpack::Decoder::new();
    let h = &out[33..];
    let len = (usize::from(h[1]) << 8) | usize::from(h[2]);
    assert_eq!((h[3], h[4]), (HEADERS, END_HEADERS));
    let decoded = server.decode(&h[9..9 + len]).unwrap();
    assert_eq!(decoded, request("localhost", "/p"));
    let rest = &h[9 + len..];
    let data = frame(DATA, 0x1, 1, &[0, 0, 0, 0, 2, 8, 1]);
    assert_eq!(rest[..data.len()], data[..]);
    let h = &rest[data.len()..];
    let len = (usize::from(h[1]) << 8) | usize::from(h[2]);
    assert_eq!((h[3], h[4], h[8]), (HEADERS, END_HEADERS, 3));
    assert_eq!(
        server.decode(&h[9..9 + len]).unwrap(),
        request("localhost", "/q")
    );
    assert_eq!(h.len(), 9 + len);
}

#[test]
fn a_good_first_authority_passes_the_connection_through_untouched() {
    let mut client = loona_hpack::Encoder::new();
    let first = encode(&mut client, &request("localhost", "/p"));
    let second = encode(&mut client, &request("localhost", "/q"));
    let (a, b) = first.split_at(3);
    let mut input = PREFACE.to_vec();
    input.extend(frame(SETTINGS, 0, 0, &[]));
    // Padding and priority are kept as sent.
    let mut padded = vec![2u8];
    padded.extend_from_slice(a);
    padded.extend_from_slice(&[0, 0]);
    input.extend(frame(HEADERS, PADDED, 1, &padded));
    input.extend(frame(CONTINUATION, END_HEADERS, 1, b));
    input.extend(frame(DATA, 0x1, 1, &[0, 0, 0, 0, 0]));
    input.extend(frame(HEADERS, END_HEADERS, 3, &second));
    // After the first block nothing is parsed: not even garbage.
    input.extend_from_slice(b"\xff\xff\xff not a frame");
    let (r, out) = filter(&input);
    r.unwrap();
    assert_eq!(out, input);
    // No :authority at all is fine too.
    let mut headers = request("x", "/p");
    headers.retain(|(n, _)| n != b":authority");
    let block = encode(&mut loona_hpack::Encoder::new(), &headers);
    let input = [PREFACE.to_vec(), frame(HEADERS, END_HEADERS, 1, &block)].concat();
    let (r, out) = filter(&input);
    r.unwrap();
    assert_eq!(out, input);
}

#[test]
fn the_filter_is_a_passthrough_once_decided() {
    let block = encode(
        &mut loona_hpack::Encoder::new(),
        &request("localhost", "/p"),
    );
    let mut f = Inbound::new();
    let mut out = Vec::new();
    f.feed(PREFACE, &mut out).unwrap();
    assert!(!f.is_passthrough());
    f.feed(&frame(HEADERS, END_HEADERS, 1, &block), &mut out)
        .unwrap();
    assert!(f.is_passthrough());
    let mut f = Inbound::new();
    f.feed(b"GET / HTTP/1.1\r\n", &mut out).unwrap();
    assert!(f.is_passthrough());
}

#[test]
fn framing_violations_are_refused() {
    let block = [0x82u8];
    let cases: Vec<Vec<u8>> = vec![
        // CONTINUATION without HEADERS.
        frame(CONTINUATION, END_HEADERS, 1, &block),
        // DATA in the middle of a header block.
        [frame(HEADERS, 0, 1, &block), frame(DATA, 0, 1, &[])].concat(),
        // CONTINUATION for another stream.
        [
            frame(HEADERS, 0, 1, &block),
            frame(CONTINUATION, END_HEADERS, 3, &block),
        ]
        .concat(),
        // Connection ends inside a header block.
        frame(HEADERS, 0, 1, &block),
        // Truncated frame, truncated frame head.
        frame(DATA, 0, 1, &[1, 2, 3])[..10].to_vec(),
        frame(DATA, 0, 1, &[1, 2, 3])[..5].to_vec(),
        // Header block over the limit, at once or over CONTINUATIONs.
        frame(HEADERS, 0, 1, &vec![0u8; MAX_BLOCK + 1]),
        [
            frame(HEADERS, 0, 1, &vec![0u8; MAX_BLOCK - 1]),
            frame(CONTINUATION, END_HEADERS, 1, &[0, 0]),
        ]
        .concat(),
        // Padding longer than the payload; priority too short.
        frame(HEADERS, END_HEADERS | PADDED, 1, &[9, 0x82]),
        frame(HEADERS, END_HEADERS | PRIORITY, 1, &[0, 0]),
        // Not HPACK.
        frame(
            HEADERS,
            END_HEADERS,
            1,
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
        ),
    ];
    for (i, c) in cases.into_iter().enumerate() {
        let (r, _) = filter(&[PREFACE.to_vec(), c].concat());
        assert!(
            matches!(
                r,
                Err(ConnectionError::Protocol(_) | ConnectionError::Compression(_))
            ),
            "case {i}: {r:?}"
        );
    }
    // A frame head claiming 16 MiB of DATA is not buffered: its bytes pass
    // as they come, and the server rejects the frame size.
    let mut f = Inbound::new();
    let mut out = Vec::new();
    f.feed(PREFACE, &mut out).unwrap();
    let mut head = Vec::new();
    push_frame_head(&mut head, 0xff_ffff, DATA, 0, 1);
    f.feed(&head, &mut out).unwrap();
    f.feed(&[7u8; 100], &mut out).unwrap();
    assert_eq!(out.len(), 24 + 9 + 100);
    assert!(f.pending.is_empty());
}

#[test]
fn non_http2_input_passes_through() {
    let (r, out) = filter(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nand more");
    r.unwrap();
    assert_eq!(out, b"GET / HTTP/1.1\r\nHost: x\r\n\r\nand more");
    let (r, out) = filter(&[]);
    r.unwrap();
    assert!(out.is_empty());
    // A preface cut short is handed on for the server to reject.
    let (r, out) = filter(&PREFACE[..10]);
    r.unwrap();
    assert_eq!(out, &PREFACE[..10]);
}

/// Through the stream wrapper, with small reads from the client side.
#[tokio::test]
async fn the_wrapper_reads_filtered_bytes_and_writes_straight_through() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut client_enc = loona_hpack::Encoder::new();
    let block = encode(&mut client_enc, &request("%2Fx.sock", "/p"));
    let input = [PREFACE.to_vec(), frame(HEADERS, END_HEADERS, 1, &block)].concat();
    let (mut client, server) = tokio::io::duplex(7);
    let mut wrapped = AuthorityFix::new(server);
    let writer = tokio::spawn(async move {
        client.write_all(&input).await.unwrap();
        client.shutdown().await.unwrap();
        let mut back = Vec::new();
        client.read_to_end(&mut back).await.unwrap();
        back
    });
    let mut seen = Vec::new();
    wrapped.read_to_end(&mut seen).await.unwrap();
    assert_eq!(&seen[..24], PREFACE);
    let decoded = loona_hpack::Decoder::new().decode(&seen[33..]).unwrap();
    assert_eq!(authority_of(&decoded), "localhost");
    wrapped.write_all(b"answer").await.unwrap();
    wrapped.shutdown().await.unwrap();
    drop(wrapped);
    assert_eq!(writer.await.unwrap(), b"answer");
}

/// A malformed connection is a read error for the server.
#[tokio::test]
async fn the_wrapper_turns_violations_into_read_errors() {
    use tokio::io::AsyncReadExt;
    let input = [
        PREFACE.to_vec(),
        frame(CONTINUATION, END_HEADERS, 1, &[0x82]),
    ]
    .concat();
    let mut wrapped = AuthorityFix::new(&input[..]);
    let mut seen = Vec::new();
    let err = wrapped.read_to_end(&mut seen).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    assert!(
        err.to_string().contains("CONTINUATION without HEADERS"),
        "{err}"
    );
}
