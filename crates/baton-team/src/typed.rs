//! The schema of a [`Decision`](crate::Decision) as one team reads it: its
//! state, output and workers typed, so a model can be asked for exactly the
//! decisions this team accepts (and a provider's strict mode can express
//! it, where `Decision`'s own schema has untyped members).

use baton_run::program::Schema;
use baton_run::{ChildKey, Payload};
use serde_json::{Map, Value, json};

use crate::Binding;
use crate::wire::Mode;

/// The schema of a decision for a team whose state has the schema `state`,
/// whose output has the schema `output`, and whose workers are `workers`:
///
/// - `state` and `output` carry the team's schemas;
/// - each task request names one configured worker (`worker` is that
///   worker's name) and carries that worker's input;
/// - a control cancels a task (`cancel_reason`) or, when some worker
///   accepts unaddressed signals, sends it a signal its signal schema
///   accepts (steering an interaction); answering a worker's wait needs the
///   untyped [`Decision`](crate::Decision) schema, since a wait's answer
///   schema is known only when the wait opens.
///
/// Every value it accepts decodes as a `Decision`; the team still checks
/// the decision against its rules. Give it to a model-backed coordinator as
/// its response format (`baton_agent::output::format_for_schema`). An
/// output schema that accepts `null` cannot tell a `null` output from no
/// output where a provider writes absent members as `null` (strict mode),
/// so prefer an output type that does not.
pub fn decision_schema(state: &Schema, output: &Schema, workers: &[Binding]) -> Schema {
    let mut defs = Map::new();
    let mut place =
        |schema: &Schema, label: &str| embed(&schema.json().to_value(), label, &mut defs);
    let key = place(&Schema::of::<ChildKey>(), "TaskKey");
    let mode = place(&Schema::of::<Mode>(), "Mode");
    let state = place(state, "State");
    let output = place(output, "Output");
    let tasks: Vec<Value> = workers
        .iter()
        .enumerate()
        .map(|(index, worker)| {
            let descriptor = worker.program.descriptor();
            let input = place(descriptor.input_schema(), &format!("Worker{index}Input"));
            json!({
                "type": "object",
                "description": format!("Start a task of worker {}: {}", descriptor.name(), descriptor.description()),
                "properties": {
                    "key": key,
                    "worker": {"type": "string", "const": descriptor.name().as_str()},
                    "input": input,
                },
                "required": ["key", "worker", "input"],
                "additionalProperties": false,
            })
        })
        .collect();
    let signals: Vec<Value> = workers
        .iter()
        .enumerate()
        .filter(|(_, worker)| !worker.program.descriptor().signal_schema().rejects_all())
        .map(|(index, worker)| {
            place(
                worker.program.descriptor().signal_schema(),
                &format!("Worker{index}Signal"),
            )
        })
        .collect();
    let signal_id = place(&Schema::of::<baton_run::SignalId>(), "SignalId");
    let mut controls = vec![json!({
        "type": "object",
        "description": "Ask a running task to cancel.",
        "properties": {"task": key, "cancel_reason": {"type": "string"}},
        "required": ["task", "cancel_reason"],
        "additionalProperties": false,
    })];
    if !signals.is_empty() {
        controls.push(json!({
            "type": "object",
            "description": "Send a running task an unaddressed signal (steering).",
            "properties": {
                "task": key,
                "signal": {
                    "type": "object",
                    "properties": {"id": signal_id, "payload": {"anyOf": signals}},
                    "required": ["id", "payload"],
                    "additionalProperties": false,
                },
            },
            "required": ["task", "signal"],
            "additionalProperties": false,
        }));
    }
    let mut root = Map::new();
    root.insert(
        "$schema".into(),
        json!("https://json-schema.org/draft/2020-12/schema"),
    );
    root.insert("title".into(), json!("Decision"));
    root.insert("type".into(), json!("object"));
    root.insert(
        "description".into(),
        json!("The team's next step: the next state and new tasks and controls with a mode, or the team's output."),
    );
    root.insert(
        "properties".into(),
        json!({
            "mode": mode,
            "state": state,
            "tasks": {"type": "array", "items": {"anyOf": tasks}},
            "controls": {"type": "array", "items": {"anyOf": controls}},
            "output": output,
        }),
    );
    root.insert("required".into(), json!(["state"]));
    root.insert("additionalProperties".into(), json!(false));
    if !defs.is_empty() {
        root.insert("$defs".into(), Value::Object(defs));
    }
    let payload = Payload::from_value(&Value::Object(root)).expect("a schema of schemas encodes");
    Schema::new(payload).expect("a schema built of valid schemas compiles")
}

