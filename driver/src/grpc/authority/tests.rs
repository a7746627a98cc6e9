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
        let out = rw.rewrite_block(&block).unwrap();
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
        Err(ProxyError::Compression(_))
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
        Err(ProxyError::Protocol(_))
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

async fn pump(input: Vec<u8>) -> (Result<(), ProxyError>, Vec<u8>) {
    let mut out = Vec::new();
    let r = pump_inbound(&input[..], &mut out).await;
    (r, out)
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    push_frame_head(&mut v, payload.len(), kind, flags, stream);
    v.extend_from_slice(payload);
    v
}

#[tokio::test]
async fn pump_rewrites_headers_split_over_continuations_and_passes_other_frames() {
    let mut client = loona_hpack::Encoder::new();
    let block = encode(&mut client, &request("%2Fx.sock", "/p"));
    let (a, b) = block.split_at(5);
    let mut input = PREFACE.to_vec();
    input.extend(frame(0x4, 0, 0, &[])); // SETTINGS
    input.extend(frame(HEADERS, 0, 1, a));
    input.extend(frame(CONTINUATION, END_HEADERS, 1, b));
    input.extend(frame(0x0, 0x1, 1, &[0, 0, 0, 0, 2, 8, 1])); // DATA, END_STREAM
    let (r, out) = pump(input).await;
    r.unwrap();
    assert_eq!(&out[..24], PREFACE);
    assert_eq!(out[24..33], frame(0x4, 0, 0, &[])[..]);
    // HEADERS comes out as one frame with END_HEADERS.
    let h = &out[33..];
    let len = (usize::from(h[1]) << 8) | usize::from(h[2]);
    assert_eq!((h[3], h[4]), (HEADERS, END_HEADERS));
    let decoded = loona_hpack::Decoder::new().decode(&h[9..9 + len]).unwrap();
    assert_eq!(authority_of(&decoded), "localhost");
    assert_eq!(h[9 + len..], frame(0x0, 0x1, 1, &[0, 0, 0, 0, 2, 8, 1])[..]);
}

#[tokio::test]
async fn pump_rejects_framing_violations() {
    let block = [0x82u8];
    let cases: Vec<Vec<u8>> = vec![
        // CONTINUATION without HEADERS.
        frame(CONTINUATION, END_HEADERS, 1, &block),
        // DATA in the middle of a header block.
        [frame(HEADERS, 0, 1, &block), frame(0x0, 0, 1, &[])].concat(),
        // CONTINUATION for another stream.
        [
            frame(HEADERS, 0, 1, &block),
            frame(CONTINUATION, END_HEADERS, 3, &block),
        ]
        .concat(),
        // Connection ends inside a header block.
        frame(HEADERS, 0, 1, &block),
        // Truncated frame.
        frame(0x0, 0, 1, &[1, 2, 3])[..10].to_vec(),
        // Header block over the limit.
        frame(HEADERS, 0, 1, &vec![0u8; MAX_BLOCK + 1]),
    ];
    for (i, c) in cases.into_iter().enumerate() {
        let (r, _) = pump([PREFACE.to_vec(), c].concat()).await;
        assert!(matches!(r, Err(ProxyError::Protocol(_))), "case {i}: {r:?}");
    }
}

#[tokio::test]
async fn pump_passes_non_http2_input_through() {
    let (r, out) = pump(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nand more".to_vec()).await;
    r.unwrap();
    assert_eq!(out, b"GET / HTTP/1.1\r\nHost: x\r\n\r\nand more");
    let (r, out) = pump(Vec::new()).await;
    r.unwrap();
    assert!(out.is_empty());
}
