// Package tracing sets up OpenTelemetry tracing. It is off unless
// configured: spans cost CPU on every request, and most deployments of a
// small service want metrics and logs first. "stdout" prints spans as JSON,
// for development; production would add an OTLP exporter here.
package tracing

import (
	"context"
	"fmt"
	"io"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
)

// AttrOutcome is the span attribute carrying the idempotency outcome
// (executed, replayed, conflict, in_flight, rejected, error).
const AttrOutcome = attribute.Key("oncekey.idempotency.outcome")

// Modes of ONCEKEY_TRACING.
const (
	Off    = ""
	Stdout = "stdout"
)

// Setup installs a global tracer provider for mode, exporting to w for
// "stdout". It returns a shutdown function that flushes pending spans.
func Setup(mode string, w io.Writer) (shutdown func(context.Context) error, err error) {
	switch mode {
	case Off, "off":
		return func(context.Context) error { return nil }, nil
	case Stdout:
		exp, err := stdouttrace.New(stdouttrace.WithWriter(w))
		if err != nil {
			return nil, fmt.Errorf("stdout trace exporter: %w", err)
		}
		return Install(sdktrace.NewBatchSpanProcessor(exp)), nil
	default:
		return nil, fmt.Errorf("ONCEKEY_TRACING=%q: want empty (off) or %q", mode, Stdout)
	}
}

// Install makes a tracer provider over processor the global one, with W3C
// trace-context propagation. Tests pass a processor over an in-memory
// exporter.
func Install(processor sdktrace.SpanProcessor) func(context.Context) error {
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithSpanProcessor(processor),
		sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName("oncekey"))),
	)
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return tp.Shutdown
}

// SetOutcome records the idempotency outcome on the request's span, if any.
func SetOutcome(ctx context.Context, outcome string) {
	trace.SpanFromContext(ctx).SetAttributes(AttrOutcome.String(outcome))
}
