use std::fmt::Write as _;

use super::*;

const CLAIM: &str = "\
# leading comment
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: t
spec:
  spec:
    devices:
      requests:
      - name: a
        exactly:
          deviceClassName: gpu.nvidia.com
      - name: b
        exactly:
          deviceClassName: mig.nvidia.com
          selectors:
          - cel:
              expression: \"device.attributes['gpu.nvidia.com'].profile == '1g.10gb'\"
          - cel: {expression: 'true'}
      constraints:
      - requests: [a, b]
        matchAttribute: gpu.nvidia.com/parentUUID
";

fn one(text: &str) -> Document {
    let mut parsed = parse("f.yaml", text);
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    assert_eq!(parsed.documents.len(), 1);
    parsed.documents.remove(0)
}

#[test]
fn documents_are_split_on_markers_and_numbered() {
    let text = "# c\n---\na: 1\n---\n---\n# only a comment\n---\nb: 2\n...\nc: 3\n--- {d: 4}\n";
    let parsed = parse("f.yaml", text);
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    let docs: Vec<(usize, usize, Value)> = parsed
        .documents
        .iter()
        .map(|d| (d.index, d.line, d.value.clone()))
        .collect();
    assert_eq!(
        docs,
        vec![
            (1, 3, serde_json::json!({"a": 1})),
            (2, 8, serde_json::json!({"b": 2})),
            (3, 10, serde_json::json!({"c": 3})),
            (4, 11, serde_json::json!({"d": 4})),
        ]
    );
}

#[test]
fn a_file_without_markers_is_one_document() {
    let doc = one("a: 1\nb:\n  c: 2\n");
    assert_eq!(doc.value, serde_json::json!({"a": 1, "b": {"c": 2}}));
    assert_eq!((doc.index, doc.line), (1, 1));
}

#[test]
fn directives_stay_with_their_document() {
    let doc = one("%YAML 1.2\n---\na: 1\n");
    assert_eq!(doc.value, serde_json::json!({"a": 1}));
    assert_eq!(doc.line, 3);
}

#[test]
fn yaml_errors_carry_file_lines() {
    let text = "a: 1\n---\nb: 2\nc: [1, 2\nd: 3\n---\ne: 5\n";
    let parsed = parse("f.yaml", text);
    assert_eq!(parsed.documents.len(), 2, "the good documents survive");
    assert_eq!(parsed.errors.len(), 1);
    let e = &parsed.errors[0];
    assert_eq!(e.index, 2);
    assert!((4..=6).contains(&e.line), "{e:?}");
    // Positions in the message are file positions too.
    assert!(e.message.contains(&format!("line {}", e.line)), "{e:?}");
    assert!(e.to_string().starts_with(&format!("f.yaml:{}:", e.line)));
    assert_eq!(parsed.documents[1].index, 3);
}

#[test]
fn non_string_keys_and_tabs_are_errors_not_panics() {
    for text in [
        "{[1]: 2}\n",
        "a:\n\t- b\n",
        "&a [*a]\n",
        "key: \"unterminated\n",
        "@x\n",
    ] {
        let parsed = parse("f.yaml", text);
        assert_eq!(parsed.errors.len(), 1, "{text:?}: {:?}", parsed.documents);
    }
}

#[test]
fn anchors_cannot_blow_up() {
    let mut text = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
    for (i, prev) in ["a", "b", "c", "d", "e", "f", "g", "h", "i"]
        .iter()
        .enumerate()
    {
        let name = (b'b' + u8::try_from(i).unwrap()) as char;
        let refs = vec![format!("*{prev}"); 10].join(", ");
        writeln!(text, "{name}: &{name} [{refs}]").unwrap();
    }
    let parsed = parse("f.yaml", &text);
    assert_eq!(parsed.errors.len(), 1);
    // Refused by the node budget, at the first 100,000-odd nodes.
    assert!(
        parsed.errors[0]
            .message
            .contains("expands to more than 100920 nodes"),
        "{:?}",
        parsed.errors
    );
}

