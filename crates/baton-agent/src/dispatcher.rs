//! The model dispatcher: what carries a model call out, streams its deltas
//! and settles it with its charge.

use std::sync::Arc;

use baton_run::dispatch::{DispatchCall, Dispatcher, ReplayPolicy};
use baton_run::{BoxFuture, Failure, FailureKind, Payload, Settlement};
use tracing::Instrument;

use crate::cost::{Price, charge};
use crate::interaction::ModelCall;
use crate::model::{ChatModel, Delta, ModelError, ModelIdentity};
use crate::telemetry::{chat_span, record_error, record_response};

/// Executes model calls: decodes the frozen [`ModelCall`], streams it
/// through the model (deltas become engine events), and settles with the
/// response, charging the reported input and output tokens (and their cost
/// at the model's price), or the whole reservation when the provider
/// reported no usage. A failed call settles with the classified failure of
/// its [`ModelError`]. Replay policy `Never`: a call lost in a crash
/// becomes an unknown effect. Each call runs in a `chat` span with the
/// OpenTelemetry GenAI attributes (model, provider, usage, finish reason).
pub struct ModelDispatcher {
    model: Arc<dyn ChatModel>,
    /// Kept so a call's span borrows it instead of asking the model anew.
    identity: Arc<ModelIdentity>,
    price: Option<Price>,
    max_response_bytes: usize,
}

impl ModelDispatcher {
    /// A dispatcher over `model`, refusing responses larger than `max_response_bytes`.
    pub fn new(model: Arc<dyn ChatModel>, max_response_bytes: usize) -> ModelDispatcher {
        ModelDispatcher {
            identity: Arc::new(model.identity()),
            price: model.price(),
            model,
            max_response_bytes,
        }
    }
}

impl Dispatcher for ModelDispatcher {
    fn replay_policy(&self, _request: &Payload) -> ReplayPolicy {
        ReplayPolicy::Never
    }

    fn dispatch(&self, call: DispatchCall) -> BoxFuture<'static, Settlement> {
        let model = self.model.clone();
        let limit = self.max_response_bytes;
        let price = self.price;
        let span = chat_span(&self.identity);
        let (traced, identity) = (span.clone(), self.identity.clone());
        let call = async move {
            let model_call: ModelCall = match call.request.decode() {
                Ok(model_call) => model_call,
                Err(error) => {
                    return Settlement::failed(
                        ModelError::Request(format!("not a model call: {error}")).failure(),
                    );
                }
            };
            let deltas = call.deltas.clone();
            let on_delta = move |delta: Delta| {
                if let Ok(payload) = Payload::encode(&delta) {
                    deltas.emit(payload);
                }
            };
            let mut cancel = call.cancel.clone();
            let result = tokio::select! {
                result = model.stream(model_call.request, &on_delta) => result,
                () = cancel.canceled() => {
                    record_error(&traced, "interaction.model.canceled");
                    return Settlement::failed(Failure::new(
                        FailureKind::External,
                        "interaction.model.canceled",
                        "the model call was canceled",
                    ));
                }
            };
            let response = match result {
                Ok(response) => response,
                // The provider's classification (definite or uncertain, and
                // the delay it asked for) is what the call's retry policy reads.
                Err(error) => {
                    record_error(&traced, error.code());
                    return match error.retry() {
                        Some(hint) => Settlement::failed_retryable(error.failure(), hint),
                        None => Settlement::failed(error.failure()),
                    };
                }
            };
            record_response(&traced, &identity, &response);
            let output = match Payload::encode(&response) {
                Ok(output) if output.len() <= limit => output,
                Ok(_) | Err(baton_run::PayloadError::TooLarge { .. }) => {
                    return Settlement::failed(ModelError::TooLarge { limit }.failure());
                }
                Err(error) => {
                    return Settlement::failed(
                        ModelError::Malformed(format!("the response does not encode: {error}"))
                            .failure(),
                    );
                }
            };
            if response.usage().is_none() {
                tracing::warn!(
                    effect = %call.effect,
                    "the provider reported no usage; the call is charged its whole reservation"
                );
            }
            Settlement::Succeeded {
                output,
                usage: charge(response.usage().as_ref(), price.as_ref(), &call.reserve),
            }
        };
        Box::pin(call.instrument(span))
    }
}
