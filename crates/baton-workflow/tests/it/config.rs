//! Building workflows: every configuration rule is a typed error, and the
//! program identity follows every configuration field.

use crate::common::{Op, child};
use baton_run::Budget;
use baton_run::program::Definition;
use baton_workflow::{
    Child, Config, ConfigError, MAX_ID_LEN, Stage, Workflow, call, fork, loop_until, map, switch,
    transform,
};

fn build(stages: Vec<Stage>) -> Result<Workflow, ConfigError> {
    Workflow::new(Config {
        name: "test.workflow".into(),
        description: "A workflow under test.".into(),
        build: "config-tests 1".into(),
        stages,
    })
}

fn identity() -> Stage {
    transform("same", |n: u64| Ok(n))
}

#[test]
fn mismatched_adjacent_schemas_are_rejected() {
    let error = build(vec![
        transform("measure", |text: String| Ok(text.len() as u64)),
        transform("shout", |text: String| Ok(text.to_uppercase())),
    ])
    .expect_err("rejected");
    assert_eq!(
        error,
        ConfigError::SchemaMismatch {
            from: "measure".into(),
            to: "shout".into()
        }
    );
    let add = child(Op::Add(1));
    let error = build(vec![
        transform("show", |n: u64| Ok(n.to_string())),
        call("add", Child::new(&add)),
    ])
    .expect_err("rejected");
    assert!(
        matches!(error, ConfigError::SchemaMismatch { .. }),
        "{error}"
    );
}

#[test]
fn stage_ids_must_be_valid_and_unique() {
    for bad in [
        "",
        "Review",
        "1st",
        "a.b",
        "a b",
        "ü",
        &"x".repeat(MAX_ID_LEN + 1),
    ] {
        let error = build(vec![transform(bad, |n: u64| Ok(n))]).expect_err("rejected");
        assert_eq!(error, ConfigError::StageId { id: bad.to_owned() });
    }
    assert!(build(vec![transform(&"x".repeat(MAX_ID_LEN), |n: u64| Ok(n))]).is_ok());
    assert!(build(vec![transform("a-b_2", |n: u64| Ok(n))]).is_ok());
    let error = build(vec![identity(), identity()]).expect_err("rejected");
    assert_eq!(error, ConfigError::DuplicateStage { id: "same".into() });
}

#[test]
fn empty_lists_zero_windows_and_zero_limits_are_rejected() {
    assert_eq!(
        build(Vec::new()).expect_err("rejected"),
        ConfigError::NoStages
    );
    let add = child(Op::Add(1));
    let reduce = |outputs: Vec<u64>| Ok(outputs.len() as u64);
    let zero_window = fork::<u64, u64, u64, _>("fan", vec![Child::new(&add)], 0, reduce);
    assert_eq!(
        build(vec![zero_window]).expect_err("rejected"),
        ConfigError::ZeroWindow {
            stage: "fan".into()
        }
    );
    let wide = fork::<u64, u64, u64, _>("fan", vec![Child::new(&add)], 2, reduce);
    assert_eq!(
        build(vec![wide]).expect_err("rejected"),
        ConfigError::WindowTooLarge {
            stage: "fan".into(),
            window_size: 2,
            branches: 1
        }
    );
    let none = fork::<u64, u64, u64, _>("fan", Vec::new(), 1, reduce);
    assert_eq!(
        build(vec![none]).expect_err("rejected"),
        ConfigError::NoBranches {
            stage: "fan".into()
        }
    );
    assert_eq!(
        build(vec![map::<u64, u64>("each", Child::new(&add), 0, 5)]).expect_err("rejected"),
        ConfigError::ZeroWindow {
            stage: "each".into()
        }
    );
    assert_eq!(
        build(vec![map::<u64, u64>("each", Child::new(&add), 1, 0)]).expect_err("rejected"),
        ConfigError::ZeroMaxItems {
            stage: "each".into()
        }
    );
    assert_eq!(
        build(vec![loop_until("grow", Child::new(&add), 0, |_: &u64| Ok(
            true
        ))])
        .expect_err("rejected"),
        ConfigError::ZeroIterations {
            stage: "grow".into()
        }
    );
    let select = |_: u64| Ok("a");
    assert_eq!(
        build(vec![switch("route", select, Vec::new())]).expect_err("rejected"),
        ConfigError::NoCases {
            stage: "route".into()
        }
    );
    assert_eq!(
        build(vec![switch(
            "route",
            select,
            vec![("a", Child::new(&add)), ("a", Child::new(&add))]
        )])
        .expect_err("rejected"),
        ConfigError::DuplicateCase {
            stage: "route".into(),
            case: "a".into()
        }
    );
    assert_eq!(
        build(vec![switch("route", select, vec![("A", Child::new(&add))])]).expect_err("rejected"),
        ConfigError::CaseId {
            stage: "route".into(),
            case: "A".into()
        }
    );
}

#[test]
fn typed_stages_check_their_children_schemas() {
    let add = child(Op::Add(1));
    let error =
        build(vec![map::<String, u64>("each", Child::new(&add), 1, 5)]).expect_err("rejected");
    assert_eq!(
        error,
        ConfigError::ChildSchema {
            stage: "each".into(),
            child: "test.add".into(),
            side: "input"
        }
    );
    let error = build(vec![loop_until("grow", Child::new(&add), 2, |_: &i8| {
        Ok(true)
    })])
    .expect_err("rejected");
    assert!(matches!(error, ConfigError::ChildSchema { .. }), "{error}");
}

#[test]
fn names_descriptions_and_builds_are_checked() {
    let with = |name: &str, build: &str| {
        Workflow::new(Config {
            name: name.into(),
            description: "x".into(),
            build: build.into(),
            stages: vec![identity()],
        })
    };
    assert!(matches!(
        with("Bad Name", "b").expect_err("rejected"),
        ConfigError::Descriptor(_)
    ));
    assert_eq!(with("a.b", " ").expect_err("rejected"), ConfigError::Build);
}

#[test]
fn the_program_identity_follows_every_configuration_field() {
    let add = child(Op::Add(1));
    let other = child(Op::Add(2));
    let digest = |build: &str, stages: Vec<Stage>| {
        Workflow::new(Config {
            name: "test.workflow".into(),
            description: "A workflow under test.".into(),
            build: build.into(),
            stages,
        })
        .expect("valid")
        .program::<u64, Vec<u64>>()
        .reference()
        .clone()
    };
    let each =
        |window: u32, max_items: u32, child: &baton_run::Program<u64, u64>, budget: Budget| {
            vec![map::<u64, u64>(
                "each",
                Child::new(child).with_budget(budget),
                window,
                max_items,
            )]
        };
    let base = digest("b1", each(1, 5, &add, Budget::unlimited()));
    assert_eq!(base, digest("b1", each(1, 5, &add, Budget::unlimited())));
    assert_ne!(
        base.implementation,
        digest("b2", each(1, 5, &add, Budget::unlimited())).implementation
    );
    for changed in [
        each(2, 5, &add, Budget::unlimited()),
        each(1, 6, &add, Budget::unlimited()),
        each(1, 5, &other, Budget::unlimited()),
        each(1, 5, &add, Budget::unlimited().with_steps(3)),
    ] {
        let reference = digest("b1", changed);
        assert_eq!(reference.implementation, base.implementation);
        assert_ne!(reference.configuration, base.configuration);
        assert_ne!(reference.digest, base.digest);
    }
    let workflow = build(vec![
        call("add", Child::new(&add)),
        call("again", Child::new(&add)),
    ])
    .expect("valid");
    assert_eq!(workflow.children().len(), 1, "children are declared once");
}
