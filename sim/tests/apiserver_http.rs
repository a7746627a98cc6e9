//! Raw HTTP tests of the test API server: malformed, oversized, truncated and hostile requests,
//! unknown paths and methods, YAML apply bodies, and shutdown with open watches. Every bad request
//! must get a precise Status answer (never a panic or a hang), store nothing, and leave the server
//! serving.

use std::net::SocketAddr;
use std::time::Duration;

use gpu_dra_sim::apiserver::{DeleteOptions, Resource, Selectors, ServerOptions, TestApiServer};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A parsed HTTP response.
#[derive(Debug)]
struct Reply {
    code: u16,
    headers: String,
    body: Vec<u8>,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// Asserts a `metav1.Status` failure with this code and reason; returns its message.
    fn status(&self, code: u16, reason: &str) -> String {
        assert_eq!(self.code, code, "{self:?}");
        let status = self.json();
        assert_eq!(status["kind"], "Status", "{status}");
        assert_eq!(status["apiVersion"], "v1");
        assert_eq!(status["status"], "Failure");
        assert_eq!(status["code"], code);
        assert_eq!(status["reason"], reason, "{status}");
        let message = status["message"].as_str().unwrap_or("").to_owned();
        assert!(!message.is_empty());
        message
    }
}

fn decode_chunked(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(line_end) = data.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size =
            usize::from_str_radix(std::str::from_utf8(&data[..line_end]).unwrap().trim(), 16)
                .unwrap();
        data = &data[line_end + 2..];
        if size == 0 || data.len() < size {
            return out;
        }
        out.extend_from_slice(&data[..size]);
        data = &data[(size + 2).min(data.len())..];
    }
}

/// Sends raw request bytes (the request should say `Connection: close`) and reads the reply.
/// Write errors are ignored: the server may answer before reading a whole oversized body.
async fn raw(addr: SocketAddr, request: &[u8]) -> Reply {
    tokio::time::timeout(Duration::from_secs(10), async {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let _ = stream.write_all(request).await;
        let mut data = Vec::new();
        let _ = stream.read_to_end(&mut data).await;
        parse_reply(&data)
    })
    .await
    .expect("the server answers within 10 s")
}

fn parse_reply(data: &[u8]) -> Reply {
    let split = data
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP response: {:?}", String::from_utf8_lossy(data)));
    let headers = String::from_utf8_lossy(&data[..split]).to_string();
    let code = headers
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap();
    let mut body = data[split + 4..].to_vec();
    if headers
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = decode_chunked(&body);
    }
    Reply {
        code,
        headers,
        body,
    }
}

fn request(method: &str, path: &str, content_type: &str, body: &[u8]) -> Vec<u8> {
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    req
}

async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> Reply {
    raw(addr, &request(method, path, content_type, body)).await
}

async fn start(opts: ServerOptions) -> TestApiServer {
    TestApiServer::start(opts).await.unwrap()
}

const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

async fn assert_still_serving(server: &TestApiServer) {
    let reply = send(server.addr(), "GET", "/version", "application/json", b"").await;
    assert_eq!(reply.code, 200);
    assert_eq!(reply.json()["major"], "1");
    let reply = send(server.addr(), "GET", "/healthz", "text/plain", b"").await;
    assert_eq!((reply.code, reply.body.as_slice()), (200, b"ok".as_slice()));
}

fn stored(server: &TestApiServer, resource: Resource) -> usize {
    server
        .store()
        .list(resource, None, &Selectors::default())
        .0
        .len()
}

#[tokio::test]
async fn malformed_bodies_are_bad_requests() {
    let server = start(ServerOptions::default()).await;
    let deep = format!("{}{}", "[".repeat(300), "]".repeat(300));
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("truncated JSON", b"{\"apiVersion\": \"resource.k8s.io/v1\", \"kind\":".to_vec()),
        ("empty body", Vec::new()),
        ("an array", b"[]".to_vec()),
        ("a string", b"\"slice\"".to_vec()),
        ("not UTF-8", vec![0xff, 0xfe, 0x00, 0x7b]),
        ("deep nesting", deep.into_bytes()),
        ("no kind", br#"{"apiVersion":"resource.k8s.io/v1","metadata":{"name":"x"}}"#.to_vec()),
        (
            "wrong kind",
            br#"{"apiVersion":"resource.k8s.io/v1","kind":"DeviceClass","metadata":{"name":"x"}}"#.to_vec(),
        ),
        (
            "wrong type of devices",
            br#"{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice","metadata":{"name":"x"},
                "spec":{"driver":"d","pool":{"name":"p","resourceSliceCount":1},"nodeName":"n","devices":"gpu-0"}}"#
                .to_vec(),
        ),
        (
            "bad quantity",
            br#"{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice","metadata":{"name":"x"},
                "spec":{"driver":"d","pool":{"name":"p","resourceSliceCount":1},"nodeName":"n",
                "devices":[{"name":"g","capacity":{"memory":{"value":"80 gigs"}}}]}}"#
                .to_vec(),
        ),
    ];
    for (what, body) in cases {
        let reply = send(server.addr(), "POST", SLICES, "application/json", &body).await;
        let message = reply.status(400, "BadRequest");
        assert!(!message.contains("panicked"), "{what}: {message}");
    }
    let reply = send(
        server.addr(),
        "POST",
        SLICES,
        "application/json",
        br#"{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice","metadata":{"name":"x"},"spec":{"devices":"gpu-0"}}"#,
    )
    .await;
    assert!(reply.status(400, "BadRequest").contains("spec.devices"));
    assert_eq!(stored(&server, Resource::ResourceSlices), 0);
    assert_still_serving(&server).await;
}

