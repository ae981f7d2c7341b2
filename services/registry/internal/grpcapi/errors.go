package grpcapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/razorbill/flo/services/registry/internal/fault"
)

// toStatus is the one place domain errors become gRPC status codes. Errors
// that are not domain errors are logged and reported as Internal without
// their details.
func toStatus(ctx context.Context, log *slog.Logger, method string, err error) error {
	if kind, msg, ok := fault.KindOf(err); ok {
		switch kind {
		case fault.NotFound:
			return status.Error(codes.NotFound, msg)
		case fault.Invalid:
			return status.Error(codes.InvalidArgument, msg)
		case fault.Exhausted:
			return status.Error(codes.ResourceExhausted, msg)
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

func errorInterceptor(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if p := recover(); p != nil {
				err = toStatus(ctx, log, info.FullMethod, fmt.Errorf("panic: %v", p))
			}
		}()
		resp, err = handler(ctx, req)
		if err != nil {
			return nil, toStatus(ctx, log, info.FullMethod, err)
		}
		return resp, nil
	}
}

var tracer = otel.Tracer("github.com/razorbill/flo/services/registry/internal/grpcapi")

// traceInterceptor continues the caller's trace from the W3C headers in the
// request metadata, so registry spans, logs and the worker events it writes
// join the gateway's trace.
func traceInterceptor() grpc.UnaryServerInterceptor {
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
