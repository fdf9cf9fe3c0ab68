//! Traces (`telemetry.otlp`, feature `otel`): one server span per request,
//! exported over OTLP/HTTP.
//!
//! The span starts when the request arrives and ends when its response has
//! streamed (or the client left). Its context goes on as the request's
//! `traceparent`, to the app and on a hop to the holder's gateway, so the
//! app's spans and the holder gateway's span join the same trace. An
//! incoming `traceparent` is the parent when its sender is trusted
//! (`parent`), and a link otherwise: an untrusted client can neither join
//! its requests to another trace nor make the gateway sample them.
//!
//! Finished spans wait in a bounded queue that a thread of the SDK exports
//! in batches; a full queue drops spans. The export's HTTP request runs on
//! the gateway's runtime with its own deadline, so a dead or slow collector
//! costs at most the queue, never a request.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{
    Link, Span as _, SpanBuilder, SpanContext, SpanKind, Status, TraceContextExt,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_http::{HeaderExtractor, HttpClient, HttpError};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider,
};
use opentelemetry_sdk::Resource;

use super::GatewayError;
use crate::config::{OtlpConfig, TraceParentTrust};
use crate::proxy::gate::{GateNote, GateSettings};
use crate::proxy::headers::HOP;

/// Exports that failed (the collector refused, was unreachable, or timed out).
pub(crate) const EXPORT_FAILURES: &str = "rolegate_otlp_export_failures_total";

/// The largest collector answer read.
const MAX_ANSWER: usize = 64 * 1024;

/// The process's tracer: shared by every worker.
#[derive(Clone)]
pub(crate) struct Traces {
    tracer: SdkTracer,
    provider: SdkTracerProvider,
    parent: TraceParentTrust,
}

impl Traces {
    /// Starts the exporter for `config`; its HTTP requests run on `runtime`.
    pub(crate) fn start(
        config: &OtlpConfig,
        instance_id: &str,
        runtime: tokio::runtime::Handle,
    ) -> Result<Self, GatewayError> {
        metrics::describe_counter!(
            EXPORT_FAILURES,
            "OTLP span exports that failed (collector unreachable, refused, or too slow)"
        );
        let bad = |e: &dyn std::fmt::Display| GatewayError::Traces(e.to_string());
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(Exporter::new(runtime, config.timeout).map_err(|e| bad(&e))?)
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(format!("{}/v1/traces", config.endpoint))
            .with_timeout(config.timeout)
            .build()
            .map_err(|e| bad(&e))?;
        let batches = BatchConfigBuilder::default()
            .with_max_queue_size(config.queue)
            .with_max_export_batch_size(config.queue.min(512))
            .build();
        let processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(batches)
            .build();
        let resource = Resource::builder_empty()
            .with_service_name(config.service_name.clone())
            .with_attribute(KeyValue::new(
                "service.instance.id",
                instance_id.to_string(),
            ))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                config.sample_ratio.0,
            ))))
            .with_resource(resource)
            .build();
        let tracer = opentelemetry::trace::TracerProvider::tracer(&provider, "rolegate");
        Ok(Self {
            tracer,
            provider,
            parent: config.parent,
        })
    }

    /// Starts `req`'s span and puts its context in `req`'s `traceparent`.
    pub(crate) fn begin(
        &self,
        req: &mut Request<Body>,
        client: SocketAddr,
        route: Option<Arc<str>>,
        settings: &GateSettings,
    ) -> SpanEntry {
        let incoming = TraceContextPropagator::new()
            .extract(&HeaderExtractor(req.headers()))
            .span()
            .span_context()
            .clone();
        let (parent, links) = match incoming.is_valid() {
            false => (Context::new(), Vec::new()),
            true if self.trusts(req, client, settings) => (
                Context::new().with_remote_span_context(incoming),
                Vec::new(),
            ),
            true => (Context::new(), vec![Link::with_context(incoming)]),
        };
        let method = req.method().as_str().to_owned();
        let name = match &route {
            Some(r) => format!("{method} {r}"),
            None => method.clone(),
        };
        let mut attributes = vec![
            KeyValue::new("http.request.method", method),
            KeyValue::new("url.path", req.uri().path().to_owned()),
            KeyValue::new("client.address", client.ip().to_string()),
        ];
        if let Some(r) = route {
            attributes.push(KeyValue::new("rolegate.route", r.to_string()));
        }
        let span = SpanBuilder::from_name(name)
            .with_kind(SpanKind::Server)
            .with_attributes(attributes)
            .with_links(links)
            .start_with_context(&self.tracer, &parent);
        propagate(req, span.span_context());
        SpanEntry { span }
    }

    /// Whether `req`'s `traceparent` may be the span's parent.
    fn trusts(&self, req: &Request<Body>, client: SocketAddr, settings: &GateSettings) -> bool {
        match self.parent {
            TraceParentTrust::Always => true,
            TraceParentTrust::Never => false,
            TraceParentTrust::Trusted => {
                if crate::proxy::trust::is_trusted(&settings.trusted_proxies, Some(client.ip())) {
                    return true;
                }
                // A peer gateway's hop, verified with the cluster secret
                // (without one, any client can send a marker).
                let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
                settings.signer.is_signed()
                    && req
                        .headers()
                        .get(HOP)
                        .is_some_and(|v| settings.signer.verify(v, req.method().as_str(), path))
            }
        }
    }

    /// Exports what is queued (on shutdown), waiting at most `timeout`.
    pub(crate) async fn shutdown(&self, timeout: Duration) {
        let provider = self.provider.clone();
        let done = tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(timeout));
        match done.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "traces not all exported at shutdown"),
            Err(e) => tracing::warn!(error = %e, "traces not all exported at shutdown"),
        }
    }
}