#[tokio::test]
async fn oversized_bodies_are_rejected_without_reading_them() {
    let server = start(ServerOptions {
        max_body_bytes: 64 * 1024,
        ..ServerOptions::default()
    })
    .await;
    // A declared length over the limit is answered before any body byte is sent.
    let head = format!(
        "POST {SLICES} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        10 * 1024 * 1024
    );
    let reply = raw(server.addr(), head.as_bytes()).await;
    assert_eq!(
        reply.status(413, "RequestEntityTooLarge"),
        "Request entity too large: limit is 65536"
    );

    // A chunked body without a length is cut off at the limit.
    let mut chunked = format!(
        "POST {SLICES} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    .into_bytes();
    let chunk = vec![b' '; 16 * 1024];
    for _ in 0..8 {
        chunked.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        chunked.extend_from_slice(&chunk);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let reply = raw(server.addr(), &chunked).await;
    reply.status(413, "RequestEntityTooLarge");

    // Same for updates and patches.
    let big = vec![b' '; 65 * 1024];
    let reply = send(
        server.addr(),
        "PUT",
        &format!("{SLICES}/x"),
        "application/json",
        &big,
    )
    .await;
    reply.status(413, "RequestEntityTooLarge");
    let reply = send(
        server.addr(),
        "PATCH",
        &format!("{SLICES}/x"),
        "application/merge-patch+json",
        &big,
    )
    .await;
    reply.status(413, "RequestEntityTooLarge");
    assert_still_serving(&server).await;
}

#[tokio::test]
async fn the_default_limit_is_3_mib() {
    let server = start(ServerOptions::default()).await;
    let body = vec![b' '; 3 * 1024 * 1024 + 1];
    let reply = send(server.addr(), "POST", SLICES, "application/json", &body).await;
    assert_eq!(
        reply.status(413, "RequestEntityTooLarge"),
        "Request entity too large: limit is 3145728"
    );
}

#[tokio::test]
async fn truncated_bodies_do_not_hang_the_server() {
    let server = start(ServerOptions::default()).await;
    let mut stream = TcpStream::connect(server.addr()).await.unwrap();
    let head = format!(
        "POST {SLICES} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"api"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.shutdown().await.unwrap();
    let mut data = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut data))
        .await
        .expect("the server closes the connection")
        .unwrap();
    if !data.is_empty() {
        parse_reply(&data).status(400, "BadRequest");
    }
    assert_eq!(stored(&server, Resource::ResourceSlices), 0);
    assert_still_serving(&server).await;
}

#[tokio::test]
async fn unknown_paths_methods_and_media_types() {
    let server = start(ServerOptions::default()).await;
    let addr = server.addr();
    for path in [
        "/apis/apps/v1/deployments",
        "/apis/resource.k8s.io/v1beta1/resourceslices",
        "/apis/resource.k8s.io/v1/resourceslices/a/status",
        "/apis/resource.k8s.io/v1/resourceclaims/c",
        "/api/v1/pods",
        "/metrics",
    ] {
        let message = send(addr, "GET", path, "application/json", b"")
            .await
            .status(404, "NotFound");
        assert_eq!(
            message, "the server could not find the requested resource",
            "{path}"
        );
    }
    send(addr, "POST", "/version", "application/json", b"{}")
        .await
        .status(405, "MethodNotAllowed");
    send(addr, "PUT", SLICES, "application/json", b"{}")
        .await
        .status(405, "MethodNotAllowed");
    send(
        addr,
        "POST",
        "/apis/resource.k8s.io/v1/resourceclaims",
        "application/json",
        b"{}",
    )
    .await
    .status(405, "MethodNotAllowed");
    send(
        addr,
        "DELETE",
        "/apis/resource.k8s.io/v1/namespaces/d/resourceclaims/c/status",
        "application/json",
        b"",
    )
    .await
    .status(405, "MethodNotAllowed");
    let message = send(addr, "PATCH", &format!("{SLICES}/x"), "text/plain", b"{}")
        .await
        .status(415, "UnsupportedMediaType");
    assert!(
        message.contains("application/merge-patch+json"),
        "{message}"
    );
    assert_still_serving(&server).await;
}

#[tokio::test]
async fn bad_query_parameters() {
    let server = start(ServerOptions::default()).await;
    let addr = server.addr();
    for (query, reason) in [
        ("watch=maybe", "BadRequest"),
        ("limit=ten", "BadRequest"),
        ("labelSelector=a%20in%20(b", "BadRequest"),
        ("fieldSelector=spec.devices=x", "BadRequest"),
        ("fieldSelector=spec.nodeName", "BadRequest"),
        ("continue=not-a-token", "BadRequest"),
        ("watch=true&timeoutSeconds=-1", "BadRequest"),
    ] {
        let reply = send(
            addr,
            "GET",
            &format!("{SLICES}?{query}"),
            "application/json",
            b"",
        )
        .await;
        reply.status(400, reason);
    }
    // A watch at an unparsable resourceVersion fails in the real server's storage layer: a
    // 500 without reason (compared with the real one in tests/real_cluster/apiserver.rs).
    let reply = send(
        addr,
        "GET",
        &format!("{SLICES}?watch=true&resourceVersion=abc"),
        "application/json",
        b"",
    )
    .await;
    assert_eq!(reply.code, 500);
    let body = reply.json();
    assert!(body.get("reason").is_none(), "{body}");
    assert_eq!(
        body["message"],
        "resourceVersion: Invalid value: \"abc\": strconv.ParseUint: parsing \"abc\": invalid syntax"
    );
    let reply = send(
        addr,
        "GET",
        &format!("{SLICES}?watch=true&sendInitialEvents=true&allowWatchBookmarks=true"),
        "application/json",
        b"",
    )
    .await;
    assert!(
        reply
            .status(422, "Invalid")
            .contains("resourceVersionMatch")
    );
    let reply = send(
        addr,
        "POST",
        "/api/v1/nodes?dryRun=Some",
        "application/json",
        br#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n"}}"#,
    )
    .await;
    reply.status(400, "BadRequest");
    assert_eq!(stored(&server, Resource::Nodes), 0);
    let reply = send(
        addr,
        "POST",
        "/api/v1/nodes?dryRun=All",
        "application/json",
        br#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n"}}"#,
    )
    .await;
    assert_eq!(reply.code, 201);
    assert_eq!(
        stored(&server, Resource::Nodes),
        0,
        "dry runs store nothing"
    );
}

#[tokio::test]
async fn yaml_apply_bodies() {
    let server = start(ServerOptions::default()).await;
    let addr = server.addr();
    let yaml = b"apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata:
  name: yaml-slice
spec:
  driver: gpu.nvidia.com
  pool:
    name: node-a
    generation: 0
    resourceSliceCount: 1
  nodeName: node-a
  devices:
  - name: gpu-0
    attributes:
      type:
        string: gpu
      driverVersion:
        version: 550.54.15
";
    let path = format!("{SLICES}/yaml-slice?fieldManager=yaml-test");
    let created = send(addr, "PATCH", &path, "application/apply-patch+yaml", yaml).await;
    assert_eq!(
        created.code,
        201,
        "{:?}",
        String::from_utf8_lossy(&created.body)
    );
    let obj = created.json();
    assert_eq!(
        obj["spec"]["devices"][0]["attributes"]["driverVersion"]["version"],
        "550.54.15"
    );
    assert!(
        created
            .headers
            .to_ascii_lowercase()
            .contains("content-type: application/json")
    );
    let again = send(addr, "PATCH", &path, "application/apply-patch+yaml", yaml).await;
    assert_eq!(again.code, 200);
    assert_eq!(
        again.json()["metadata"]["resourceVersion"],
        obj["metadata"]["resourceVersion"]
    );

    // Apply needs a field manager.
    let reply = send(
        addr,
        "PATCH",
        &format!("{SLICES}/yaml-slice"),
        "application/apply-patch+yaml",
        yaml,
    )
    .await;
    assert!(reply.status(422, "Invalid").contains("fieldManager"));

    // Hostile and malformed YAML.
    let laughs = b"a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
";
    let deep = format!("{}x{}", "[".repeat(1000), "]".repeat(1000));
    for body in [
        laughs.as_slice(),
        b"kind: [unclosed",
        b"just a string",
        b"- a\n- b\n",
        deep.as_bytes(),
        b"\t\x00",
    ] {
        let path = format!("{SLICES}/hostile?fieldManager=m");
        let reply = send(addr, "PATCH", &path, "application/apply-patch+yaml", body).await;
        reply.status(400, "BadRequest");
    }
    assert_eq!(stored(&server, Resource::ResourceSlices), 1);
    assert_still_serving(&server).await;
}

#[tokio::test]
async fn lists_and_watches_over_raw_http() {
    let server = start(ServerOptions {
        bookmark_interval: Duration::from_millis(50),
        ..ServerOptions::default()
    })
    .await;
    let addr = server.addr();
    let node = br#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"node-a"}}"#;
    let created = send(addr, "POST", "/api/v1/nodes", "application/json", node).await;
    assert_eq!(created.code, 201);
    let rv = created.json()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();

    let list = send(addr, "GET", "/api/v1/nodes", "application/json", b"")
        .await
        .json();
    assert_eq!(list["kind"], "NodeList");
    assert_eq!(list["apiVersion"], "v1");
    assert!(
        list["items"][0].get("kind").is_none(),
        "list items carry no kind, like the real server"
    );
    assert_eq!(list["metadata"]["resourceVersion"], rv);

    // A watch from the creation, with bookmarks, ending after three seconds
    // (the deletion comes after 0.2 s, which a loaded machine may delay).
    let store = server.store().clone();
    let writer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        store
            .delete(Resource::Nodes, None, "node-a", &DeleteOptions::default())
            .unwrap();
    });
    let path = format!(
        "/api/v1/nodes?watch=1&allowWatchBookmarks=true&timeoutSeconds=3&resourceVersion={rv}"
    );
    let reply = send(addr, "GET", &path, "application/json", b"").await;
    writer.await.unwrap();
    assert_eq!(reply.code, 200);
    let events: Vec<Value> = String::from_utf8(reply.body)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert!(types.contains(&"DELETED"), "{types:?}");
    assert!(types.contains(&"BOOKMARK"), "{types:?}");
    let deleted = events.iter().find(|e| e["type"] == "DELETED").unwrap();
    assert_eq!(deleted["object"]["kind"], "Node");
    let last_bookmark = events
        .iter()
        .rev()
        .find(|e| e["type"] == "BOOKMARK")
        .unwrap();
    let bookmark_rv: u64 = last_bookmark["object"]["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(bookmark_rv, server.store().resource_version());
}

