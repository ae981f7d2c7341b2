package flo

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"

	"go.opentelemetry.io/otel"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/razorbill/flo/proto/codec"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
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
	// tlsConfig, else caFile, else plaintext.
	tlsConfig *tls.Config
	caFile    string

	mu   sync.RWMutex
	conn *grpc.ClientConn
	// gather sends the connection's overlapping Invoke calls together.
	gather *invokeGatherer
}

// ClientOption configures a [Client].
type ClientOption func(*Client)

// WithNamespace sets the namespace every call of the client works in.
func WithNamespace(namespace string) ClientOption {
	return func(c *Client) { c.namespace = namespace }
}

// WithToken sets the API key (`flo_<id>_<secret>`, or the admin token) sent as a bearer token
// with every call. Without it the client takes the FLO_TOKEN environment variable.
func WithToken(token string) ClientOption {
	return func(c *Client) { c.token = token }
}

// WithCAFile turns on TLS, verifying the gateway's certificate against the PEM CA
// certificates in path (read by [Client.Connect]) and its name against addr's host. Without
// a TLS option the client takes FLO_CA_FILE.
func WithCAFile(path string) ClientOption {
	return func(c *Client) { c.caFile, c.tlsConfig = path, nil }
}

// WithTLS turns on TLS with cfg, for full control (client certificates, a server name other
// than addr's host, the system roots). It replaces [WithCAFile] and FLO_CA_FILE.
func WithTLS(cfg *tls.Config) ClientOption {
	return func(c *Client) { c.tlsConfig, c.caFile = cfg, "" }
}

// WithDialOptions adds gRPC dial options, applied after the defaults so they can replace them
// (for example grpc.WithTransportCredentials for TLS, or an OpenTelemetry stats handler).
func WithDialOptions(opts ...grpc.DialOption) ClientOption {
	return func(c *Client) { c.dialOpts = append(c.dialOpts, opts...) }
}

// NewClient returns a client for the gateway at addr (host:port). It does not connect: call
// [Client.Connect] before using it. Unless options say otherwise it sends the API key in the
// FLO_TOKEN environment variable and, when FLO_CA_FILE names a CA file, speaks TLS verified
// against it, so a program runs unchanged against a local stack and a secured one.
func NewClient(addr string, opts ...ClientOption) *Client {
	c := &Client{addr: addr, namespace: DefaultNamespace, token: os.Getenv("FLO_TOKEN"), caFile: os.Getenv("FLO_CA_FILE")}
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

// streamWindow and connWindow are the client's flow-control windows: as large
// as gRPC's probing grows them on a fast network, so nothing waits on them.
const (
	streamWindow = 4 << 20
	connWindow   = 16 << 20
)

// Connect prepares the gRPC connection. The connection itself is established lazily and
// re-established whenever it breaks, so Connect fails only on a malformed address or options.
// Calls that are safe to repeat (reads, enable/disable, drain, ack, cancel) are retried up to
// four times, within about 1.5 s, when the gateway answers UNAVAILABLE, and so are invocations
// and starts that carry an idempotency key; other invocations, appends, starts and signals are
// not, since the first attempt may have taken effect.
// Plaintext is the default, which suits a local gateway; [WithCAFile], FLO_CA_FILE or [WithTLS]
// turn on TLS, and Connect fails when the CA file cannot be read. Calling Connect on a
// connected client does nothing.
func (c *Client) Connect() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil {
		return nil
	}
	creds, err := c.transportCredentials()
	if err != nil {
		return err
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithChainUnaryInterceptor(c.unaryInterceptor),
		grpc.WithChainStreamInterceptor(c.streamInterceptor),
		// A task or record batch carries up to its count of payloads of up to
		// 1 MiB each; gRPC's default 4 MiB would break the stream on the first
		// batch of large payloads.
		// codec.Fast encodes and decodes without reflection; it is set on
		// this connection only, not registered for the whole process.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxReceiveBytes), grpc.ForceCodecV2(codec.Fast)),
		grpc.WithDefaultServiceConfig(serviceConfig()),
		// No service config from the resolver: ours is the one above. For a
		// host name (the README's localhost:9000) gRPC's DNS resolver would
		// otherwise look up the TXT record _grpc_config.<host> before the
		// connection gets its addresses, and /etc/hosts does not answer TXT,
		// so it goes to the nameserver. One that drops queries under load
		// (many clients starting at once) holds each lookup for the
		// resolver's 5 s timeout and retry: calls stalled in steps of 5 s,
		// up to 10 s, while the server sat idle.
		grpc.WithDisableServiceConfig(),
		// Fixed flow-control windows, which turns off gRPC's bandwidth
		// probing: it answered the first message after every quiet spell
		// (each heartbeat's answer, for an idle worker) with a ping the
		// gateway had to answer.
		grpc.WithInitialWindowSize(streamWindow),
		grpc.WithInitialConnWindowSize(connWindow),
	}
	opts = append(opts, c.dialOpts...)
	conn, err := grpc.NewClient(c.addr, opts...)
	if err != nil {
		return fmt.Errorf("flo: connect to %s: %w", c.addr, err)
	}
	c.conn = conn
	c.gather = &invokeGatherer{svc: flov1.NewTaskServiceClient(conn)}
	return nil
}

// transportCredentials is TLS when an option or FLO_CA_FILE asks for it, plaintext otherwise.
func (c *Client) transportCredentials() (credentials.TransportCredentials, error) {
	switch {
	case c.tlsConfig != nil:
		return credentials.NewTLS(c.tlsConfig.Clone()), nil
	case c.caFile != "":
		pem, err := os.ReadFile(c.caFile)
		if err != nil {
			return nil, fmt.Errorf("flo: read CA file: %w", err)
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("flo: CA file %s holds no PEM certificate", c.caFile)
		}
		return credentials.NewTLS(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}), nil
	}
	return insecure.NewCredentials(), nil
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
	c.conn, c.gather = nil, nil
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

func (c *Client) gatherer() (*invokeGatherer, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.gather == nil {
		return nil, ErrNotConnected
	}
	return c.gather, nil
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
