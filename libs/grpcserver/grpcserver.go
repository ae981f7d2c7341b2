// Package grpcserver holds what every Flo gRPC server does the same way: a
// graceful stop bounded by a timeout, continuing the caller's trace, and
// turning handler errors and panics into status codes in one place.
package grpcserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/razorbill/flo/libs/fault"
)

// Stop lets in-flight calls finish, up to timeout, then cancels the ones
// still running. It returns once srv has stopped.
func Stop(srv *grpc.Server, timeout time.Duration, log *slog.Logger) {
	done := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(timeout):
		log.Warn("grpc calls still running after the stop timeout; cancelling them")
		srv.Stop()
		<-done
	}
}

// ErrorInterceptor is the one place a unary handler's error becomes a gRPC
// status. A fault error's kind picks the code and its message is sent; then
// mapErr, when not nil, maps the errors only the service knows (returning nil
// for any other); a canceled or expired context keeps its code. Anything
// else, a recovered panic included, is logged and answered Internal without
// its details.
func ErrorInterceptor(log *slog.Logger, mapErr func(error) error) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if p := recover(); p != nil {
				err = toStatus(ctx, log, info.FullMethod, fmt.Errorf("panic: %v", p), mapErr)
			}
		}()
		resp, err = handler(ctx, req)
		if err != nil {
			return nil, toStatus(ctx, log, info.FullMethod, err, mapErr)
		}
		return resp, nil
	}
}

func toStatus(ctx context.Context, log *slog.Logger, method string, err error, mapErr func(error) error) error {
	if kind, msg, ok := fault.KindOf(err); ok {
		switch kind {
		case fault.NotFound:
			return status.Error(codes.NotFound, msg)
		case fault.Invalid:
			return status.Error(codes.InvalidArgument, msg)
		case fault.Precondition:
			return status.Error(codes.FailedPrecondition, msg)
		case fault.Exhausted:
			return status.Error(codes.ResourceExhausted, msg)
		}
	}
	if mapErr != nil {
		if st := mapErr(err); st != nil {
			return st
		}
	}
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, "request canceled")
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, "deadline exceeded")
	}
	log.ErrorContext(ctx, "request failed", "method", method, "error", err)
	return status.Error(codes.Internal, "internal error")
}

var tracer = otel.Tracer("github.com/razorbill/flo/libs/grpcserver")

// TraceInterceptor continues the caller's trace from the W3C headers in the
// request metadata, so a service's spans, logs and the records it writes join
// the gateway's trace.
func TraceInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if md, ok := metadata.FromIncomingContext(ctx); ok {
			ctx = otel.GetTextMapPropagator().Extract(ctx, metadataCarrier(md))
		}
		ctx, span := tracer.Start(ctx, info.FullMethod, trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		resp, err := handler(ctx, req)
		if err != nil {
			span.RecordError(err)
		}
		return resp, err
	}
}

// metadataCarrier adapts gRPC metadata to a propagation.TextMapCarrier.
type metadataCarrier metadata.MD

func (c metadataCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c metadataCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