#[test]
fn deep_nesting_is_refused_where_it_crosses_the_limit() {
    for (opener, per) in [("[", 1), ("{", 1), ("- ", 2)] {
        // n, 2n, 4n, ... levels: the error is at the same place each time,
        // the 129th level, so what was read does not grow with the input.
        for n in [20_000, 40_000, 80_000, 100_000, 200_000] {
            let text = format!("a: 1\n---\n# deep\n{}x\n", opener.repeat(n));
            let parsed = parse("f.yaml", &text);
            assert_eq!(parsed.documents.len(), 1, "{opener} {n}");
            let e = &parsed.errors[0];
            assert_eq!(
                (e.index, e.line, e.column),
                (2, 4, Some(128 * per + 1)),
                "{opener} {n}: {e}"
            );
            assert_eq!(
                e.to_string(),
                format!(
                    "f.yaml:4:{c}: invalid YAML: collections nested deeper than 128 levels \
                     at line 4 column {c}",
                    c = 128 * per + 1
                )
            );
        }
    }
    // 128 levels is fine.
    let text = format!(
        "---\nkind: X\napiVersion: v1\nspec: {}{}\n",
        "[".repeat(127),
        "]".repeat(127)
    );
    let parsed = parse("f.yaml", &text);
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
}

#[test]
fn files_over_the_size_limit_are_refused_before_parsing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.yaml");
    let limit = usize::try_from(MAX_FILE_BYTES).unwrap();
    let mut text = "#".repeat(limit - 1);
    text.push('\n');
    std::fs::write(&path, &text).unwrap();
    assert_eq!(read_file(&path).unwrap().len(), limit);
    text.push('\n');
    std::fs::write(&path, &text).unwrap();
    let err = read_file(&path).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "{}: file is 16777217 bytes, more than the 16777216 bytes a manifest may have",
            path.display()
        )
    );
}

#[test]
fn lists_expand_into_items_with_their_lines() {
    let text = "apiVersion: v1\nkind: List\nitems:\n- kind: A\n  metadata: {name: a}\n- kind: B\n  metadata:\n    name: b\n";
    let parsed = parse("f.yaml", text);
    let docs: Vec<(Option<usize>, usize, &str, &str)> = parsed
        .documents
        .iter()
        .map(|d| (d.item, d.line, d.kind(), d.name()))
        .collect();
    assert_eq!(docs, vec![(Some(0), 4, "A", "a"), (Some(1), 6, "B", "b")]);
    assert_eq!(parsed.documents[1].locate("metadata.name"), 8);
    assert_eq!(
        parsed.documents[1].position(),
        "f.yaml:6 (document 1, items[1])"
    );
}

#[test]
fn a_list_without_items_is_an_error() {
    let parsed = parse("f.yaml", "apiVersion: v1\nkind: List\n");
    assert!(parsed.documents.is_empty());
    assert!(
        parsed.errors[0].message.contains("items"),
        "{:?}",
        parsed.errors
    );
}

#[test]
fn a_named_object_whose_kind_ends_in_list_is_not_expanded() {
    let doc = one("kind: PodList\nmetadata: {name: x}\nitems: []\n");
    assert_eq!(doc.kind(), "PodList");
}

#[test]
fn paths_locate_block_yaml_lines() {
    let doc = one(CLAIM);
    assert_eq!(doc.line, 3);
    assert_eq!(doc.locate("kind"), 4);
    assert_eq!(doc.locate("metadata.name"), 6);
    assert_eq!(doc.locate("spec.spec.devices.requests[0]"), 11);
    assert_eq!(doc.locate("spec.spec.devices.requests[0].name"), 11);
    assert_eq!(
        doc.locate("spec.spec.devices.requests[0].exactly.deviceClassName"),
        13
    );
    assert_eq!(
        doc.locate("spec.spec.devices.requests[1].exactly.selectors[0].cel.expression"),
        19
    );
    // Inside a flow mapping: the line of the mapping.
    assert_eq!(
        doc.locate("spec.spec.devices.requests[1].exactly.selectors[1].cel.expression"),
        20
    );
    assert_eq!(
        doc.locate("spec.spec.devices.constraints[0].matchAttribute"),
        23
    );
    assert_eq!(
        doc.locate("spec.spec.devices.constraints[0].requests[1]"),
        22
    );
}

