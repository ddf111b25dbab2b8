//! The coordinator's [`Turn`](crate::Turn), written from canonical parts.

use baton_run::Payload;
use baton_run::program::PayloadWriter;

use super::CodecError;
use super::tasks::Tasks;
use crate::state::Receipt;

/// The coordinator's input for turn `number`: the previous decision's
/// control receipts, the working state, every task and the workers'
/// descriptors (`workers`, their canonical JSON, encoded once per team).
/// Fields in key order, every part canonical: the writer copies each part
/// (each task's text included) as it is, without scanning it.
pub(crate) fn write(
    controls: &[Receipt],
    number: u64,
    state: &Payload,
    tasks: &Tasks,
    workers: &Payload,
) -> Result<Payload, CodecError> {
    let controls = Payload::encode(controls)?;
    let mut text = PayloadWriter::with_capacity(
        controls.len() + state.len() + tasks.text_len() + workers.len() + 64,
    );
    text.begin_object()?;
    text.key("controls")?;
    text.value(&controls)?;
    text.key("number")?;
    text.u64(number)?;
    text.key("state")?;
    text.value(state)?;
    text.key("tasks")?;
    tasks.write_array(&mut text)?;
    text.key("workers")?;
    text.value(workers)?;
    text.end_object()?;
    Ok(text.finish()?)
}
