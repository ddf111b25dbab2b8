//! OpenTelemetry export of the engine's and the agents' spans (feature
//! `otel`).
//!
//! [`Telemetry`] owns a tracer provider whose batch processor sends spans
//! over OTLP/HTTP with protobuf bodies, on a thread of its own, to the
//! endpoint the standard variables name: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
//! (used as given) or `OTEL_EXPORTER_OTLP_ENDPOINT` (with `/v1/traces`
//! appended), with `OTEL_EXPORTER_OTLP_HEADERS` / `_TIMEOUT` and their
//! `TRACES` variants; the resource's `service.name` is `OTEL_SERVICE_NAME`,
//! else the name the host gives, and `OTEL_RESOURCE_ATTRIBUTES` adds more.
//! [`Telemetry::layer`] is the `tracing` layer to add to a subscriber, and
//! [`Telemetry::shutdown`] flushes what is still buffered; call it before
//! the process exits.
//!
//! [`crate::execute`] does all of this when one of the endpoint variables
//! is set (and `OTEL_SDK_DISABLED` is not `true`). A host with its own
//! subscriber builds the layer itself:
//!
//! ```no_run
//! use tracing_subscriber::layer::SubscriberExt as _;
//! use tracing_subscriber::util::SubscriberInitExt as _;
//!
//! let config = baton_cli::telemetry::TelemetryConfig::from_env("acme");
//! let telemetry = baton_cli::telemetry::Telemetry::new(config)?;
//! tracing_subscriber::registry().with(telemetry.layer()).init();
//! // … run the engine …
//! telemetry.shutdown()?;
//! # Ok::<(), baton_cli::telemetry::TelemetryError>(())
//! ```

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

/// The variable that selects which spans are exported, in `RUST_LOG`'s
/// syntax; [`DEFAULT_FILTER`] when unset.
pub const FILTER_VARIABLE: &str = "BATON_OTEL_FILTER";

/// The spans exported unless [`FILTER_VARIABLE`] says otherwise: `info`
/// and above everywhere (trees, model calls, tool calls, the server), and
/// the kernel's `debug` spans (processes, steps, effects).
pub const DEFAULT_FILTER: &str = "info,baton_run=debug";

/// Why telemetry could not be set up or shut down.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TelemetryError {
    /// The OTLP exporter could not be built (a malformed endpoint or header
    /// variable, for example).
    #[error("cannot build the OTLP span exporter: {0}")]
    Exporter(#[source] opentelemetry_otlp::ExporterBuildError),
    /// [`FILTER_VARIABLE`] is not a valid filter.
    #[error("{FILTER_VARIABLE} is not a valid filter: {0}")]
    Filter(#[source] tracing_subscriber::filter::ParseError),
    /// Flushing the buffered spans or shutting the exporter down failed
    /// (the collector did not answer in time, for example).
    #[error("cannot flush the spans: {0}")]
    Shutdown(#[source] opentelemetry_sdk::error::OTelSdkError),
}

impl TelemetryError {
    /// A stable code: `telemetry.exporter.invalid`,
    /// `telemetry.filter.invalid` or `telemetry.shutdown.failed`.
    pub fn code(&self) -> &'static str {
        match self {
            TelemetryError::Exporter(_) => "telemetry.exporter.invalid",
            TelemetryError::Filter(_) => "telemetry.filter.invalid",
            TelemetryError::Shutdown(_) => "telemetry.shutdown.failed",
        }
    }
}

/// How to export: the service name and which spans.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TelemetryConfig {
    /// The resource's `service.name`.
    pub service_name: String,
    /// Which spans are exported, in `RUST_LOG`'s syntax.
    pub filter: String,
    /// The full URL spans are posted to; `None` lets the exporter read the
    /// standard variables (and default to `http://localhost:4318/v1/traces`).
    pub endpoint: Option<String>,
}

impl TelemetryConfig {
    /// The configuration the standard variables give, with
    /// `default_service_name` when `OTEL_SERVICE_NAME` is unset or empty,
    /// and [`FILTER_VARIABLE`] or [`DEFAULT_FILTER`].
    pub fn from_env(default_service_name: &str) -> TelemetryConfig {
        let service_name =
            non_empty("OTEL_SERVICE_NAME").unwrap_or_else(|| default_service_name.to_owned());
        let filter = non_empty(FILTER_VARIABLE).unwrap_or_else(|| DEFAULT_FILTER.to_owned());
        TelemetryConfig {
            service_name,
            filter,
            endpoint: None,
        }
    }

    /// Whether the environment asks for export: an OTLP endpoint variable is
    /// set and `OTEL_SDK_DISABLED` is not `true`.
    pub fn requested() -> bool {
        let disabled = std::env::var("OTEL_SDK_DISABLED")
            .is_ok_and(|value| value.trim().eq_ignore_ascii_case("true"));
        !disabled
            && (non_empty("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some()
                || non_empty("OTEL_EXPORTER_OTLP_ENDPOINT").is_some())
    }
}

fn non_empty(variable: &str) -> Option<String> {
    std::env::var(variable)
        .ok()
        .filter(|value| !value.trim().is_empty())
}

/// A running span export: the tracer provider and the filter of its layer.
#[derive(Debug)]
pub struct Telemetry {
    provider: SdkTracerProvider,
    filter: tracing_subscriber::EnvFilter,
}

impl Telemetry {
    /// Starts the export `config` describes. Call it outside an async
    /// runtime or inside one: the exporter's HTTP client and the batch
    /// processor run on threads of their own.
    pub fn new(config: TelemetryConfig) -> Result<Telemetry, TelemetryError> {
        let filter = tracing_subscriber::EnvFilter::try_new(&config.filter)
            .map_err(TelemetryError::Filter)?;
        let builder = SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary);
        let builder = match config.endpoint {
            Some(endpoint) => builder.with_endpoint(endpoint),
            None => builder,
        };
        let exporter = builder.build().map_err(TelemetryError::Exporter)?;
        let resource = Resource::builder()
            .with_service_name(config.service_name)
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        Ok(Telemetry { provider, filter })
    }

    /// The `tracing` layer that exports the spans its filter selects. Each
    /// call makes a layer over the same provider; add one to a subscriber.
    pub fn layer<S>(&self) -> impl Layer<S>
    where
        S: tracing::Subscriber + for<'span> LookupSpan<'span>,
    {
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("baton"))
            .with_filter(self.filter.clone())
    }

    /// Exports every span still buffered and stops the exporter. Spans that
    /// are still open are not exported.
    pub fn shutdown(self) -> Result<(), TelemetryError> {
        self.provider.shutdown().map_err(TelemetryError::Shutdown)
    }
}
