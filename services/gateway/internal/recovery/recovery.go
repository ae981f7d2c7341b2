// Package recovery turns a panic in a request handler into an Internal error
// for that one request, logged with its stack, instead of a crashed process
// that takes every other request and worker stream down with it.
package recovery

import (
	"context"
	"log/slog"
	"net/http"
	"runtime/debug"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// StreamInterceptor recovers panics in stream handlers.
func StreamInterceptor(log *slog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = internal(ss.Context(), log, info.FullMethod, p)
			}
		}()
		return handler(srv, ss)
	}
}

// HTTP recovers panics in an HTTP handler, answering 500 when nothing was
// written yet.
func HTTP(log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				log.ErrorContext(r.Context(), "panic in HTTP handler",
					slog.String("path", r.URL.Path), slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusInternalServerError)
				_, _ = w.Write([]byte(`{"code":13,"message":"internal error"}`))
			}
		}()
		next.ServeHTTP(w, r)
	})
}

func internal(ctx context.Context, log *slog.Logger, method string, p any) error {
	log.ErrorContext(ctx, "panic in gRPC handler",
		slog.String("method", method), slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
	return status.Error(codes.Internal, "internal error")
}