#[tokio::test]
async fn shutdown_ends_open_watches() {
    let server = start(ServerOptions::default()).await;
    let mut stream = TcpStream::connect(server.addr()).await.unwrap();
    stream
        .write_all(format!("GET {SLICES}?watch=true HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    tokio::time::timeout(Duration::from_secs(10), server.shutdown())
        .await
        .expect("shutdown does not wait for the open watch")
        .unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut rest))
        .await
        .expect("the watch connection is closed")
        .unwrap();
}

#[tokio::test]
async fn status_bodies_match_the_real_shapes() {
    let server = start(ServerOptions::default()).await;
    let reply = send(
        server.addr(),
        "GET",
        &format!("{SLICES}/nope"),
        "application/json",
        b"",
    )
    .await;
    assert_eq!(
        reply.json(),
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "resourceslices.resource.k8s.io \"nope\" not found",
            "reason": "NotFound",
            "details": {"name": "nope", "group": "resource.k8s.io", "kind": "resourceslices"},
            "code": 404
        })
    );
    let invalid = br#"{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice","metadata":{"name":"s"},
        "spec":{"driver":"gpu.nvidia.com","pool":{"name":"node-a","resourceSliceCount":1},"nodeName":"node-a",
        "devices":[{"name":"gpu-0","attributes":{"productName":{"string":"0123456789012345678901234567890123456789012345678901234567890123456789"}}}]}}"#;
    let reply = send(server.addr(), "POST", SLICES, "application/json", invalid).await;
    assert_eq!(
        reply.json(),
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "ResourceSlice.resource.k8s.io \"s\" is invalid: spec.devices[0].attributes[productName].string: Too long: may not be more than 64 bytes",
            "reason": "Invalid",
            "details": {
                "name": "s", "group": "resource.k8s.io", "kind": "ResourceSlice",
                "causes": [{
                    "reason": "FieldValueTooLong",
                    "message": "Too long: may not be more than 64 bytes",
                    "field": "spec.devices[0].attributes[productName].string"
                }]
            },
            "code": 422
        })
    );
}
