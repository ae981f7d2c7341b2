package flo

import (
	"context"
	"errors"
	"fmt"
	"sync"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"go.opentelemetry.io/otel"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// DefaultNamespace is the namespace a client uses unless [WithNamespace] says otherwise.
const DefaultNamespace = "default"

// ErrNotConnected is returned by client calls made before [Client.Connect] or after
// [Client.Close].
var ErrNotConnected = errors.New("flo: client not connected")

// Client is a connection to a Flo gateway, bound to one namespace. It is safe for concurrent
// use; one client per process is enough, however many workers it feeds.
type Client struct {
	addr      string
	namespace string
	token     string
	dialOpts  []grpc.DialOption

	mu   sync.RWMutex
	conn *grpc.ClientConn
}

// ClientOption configures a [Client].
type ClientOption func(*Client)

// WithNamespace sets the namespace every call of the client works in.
func WithNamespace(namespace string) ClientOption {
	return func(c *Client) { c.namespace = namespace }
}

// WithToken sets the bearer token sent with every call and in each worker stream's hello.
func WithToken(token string) ClientOption {
	return func(c *Client) { c.token = token }
}

// WithDialOptions adds gRPC dial options, applied after the defaults so they can replace them
// (for example grpc.WithTransportCredentials for TLS, or an OpenTelemetry stats handler).
func WithDialOptions(opts ...grpc.DialOption) ClientOption {
	return func(c *Client) { c.dialOpts = append(c.dialOpts, opts...) }
}

// NewClient returns a client for the gateway at addr (host:port). It does not connect: call
// [Client.Connect] before using it.
func NewClient(addr string, opts ...ClientOption) *Client {
	c := &Client{addr: addr, namespace: DefaultNamespace}
	for _, opt := range opts {
		opt(c)
	}
	return c
}

// Namespace returns the namespace the client works in.
func (c *Client) Namespace() string { return c.namespace }

// Addr returns the gateway address the client was created with.
func (c *Client) Addr() string { return c.addr }

// maxReceiveBytes bounds one message from the gateway, which caps its batches
// near 256 MiB.
const maxReceiveBytes = 256 << 20

// Connect prepares the gRPC connection. The connection itself is established lazily and
// re-established whenever it breaks, so Connect fails only on a malformed address or options.
// Calls that are safe to repeat (reads, enable/disable, drain, ack, cancel) are retried up to
// four times, within about 1.5 s, when the gateway answers UNAVAILABLE, and so are invocations
// and starts that carry an idempotency key; other invocations, appends, starts and signals are
// not, since the first attempt may have taken effect.
// Plaintext is the default, which suits a local gateway; pass TLS credentials through
// [WithDialOptions] for anything else. Calling Connect on a connected client does nothing.
func (c *Client) Connect() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil {
		return nil
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(c.unaryInterceptor),
		grpc.WithChainStreamInterceptor(c.streamInterceptor),
		// A task or record batch carries up to its count of payloads of up to
		// 1 MiB each; gRPC's default 4 MiB would break the stream on the first
		// batch of large payloads.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxReceiveBytes)),
		grpc.WithDefaultServiceConfig(serviceConfig()),
	}
	opts = append(opts, c.dialOpts...)
	conn, err := grpc.NewClient(c.addr, opts...)
	if err != nil {
		return fmt.Errorf("flo: connect to %s: %w", c.addr, err)
	}
	c.conn = conn
	return nil
}

// Close releases the connection. Workers built from the client must be stopped first.
// Closing a closed client does nothing.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		return nil
	}
	err := c.conn.Close()
	c.conn = nil
	if err != nil {
		return fmt.Errorf("flo: close connection: %w", err)
	}
	return nil
}

func (c *Client) connection() (*grpc.ClientConn, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.conn == nil {
		return nil, ErrNotConnected
	}
	return c.conn, nil
}

func (c *Client) namespaceService() (flov1.NamespaceServiceClient, error) {
	conn, err := c.connection()
	if err != nil {
		return nil, err
	}
	return flov1.NewNamespaceServiceClient(conn), nil
}

func (c *Client) actionService() (flov1.ActionServiceClient, error) {
	conn, err := c.connection()
	if err != nil {
		return nil, err
	}
	return flov1.NewActionServiceClient(conn), nil
}

func (c *Client) taskService() (flov1.TaskServiceClient, error) {
	conn, err := c.connection()
	if err != nil {
		return nil, err
	}
	return flov1.NewTaskServiceClient(conn), nil
}

func (c *Client) registryService() (flov1.WorkerRegistryServiceClient, error) {
	conn, err := c.connection()
	if err != nil {
		return nil, err
	}
	return flov1.NewWorkerRegistryServiceClient(conn), nil
}

func (c *Client) workerService() (flov1.WorkerServiceClient, error) {
	conn, err := c.connection()
	if err != nil {
		return nil, err
	}
	return flov1.NewWorkerServiceClient(conn), nil
}

// outgoing adds the token and the caller's trace context to the request metadata, so the
// gateway authenticates the call and the invocation's trace continues on the server without
// the application having to install gRPC instrumentation.
func (c *Client) outgoing(ctx context.Context) context.Context {
	md, _ := metadata.FromOutgoingContext(ctx)
	md = md.Copy()
	if c.token != "" {
		md.Set("authorization", "Bearer "+c.token)
	}
	otel.GetTextMapPropagator().Inject(ctx, metadataCarrier(md))
	return metadata.NewOutgoingContext(ctx, md)
}

func (c *Client) unaryInterceptor(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	return invoker(c.outgoing(ctx), method, req, reply, cc, opts...)
}

func (c *Client) streamInterceptor(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return streamer(c.outgoing(ctx), desc, cc, method, opts...)
}

// metadataCarrier lets the OpenTelemetry propagator write into gRPC metadata.
type metadataCarrier metadata.MD

// Get returns the first value of key.
func (m metadataCarrier) Get(key string) string {
	if v := metadata.MD(m).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

// Set replaces the values of key.
func (m metadataCarrier) Set(key, value string) { metadata.MD(m).Set(key, value) }

// Keys lists the keys present.
func (m metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}
