//! Keeps the user documentation of the published attributes in step with the
//! schema table: `docs/attributes.md` holds `schema::markdown_table()` between
//! two marker lines. Run with `UPDATE_DOCS=1` to rewrite the table.

use std::path::PathBuf;

const BEGIN: &str = "<!-- BEGIN GENERATED: gpu_dra_api::schema::markdown_table() -->";
const END: &str = "<!-- END GENERATED -->";

#[test]
fn attribute_docs_match_schema_table() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/attributes.md");
    let doc = std::fs::read_to_string(&path).expect("docs/attributes.md exists");
    let start = doc.find(BEGIN).expect("begin marker") + BEGIN.len();
    let end = doc.find(END).expect("end marker");
    let table = gpu_dra_api::schema::markdown_table();
    let current = doc[start..end].trim();
    if current != table.trim() {
        if std::env::var_os("UPDATE_DOCS").is_some() {
            let updated = format!("{}\n{}\n{}", &doc[..start], table.trim(), &doc[end..]);
            std::fs::write(&path, updated).expect("rewrite docs");
        } else {
            panic!(
                "docs/attributes.md is out of date with the schema table; \
                 run `UPDATE_DOCS=1 cargo test -p gpu-dra-api --test docs_attributes`"
            );
        }
    }
}
