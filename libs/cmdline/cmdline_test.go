package cmdline_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/cmdline"
	"github.com/razorbill/flo/libs/harness"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

var migrations = fstest.MapFS{
	"0001_items.sql": {Data: []byte(`-- +goose Up
CREATE TABLE items (id bigint PRIMARY KEY);
INSERT INTO items VALUES (1);
-- +goose Down
DROP TABLE items;
`)},
}

func servesNothing(context.Context) error { return errors.New("serve must not run") }

func TestServeIsTheDefault(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{nil, {"serve"}} {
		served := false
		err := cmdline.Run(t.Context(), args, new(bytes.Buffer), cmdline.Service{
			Name:  "svc",
			Serve: func(context.Context) error { served = true; return nil },
		})
		require.NoError(t, err)
		require.True(t, served, "args %q", args)
	}
}

func TestBadCommandLines(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{name: "unknown command", args: []string{"migrat"}, want: `unknown command "migrat"`},
		{name: "serve with arguments", args: []string{"serve", "x"}, want: "serve takes no arguments"},
		{name: "migrate with arguments", args: []string{"migrate", "--now"}, want: "migrate takes no arguments"},
		{name: "healthcheck without URL", args: []string{"healthcheck"}, want: "healthcheck takes one URL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := cmdline.Run(t.Context(), tc.args, new(bytes.Buffer), cmdline.Service{Name: "svc", Serve: servesNothing})
			require.ErrorIs(t, err, cmdline.ErrUsage)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestHelpPrintsUsage(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	require.NoError(t, cmdline.Run(t.Context(), []string{"help"}, &out, cmdline.Service{Name: "svc", Serve: servesNothing}))
	require.Contains(t, out.String(), "svc migrate")
}

// Not parallel: it sets environment variables.
func TestMigrateAppliesTheSchemaOnce(t *testing.T) {
	url := harness.NewDatabase(t)
	t.Setenv("FLO_DATABASE_URL", url)
	svc := cmdline.Service{Name: "svc", Serve: servesNothing, Schema: "svc", Migrations: migrations}
	for range 2 {
		var out bytes.Buffer
		require.NoError(t, cmdline.Run(t.Context(), []string{"migrate"}, &out, svc))
		require.Contains(t, out.String(), "schema up to date")
	}
	conn, err := pgx.Connect(t.Context(), url)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var n int
	require.NoError(t, conn.QueryRow(t.Context(), "SELECT count(*) FROM svc.items").Scan(&n))
	require.Equal(t, 1, n, "a second migrate must not apply the migration again")
}

// Not parallel: it sets environment variables.
func TestMigrateWithoutSchemaSucceeds(t *testing.T) {
	t.Setenv("FLO_DATABASE_URL", "")
	var out bytes.Buffer
	require.NoError(t, cmdline.Run(t.Context(), []string{"migrate"}, &out, cmdline.Service{Name: "gateway", Serve: servesNothing}))
	require.Contains(t, out.String(), "gateway keeps no database schema")
}

// Not parallel: it sets environment variables.
func TestMigrateNeedsADatabase(t *testing.T) {
	t.Setenv("FLO_DATABASE_URL", "")
	err := cmdline.Run(t.Context(), []string{"migrate"}, new(bytes.Buffer), cmdline.Service{Name: "svc", Serve: servesNothing, Schema: "svc", Migrations: migrations})
	require.ErrorContains(t, err, "FLO_DATABASE_URL is required")
}

func TestHealthcheck(t *testing.T) {
	t.Parallel()
	ready := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	defer ready.Close()
	notReady := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "not ready: stopping", http.StatusServiceUnavailable)
	}))
	defer notReady.Close()
	svc := cmdline.Service{Name: "svc", Serve: servesNothing}

	require.NoError(t, cmdline.Run(t.Context(), []string{"healthcheck", ready.URL + "/readyz"}, new(bytes.Buffer), svc))
	err := cmdline.Run(t.Context(), []string{"healthcheck", notReady.URL + "/readyz"}, new(bytes.Buffer), svc)
	require.ErrorContains(t, err, "503")
	require.ErrorContains(t, err, "stopping")
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	require.Error(t, cmdline.Run(t.Context(), []string{"healthcheck", closed.URL}, new(bytes.Buffer), svc))
}

func TestServiceCommandsRunAndShowInHelp(t *testing.T) {
	t.Parallel()
	var got []string
	svc := cmdline.Service{Name: "svc", Serve: servesNothing, Commands: []cmdline.Command{{
		Name: "grow", Args: "N", Help: "grow to N",
		Run: func(_ context.Context, args []string, stdout io.Writer) error {
			got = args
			_, err := io.WriteString(stdout, "grown")
			return err
		},
	}}}
	var out bytes.Buffer
	require.NoError(t, cmdline.Run(t.Context(), []string{"grow", "8"}, &out, svc))
	require.Equal(t, []string{"8"}, got)
	require.Equal(t, "grown", out.String())

	out.Reset()
	require.NoError(t, cmdline.Run(t.Context(), []string{"help"}, &out, svc))
	require.Contains(t, out.String(), "svc grow N")
	require.Contains(t, out.String(), "grow to N")

	err := cmdline.Run(t.Context(), []string{"shrink"}, &out, svc)
	require.ErrorIs(t, err, cmdline.ErrUsage)
}