/// The request's own context, sent on as `traceparent` (and the parent's
/// `tracestate`, which belongs to a trusted parent only).
fn propagate(req: &mut Request<Body>, cx: &SpanContext) {
    let headers = req.headers_mut();
    let value = format!(
        "00-{}-{}-{:02x}",
        cx.trace_id(),
        cx.span_id(),
        cx.trace_flags().to_u8()
    );
    match HeaderValue::from_str(&value) {
        Ok(v) => {
            headers.insert("traceparent", v);
        }
        Err(_) => {
            headers.remove("traceparent");
        }
    }
    let state = cx.trace_state().header();
    match HeaderValue::from_str(&state) {
        Ok(v) if !state.is_empty() => {
            headers.insert("tracestate", v);
        }
        _ => {
            headers.remove("tracestate");
        }
    }
}

/// A request's span, ended when its response has streamed.
pub(crate) struct SpanEntry {
    span: opentelemetry_sdk::trace::Span,
}

impl SpanEntry {
    /// Records how `resp` was decided; the span ends with its body.
    pub(crate) fn finish(mut self, decision: &'static str, resp: Response<Body>) -> Response<Body> {
        let span = &mut self.span;
        let status = resp.status().as_u16();
        span.set_attribute(KeyValue::new("rolegate.decision", decision));
        span.set_attribute(KeyValue::new(
            "http.response.status_code",
            i64::from(status),
        ));
        // The app's or the holder's answer, as opposed to the gateway's own.
        if matches!(decision, "local" | "forwarded" | "passthrough") {
            span.set_attribute(KeyValue::new("rolegate.upstream_status", i64::from(status)));
        }
        if let Some(note) = resp.extensions().get::<GateNote>() {
            let text = |k: &'static str, v: &Option<Arc<str>>| {
                v.as_ref().map(|v| KeyValue::new(k, v.to_string()))
            };
            let facts = [
                text("rolegate.role", &note.role),
                text("rolegate.partition", &note.partition),
                text("rolegate.holder", &note.holder),
                note.token
                    .map(|t| KeyValue::new("rolegate.token", i64::try_from(t).unwrap_or(i64::MAX))),
                note.held
                    .map(|h| KeyValue::new("rolegate.hold_ms", h.as_secs_f64() * 1000.0)),
            ];
            for kv in facts.into_iter().flatten() {
                span.set_attribute(kv);
            }
        }
        if status >= 500 {
            span.set_status(Status::error(format!("{decision} {status}")));
        }
        super::watched::watch(resp, self)
    }
}

impl super::watched::Watcher for SpanEntry {}

impl Drop for SpanEntry {
    fn drop(&mut self) {
        self.span.end();
    }
}

/// The exporter's HTTP client: the request runs on the gateway's runtime
/// (the SDK's export thread has none), bounded by `timeout`.
#[derive(Debug)]
struct Exporter {
    client: Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
    runtime: tokio::runtime::Handle,
    timeout: Duration,
}

impl Exporter {
    fn new(runtime: tokio::runtime::Handle, timeout: Duration) -> Result<Self, rustls::Error> {
        let tls = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()?;
        let tls = hyper_rustls::ConfigBuilderExt::with_webpki_roots(tls).with_no_client_auth();
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(timeout));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Ok(Self {
            client,
            runtime,
            timeout,
        })
    }
}

#[async_trait::async_trait]
impl HttpClient for Exporter {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        let timeout = self.timeout;
        let sent = self.runtime.spawn(async move {
            let exchange = async {
                let resp = client.request(request.map(Full::new)).await?;
                let (parts, body) = resp.into_parts();
                let body = Limited::new(body, MAX_ANSWER).collect().await?.to_bytes();
                Ok::<_, HttpError>(Response::from_parts(parts, body))
            };
            match tokio::time::timeout(timeout, exchange).await {
                Ok(answer) => answer,
                Err(_) => Err(format!("the collector did not answer within {timeout:?}").into()),
            }
        });
        let answer = match sent.await {
            Ok(answer) => answer,
            Err(e) => Err(e.into()),
        };
        match &answer {
            Ok(resp) if resp.status().is_success() => {}
            _ => metrics::counter!(EXPORT_FAILURES).increment(1),
        }
        answer
    }
}
