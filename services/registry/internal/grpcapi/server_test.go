package grpcapi

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/razorbill/flo/libs/coalesce"
	"github.com/razorbill/flo/services/registry/internal/roster"
)

// TestRegistryStatus checks that a batch the database failed and a call
// made while stopping reach the SDK as Unavailable, which it retries.
func TestRegistryStatus(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
		code codes.Code
	}{
		{"database down", fmt.Errorf("heartbeat of ns/w: record heartbeats: %w: %w", roster.ErrUnavailable, errors.New("conn closed")), codes.Unavailable},
		{"stopping", fmt.Errorf("register worker ns/w: %w", coalesce.ErrStopped), codes.Unavailable},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st, ok := status.FromError(registryStatus(tt.err))
			require.True(t, ok)
			require.Equal(t, tt.code, st.Code())
		})
	}
	require.NoError(t, registryStatus(errors.New("something else")), "left to the interceptor")
}
