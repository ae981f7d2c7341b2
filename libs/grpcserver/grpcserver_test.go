package grpcserver_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/grpcserver"
	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/internalauth"
)

var quiet = slog.New(slog.DiscardHandler)

var errStopping = errors.New("stopping")

func TestErrorInterceptor(t *testing.T) {
	t.Parallel()
	mapErr := func(err error) error {
		if errors.Is(err, errStopping) {
			return status.Error(codes.Unavailable, "service is stopping")
		}
		return nil
	}
	tests := []struct {
		name    string
		handler grpc.UnaryHandler
		code    codes.Code
		message string
	}{
		{name: "ok", handler: func(context.Context, any) (any, error) { return "resp", nil }, code: codes.OK},
		{name: "not found", handler: fails(fault.NotFoundf("task %s not found", "t1")), code: codes.NotFound, message: "task t1 not found"},
		{name: "invalid", handler: fails(fmt.Errorf("claim: %w", fault.Invalidf("count must not be negative"))), code: codes.InvalidArgument, message: "count must not be negative"},
		{name: "precondition", handler: fails(fault.Preconditionf("task is running")), code: codes.FailedPrecondition, message: "task is running"},
		{name: "exhausted", handler: fails(fault.Exhaustedf("too many workers")), code: codes.ResourceExhausted, message: "too many workers"},
		{name: "service error", handler: fails(fmt.Errorf("claim: %w", errStopping)), code: codes.Unavailable, message: "service is stopping"},
		{name: "canceled", handler: fails(fmt.Errorf("claim: %w", context.Canceled)), code: codes.Canceled, message: "request canceled"},
		{name: "deadline", handler: fails(context.DeadlineExceeded), code: codes.DeadlineExceeded, message: "deadline exceeded"},
		{name: "other", handler: fails(errors.New("connection reset by database")), code: codes.Internal, message: "internal error"},
		{name: "panic", handler: func(context.Context, any) (any, error) { panic("boom") }, code: codes.Internal, message: "internal error"},
	}
	intercept := grpcserver.ErrorInterceptor(quiet, mapErr)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			resp, err := intercept(context.Background(), "req", &grpc.UnaryServerInfo{FullMethod: "/test/Call"}, tt.handler)
			if tt.code == codes.OK {
				require.NoError(t, err)
				require.Equal(t, "resp", resp)
				return
			}
			require.Nil(t, resp)
			st, ok := status.FromError(err)
			require.True(t, ok, "a status error: %v", err)
			require.Equal(t, tt.code, st.Code())
			require.Equal(t, tt.message, st.Message())
		})
	}
}

func TestErrorInterceptorWithoutServiceErrors(t *testing.T) {
	t.Parallel()
	intercept := grpcserver.ErrorInterceptor(quiet, nil)
	_, err := intercept(context.Background(), "req", &grpc.UnaryServerInfo{FullMethod: "/test/Call"}, fails(errStopping))
	require.Equal(t, codes.Internal, status.Code(err))
}

func fails(err error) grpc.UnaryHandler {
	return func(context.Context, any) (any, error) { return nil, err }
}

func TestNewInternalContinuesCallersTrace(t *testing.T) {
	otel.SetTextMapPropagator(propagation.TraceContext{})
	caller := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0xaa, 1},
		SpanID:     trace.SpanID{0xbb, 2},
		TraceFlags: trace.FlagsSampled,
	})
	got := make(chan trace.SpanContext, 1)
	_, err := grpcserver.NewInternal(config.Auth{}, quiet, nil)
	require.ErrorContains(t, err, "FLO_INTERNAL_TOKEN", "no internal server without the internal token")
	srv, err := grpcserver.NewInternal(harness.InternalAuth(), quiet, nil, grpc.UnknownServiceHandler(func(_ any, stream grpc.ServerStream) error {
		got <- trace.SpanContextFromContext(stream.Context())
		if err := stream.RecvMsg(&healthpb.HealthCheckRequest{}); err != nil {
			return err
		}
		return stream.SendMsg(&healthpb.HealthCheckResponse{})
	}))
	require.NoError(t, err)
	conn := start(t, srv)
	ctx := metadata.AppendToOutgoingContext(context.Background(),
		internalauth.MetadataKey, harness.InternalAuth().InternalToken,
		"traceparent", "00-"+caller.TraceID().String()+"-"+caller.SpanID().String()+"-01")
	require.NoError(t, conn.Invoke(ctx, "/test.Service/Call", &healthpb.HealthCheckRequest{}, &healthpb.HealthCheckResponse{}))
	require.Equal(t, caller.TraceID(), (<-got).TraceID())
}

// serve runs a gRPC server with the health service on loopback and returns
// a client of it.
func serve(t *testing.T) (*grpc.Server, healthpb.HealthClient) {
	t.Helper()
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	return srv, healthpb.NewHealthClient(start(t, srv))
}

// start serves srv on loopback and returns a client connection to it.
func start(t *testing.T, srv *grpc.Server) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		require.NoError(t, <-served)
	})
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func TestStopWithoutCallsIsImmediate(t *testing.T) {
	t.Parallel()
	srv, client := serve(t)
	_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	start := time.Now()
	grpcserver.Stop(srv, time.Minute, quiet)
	require.Less(t, time.Since(start), 10*time.Second)
}

func TestStopCancelsCallsAfterTimeout(t *testing.T) {
	t.Parallel()
	srv, client := serve(t)
	// A Watch stream stays open until the server ends it.
	stream, err := client.Watch(context.Background(), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	_, err = stream.Recv()
	require.NoError(t, err)

	start := time.Now()
	grpcserver.Stop(srv, 200*time.Millisecond, quiet)
	require.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond, "in-flight calls get the timeout to finish")
	_, err = stream.Recv()
	require.Error(t, err, "the open call was cancelled")
}
