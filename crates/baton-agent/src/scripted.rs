//! A deterministic local model for tests, examples and demos.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use baton_run::BoxFuture;

use crate::chat::{Request, Response};
use crate::cost::Price;
use crate::model::{ChatModel, Delta, DeltaFn, ModelError, ModelIdentity};

type Answer = dyn Fn(&Request) -> Result<Response, ModelError> + Send + Sync;

enum Source {
    Closure(Box<Answer>),
    Script(Mutex<VecDeque<Result<Response, ModelError>>>),
}

/// A deterministic model: a closure that decides from the request, or a
/// script of answers given in order. It runs through the same dispatcher
/// path as a provider; it records every request it receives.
#[derive(Clone)]
pub struct ScriptedModel {
    name: String,
    price: Option<Price>,
    source: Arc<Source>,
    requests: Arc<Mutex<Vec<Request>>>,
}

impl std::fmt::Debug for ScriptedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptedModel")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl ScriptedModel {
    /// A model that answers each request with `answer(request)`. `name`
    /// becomes the model name of its identity (provider `scripted`).
    pub fn new(
        name: impl Into<String>,
        answer: impl Fn(&Request) -> Result<Response, ModelError> + Send + Sync + 'static,
    ) -> ScriptedModel {
        ScriptedModel {
            name: name.into(),
            price: None,
            source: Arc::new(Source::Closure(Box::new(answer))),
            requests: Arc::default(),
        }
    }

    /// A model that gives these answers in order; once they run out it
    /// fails with a non-retryable `Malformed` error.
    pub fn script(
        name: impl Into<String>,
        answers: impl IntoIterator<Item = Result<Response, ModelError>>,
    ) -> ScriptedModel {
        ScriptedModel {
            name: name.into(),
            price: None,
            source: Arc::new(Source::Script(Mutex::new(answers.into_iter().collect()))),
            requests: Arc::default(),
        }
    }

    /// The same model with a price, so calls reserve and are charged the
    /// `cost_micros` meter from the usage its answers report.
    pub fn with_price(mut self, price: Price) -> ScriptedModel {
        self.price = Some(price);
        self
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<Request> {
        self.requests
            .lock()
            .map(|requests| requests.clone())
            .unwrap_or_default()
    }

    /// How many requests it received.
    pub fn calls(&self) -> usize {
        self.requests.lock().map(|r| r.len()).unwrap_or_default()
    }

    fn answer(&self, request: Request) -> Result<Response, ModelError> {
        let answer = match &*self.source {
            Source::Closure(answer) => answer(&request),
            Source::Script(script) => script
                .lock()
                .ok()
                .and_then(|mut script| script.pop_front())
                .unwrap_or_else(|| {
                    Err(ModelError::Malformed(
                        "the scripted model has no answer left".into(),
                    ))
                }),
        };
        if let Ok(mut requests) = self.requests.lock() {
            requests.push(request);
        }
        answer
    }
}

impl ChatModel for ScriptedModel {
    fn identity(&self) -> ModelIdentity {
        ModelIdentity {
            provider: "scripted".into(),
            model: self.name.clone(),
        }
    }

    fn price(&self) -> Option<Price> {
        self.price
    }

    fn call(&self, request: Request) -> BoxFuture<'_, Result<Response, ModelError>> {
        let answer = self.answer(request);
        Box::pin(std::future::ready(answer))
    }

    /// Streams the answer's text word by word, then returns it.
    fn stream<'a>(
        &'a self,
        request: Request,
        on_delta: DeltaFn<'a>,
    ) -> BoxFuture<'a, Result<Response, ModelError>> {
        let answer = self.answer(request);
        if let Ok(response) = &answer {
            let text = response.message().text();
            for word in text.split_inclusive(' ') {
                on_delta(Delta::Text { text: word.into() });
            }
        }
        Box::pin(std::future::ready(answer))
    }
}