#[test]
fn unknown_paths_fall_back_to_the_deepest_match() {
    let doc = one(CLAIM);
    assert_eq!(doc.locate("spec.spec.devices.requests[7]"), 10);
    assert_eq!(doc.locate("spec.nothing"), 7);
    assert_eq!(doc.locate("nothing"), 3);
    assert_eq!(doc.locate(""), 3);
    assert_eq!(doc.locate("[[[..."), 3);
}

#[test]
fn quoted_and_dotted_keys_are_found() {
    let text = "spec:\n  attributes:\n    \"gpu.nvidia.com/x\":\n      int: 1\n    'y': 2\n";
    let doc = one(text);
    assert_eq!(doc.locate("spec.attributes[\"gpu.nvidia.com/x\"].int"), 4);
    assert_eq!(doc.locate("spec.attributes['y']"), 5);
}

#[test]
fn files_are_collected_recursively_in_name_order() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("b/c")).unwrap();
    for f in ["z.yaml", "a.yml", "notes.txt", "b/x.yaml", "b/c/y.yaml"] {
        std::fs::write(root.join(f), "a: 1\n").unwrap();
    }
    let files = collect_files(&[root.to_owned()]).unwrap();
    let names: Vec<String> = files
        .iter()
        .map(|f| f.strip_prefix(root).unwrap().display().to_string())
        .collect();
    assert_eq!(names, ["a.yml", "b/c/y.yaml", "b/x.yaml", "z.yaml"]);
    // A file named explicitly is taken whatever its extension.
    let files = collect_files(&[root.join("notes.txt")]).unwrap();
    assert_eq!(files.len(), 1);
}

#[test]
fn missing_paths_and_empty_directories_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let err = collect_files(&[dir.path().join("nope.yaml")]).unwrap_err();
    assert!(format!("{err:#}").contains("nope.yaml"), "{err:#}");
    let err = collect_files(&[dir.path().to_owned()]).unwrap_err();
    assert!(format!("{err:#}").contains("no *.yaml"), "{err:#}");
}

#[test]
fn binary_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.yaml");
    std::fs::write(&path, [b'a', b':', b' ', 0xff, 0xfe, b'\n']).unwrap();
    let err = read_file(&path).unwrap_err().to_string();
    assert!(
        err.contains("not UTF-8") && err.contains("offset 3"),
        "{err}"
    );
}

#[test]
fn line_shifting_only_touches_positions() {
    assert_eq!(
        shift_lines(
            "did not find key at line 2 column 3, while parsing at line 1 column 1",
            10,
            usize::MAX
        ),
        "did not find key at line 12 column 3, while parsing at line 11 column 1"
    );
    assert_eq!(
        shift_lines("at line 9 column 1", 10, 12),
        "at line 12 column 1",
        "held to the last line"
    );
    assert_eq!(
        shift_lines("the line 5 is fine", 10, usize::MAX),
        "the line 5 is fine"
    );
    assert_eq!(
        shift_lines("ends with line ", 3, usize::MAX),
        "ends with line "
    );
}

#[test]
fn an_error_at_the_end_of_a_file_without_a_final_break_is_on_its_last_line() {
    // Found by the manifest fuzz target (corpus file
    // crash-eof-error-line-past-end): the reader put it one line past.
    for text in [
        "a: 1\nb: [1, 2",
        "a: 1\nb: [1, 2\n",
        "x: 0\n---\na: 1\nb: [1, 2",
    ] {
        let parsed = parse("f.yaml", text);
        assert_eq!(parsed.errors.len(), 1, "{text:?}");
        let e = &parsed.errors[0];
        let last = text.trim_end().lines().count();
        assert_eq!(e.line, last, "{text:?}: {e:?}");
        assert!(
            e.message.contains(&format!("line {last} column")),
            "{text:?}: {e:?}"
        );
    }
}