/// Embeds the schema document `doc` into a bigger one: its definitions move
/// to `defs` (under their own names when those are free or hold the same
/// definition, else prefixed with `label`), a root that refers to itself
/// becomes the definition `label`, and what is left is returned to be
/// placed where the schema is used.
fn embed(doc: &Value, label: &str, defs: &mut Map<String, Value>) -> Value {
    let Value::Object(doc) = doc else {
        return doc.clone();
    };
    let mut body = doc.clone();
    body.remove("$schema");
    let own = match body.remove("$defs") {
        Some(Value::Object(own)) => own,
        _ => Map::new(),
    };
    let clash = own
        .iter()
        .any(|(name, def)| defs.get(name).is_some_and(|known| known != def));
    let rename = |name: &str| {
        if clash {
            format!("{label}{name}")
        } else {
            name.to_owned()
        }
    };
    let recursive = refers(&Value::Object(body.clone()), "#");
    let root_name = format!("{label}Root");
    let rewrite = |value: &mut Value| {
        rewrite_refs(value, &|reference| {
            if reference == "#" {
                Some(format!("#/$defs/{root_name}"))
            } else {
                reference
                    .strip_prefix("#/$defs/")
                    .map(|name| format!("#/$defs/{}", rename(name)))
            }
        })
    };
    for (name, mut def) in own {
        rewrite(&mut def);
        defs.insert(rename(&name), def);
    }
    let mut body = Value::Object(body);
    rewrite(&mut body);
    if recursive {
        defs.insert(root_name.clone(), body);
        return json!({ "$ref": format!("#/$defs/{root_name}") });
    }
    body
}

/// Whether `value` holds a `$ref` equal to `reference`.
fn refers(value: &Value, reference: &str) -> bool {
    match value {
        Value::Object(map) => map.iter().any(|(key, member)| {
            (key == "$ref" && member.as_str() == Some(reference)) || refers(member, reference)
        }),
        Value::Array(items) => items.iter().any(|item| refers(item, reference)),
        _ => false,
    }
}

/// Rewrites every `$ref` for which `map` has a new target.
fn rewrite_refs(value: &mut Value, map: &dyn Fn(&str) -> Option<String>) {
    match value {
        Value::Object(members) => {
            for (key, member) in members.iter_mut() {
                if key == "$ref"
                    && let Some(target) = member.as_str().and_then(map)
                {
                    *member = Value::String(target);
                } else {
                    rewrite_refs(member, map);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| rewrite_refs(item, map)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use baton_run::program::{Definition, Descriptor, Execution, ExecutionState, ProgramConfig};
    use baton_run::program::{StepError, configuration_digest, implementation_digest};
    use baton_run::{Payload, Program};
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    use super::*;
    use crate::Decision;

    #[derive(Serialize, Deserialize, JsonSchema)]
    struct Notes {
        lines: Vec<String>,
        next: Option<Box<Notes>>,
    }

    struct Worker(Descriptor);

    impl Definition for Worker {
        fn descriptor(&self) -> &Descriptor {
            &self.0
        }
        fn start(&self, _: &Payload) -> Result<Box<dyn Execution>, StepError> {
            Err(StepError::other("unused"))
        }
        fn restore(&self, _: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
            Err(StepError::other("unused"))
        }
    }

    fn worker(name: &str) -> Binding {
        Binding::new(&Program::<Payload, Payload>::new(ProgramConfig {
            definition: std::sync::Arc::new(Worker(
                Descriptor::typed::<u32, String>(name, "a worker").expect("valid"),
            )),
            dispatcher: None,
            implementation: implementation_digest("typed-tests", "1"),
            configuration: configuration_digest(name).expect("encodes"),
        }))
    }

    #[test]
    fn a_typed_decision_schema_accepts_the_teams_decisions_and_refuses_others() {
        let schema = decision_schema(
            &Schema::of::<Notes>(),
            &Schema::of::<String>(),
            &[worker("test.count")],
        );
        let accepted = [
            r#"{"mode":"continue","state":{"lines":["a"],"next":{"lines":[],"next":null}},"tasks":[{"key":"t1","worker":"test.count","input":3}]}"#,
            r#"{"state":{"lines":[],"next":null},"output":"done"}"#,
            r#"{"mode":"wait","state":{"lines":[],"next":null},"controls":[{"task":"t1","cancel_reason":"enough"}]}"#,
        ];
        for text in accepted {
            let payload = Payload::parse_str(text).expect("json");
            schema
                .validate(&payload)
                .expect("the typed schema accepts it");
            payload.decode::<Decision>().expect("and it is a Decision");
        }
        let refused = [
            r#"{"mode":"continue","state":"not notes"}"#,
            r#"{"state":{"lines":[],"next":null},"output":7}"#,
            r#"{"mode":"continue","state":{"lines":[],"next":null},"tasks":[{"key":"t1","worker":"test.other","input":3}]}"#,
            r#"{"mode":"continue","state":{"lines":[],"next":null},"tasks":[{"key":"t1","worker":"test.count","input":"three"}]}"#,
        ];
        for text in refused {
            let payload = Payload::parse_str(text).expect("json");
            assert!(schema.validate(&payload).is_err(), "{text}");
        }
    }
}
