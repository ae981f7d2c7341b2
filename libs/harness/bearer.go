package harness

import (
	"context"

	"google.golang.org/grpc/credentials"
)

// Bearer returns call credentials sending key as "authorization: Bearer
// <key>", the way the SDK sends its key, for tests' raw gRPC connections to
// a gateway on plaintext loopback.
func Bearer(key string) credentials.PerRPCCredentials { return bearer(key) }

type bearer string

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials: tests
// may send the key over plaintext.
func (bearer) RequireTransportSecurity() bool { return false }
