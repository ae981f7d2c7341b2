package cmdline

import (
	"context"
	"log/slog"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

type fakeConfig struct {
	Addr string `env:"FLO_CMDLINE_TEST_ADDR, default=:1"`
}

type fakeServer struct{ ran bool }

func (f *fakeServer) Run(context.Context) error { f.ran = true; return nil }
func (f *fakeServer) GRPCAddr() string          { return "grpc" }
func (f *fakeServer) HTTPAddr() string          { return "http" }

func TestServeLoadsConfigAndRuns(t *testing.T) {
	t.Setenv("FLO_CMDLINE_TEST_ADDR", "127.0.0.1:7")
	t.Setenv("FLO_LOG_LEVEL", "warn")
	srv := &fakeServer{}
	var got fakeConfig
	err := serve("svc", func(_ context.Context, cfg fakeConfig, log *slog.Logger, metrics http.Handler) (Server, error) {
		require.NotNil(t, log)
		require.NotNil(t, metrics)
		got = cfg
		return srv, nil
	})(t.Context())
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:7", got.Addr)
	require.True(t, srv.ran)
}

func TestServeRejectsBadConfig(t *testing.T) {
	t.Setenv("FLO_LOG_LEVEL", "shouting")
	err := serve("svc", func(context.Context, fakeConfig, *slog.Logger, http.Handler) (Server, error) {
		t.Fatal("start must not run with a bad log level")
		return nil, nil
	})(t.Context())
	require.Error(t, err)
}

func TestServeWritesItsAddresses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "addrs.json")
	t.Setenv("FLO_ADDR_FILE", path)
	t.Setenv("FLO_LOG_LEVEL", "warn")
	err := serve("svc", func(context.Context, fakeConfig, *slog.Logger, http.Handler) (Server, error) {
		return &fakeServer{}, nil
	})(t.Context())
	require.NoError(t, err)
	got, err := ReadAddrs(path)
	require.NoError(t, err)
	require.Equal(t, Addrs{GRPC: "grpc", HTTP: "http"}, got)
}
