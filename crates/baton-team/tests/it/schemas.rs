//! The JSON Schemas of the wire types, compared with the checked-in files
//! under `tests/schemas/` so that a contract change is a visible diff.
//! Run with `BATON_BLESS=1` to rewrite the files after an intended change.

use std::path::PathBuf;

use baton_run::program::Schema;
use baton_team::{Control, ControlReceipt, Decision, Mode, Task, TaskRequest, Turn};

fn check(name: &str, schema: Schema) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/schemas")
        .join(format!("{name}.json"));
    let text = serde_json::to_string_pretty(&schema.json().to_value()).expect("encodes") + "\n";
    if std::env::var_os("BATON_BLESS").is_some() {
        std::fs::write(&path, &text).expect("writes");
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("{}: {error} (run with BATON_BLESS=1)", path.display()));
    assert_eq!(
        text, expected,
        "the schema of {name} changed (run with BATON_BLESS=1 if intended)"
    );
}

#[test]
fn wire_schemas_are_stable() {
    check("turn", Schema::of::<Turn>());
    check("decision", Schema::of::<Decision>());
    check("mode", Schema::of::<Mode>());
    check("task", Schema::of::<Task>());
    check("task_request", Schema::of::<TaskRequest>());
    check("control", Schema::of::<Control>());
    check("control_receipt", Schema::of::<ControlReceipt>());
}
