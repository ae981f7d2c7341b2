// Package httpapi is the gateway's HTTP side: the REST facade of the public
// API (grpc-gateway calling the gRPC handlers in process, no extra hop), the
// OpenAPI document, and the health and readiness probes. Errors keep the
// grpc-gateway shape {code, message, details} with the HTTP status mapped
// from the gRPC code.
package httpapi

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/razorbill/flo/services/gateway/internal/recovery"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// Options configure the handler.
type Options struct {
	// MaxBodyBytes is the largest request body read; larger ones get 413.
	MaxBodyBytes int64
	// Probes answers /healthz and /readyz, the only routes open without a
	// key (libs/probe's handler).
	Probes http.Handler
	// Authorize runs once grpc-gateway has matched a REST route, with the
	// route's path parameters: the auth guard's check of the call.
	Authorize runtime.Middleware
	// OpenAPI is the document served at /openapi.json.
	OpenAPI []byte
	// Log receives handler panics.
	Log *slog.Logger
}

// Services are the gRPC handlers the REST facade calls.
type Services struct {
	Namespaces flov1.NamespaceServiceServer
	Actions    flov1.ActionServiceServer
	Tasks      flov1.TaskServiceServer
	Workers    flov1.WorkerRegistryServiceServer
	Streams    flov1.StreamServiceServer
	Workflows  flov1.WorkflowServiceServer
	Keys       flov1.KeyServiceServer
}

// NewHandler returns the gateway's HTTP handler.
func NewHandler(ctx context.Context, svc Services, opts Options) (http.Handler, error) {
	gw := runtime.NewServeMux(
		runtime.WithMarshalerOption(runtime.MIMEWildcard, &runtime.HTTPBodyMarshaler{
			Marshaler: &runtime.JSONPb{
				MarshalOptions: protojson.MarshalOptions{EmitUnpopulated: false},
				// Unknown fields are refused: a misspelt field would otherwise
				// be ignored silently and the call would do something else
				// than the caller meant.
				UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
			},
		}),
		runtime.WithMiddlewares(nameSpan, opts.Authorize),
	)
	if err := flov1.RegisterNamespaceServiceHandlerServer(ctx, gw, svc.Namespaces); err != nil {
		return nil, fmt.Errorf("register namespace REST handlers: %w", err)
	}
	if err := flov1.RegisterActionServiceHandlerServer(ctx, gw, svc.Actions); err != nil {
		return nil, fmt.Errorf("register action REST handlers: %w", err)
	}
	if err := flov1.RegisterTaskServiceHandlerServer(ctx, gw, svc.Tasks); err != nil {
		return nil, fmt.Errorf("register task REST handlers: %w", err)
	}
	if err := flov1.RegisterWorkerRegistryServiceHandlerServer(ctx, gw, svc.Workers); err != nil {
		return nil, fmt.Errorf("register worker registry REST handlers: %w", err)
	}
	if err := flov1.RegisterStreamServiceHandlerServer(ctx, gw, svc.Streams); err != nil {
		return nil, fmt.Errorf("register stream REST handlers: %w", err)
	}
	if err := flov1.RegisterWorkflowServiceHandlerServer(ctx, gw, svc.Workflows); err != nil {
		return nil, fmt.Errorf("register workflow REST handlers: %w", err)
	}
	if err := flov1.RegisterKeyServiceHandlerServer(ctx, gw, svc.Keys); err != nil {
		return nil, fmt.Errorf("register key REST handlers: %w", err)
	}

	mux := http.NewServeMux()
	mux.Handle("GET /healthz", opts.Probes)
	mux.Handle("GET /readyz", opts.Probes)
	mux.HandleFunc("GET /openapi.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(opts.OpenAPI)
	})
	mux.Handle("/", limitBody(gw, opts.MaxBodyBytes))

	return otelhttp.NewHandler(recovery.HTTP(opts.Log, mux), "HTTP"), nil
}

// nameSpan names the request's span after the matched route, such as
// "POST /v1/namespaces/{namespace}/actions/{action}/invoke", once grpc-gateway
// has matched it; the path itself would make one span name per task id.
func nameSpan(next runtime.HandlerFunc) runtime.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request, params map[string]string) {
		if pat, ok := runtime.HTTPPattern(r.Context()); ok {
			trace.SpanFromContext(r.Context()).SetName(r.Method + " " + pat.String())
		}
		next(w, r, params)
	}
}

// limitBody reads request bodies up to max bytes and answers 413 with a JSON
// error beyond that, before any handler decodes anything. Buffering is
// bounded by max, and the JSON decoder would hold the whole body anyway.
func limitBody(gw *runtime.ServeMux, max int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			gw.ServeHTTP(w, r)
			return
		}
		tooLarge := func() {
			_, out := runtime.MarshalerForRequest(gw, r)
			runtime.HTTPError(r.Context(), gw, out, w, r, &runtime.HTTPStatusError{
				HTTPStatus: http.StatusRequestEntityTooLarge,
				Err:        status.Errorf(codes.ResourceExhausted, "request body is larger than %d bytes", max),
			})
		}
		if r.ContentLength > max {
			tooLarge()
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, max+1))
		if err != nil {
			_, out := runtime.MarshalerForRequest(gw, r)
			runtime.HTTPError(r.Context(), gw, out, w, r, status.Errorf(codes.InvalidArgument, "read request body: %v", err))
			return
		}
		if int64(len(body)) > max {
			tooLarge()
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		gw.ServeHTTP(w, r)
	})
}
