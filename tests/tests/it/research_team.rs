//! The research team example offline: a model coordinator, a researcher
//! whose `search` tool calls an HTTP endpoint on 127.0.0.1 and whose
//! `write_note` tool writes a file, all on scripted models with a price.

use baton_examples::research_team as example;

#[tokio::test]
async fn the_research_team_searches_writes_its_note_and_answers() {
    let notes = tempfile::tempdir().expect("a temporary directory");
    let search = example::stub_search().await.expect("serves");
    let lines = example::run_with(
        &example::Models::scripted(),
        search,
        notes.path().to_path_buf(),
    )
    .await
    .expect("runs");
    assert!(
        lines[1].starts_with("answer: Durable agents record every effect"),
        "{lines:?}"
    );
    assert_eq!(lines[3], "tool calls: search 1, write_note 1");
    let note = std::fs::read_to_string(notes.path().join("notes.md")).expect("written");
    assert!(
        note.starts_with(&format!("# {}", example::QUESTION)),
        "{note}"
    );
    assert!(
        note.contains("Idempotency keys"),
        "the note holds what the search endpoint answered: {note}"
    );
    assert!(lines[4].starts_with("charged: "), "{lines:?}");
    assert!(
        !lines[4].ends_with(" 0 cost micros"),
        "a priced run is charged"
    );
}
