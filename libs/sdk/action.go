package flo

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// BackoffKind names a retry delay policy.
type BackoffKind string

// The retry delay policies an action can use. The delay before attempt n+1 is:
const (
	// BackoffConstant waits Initial every time.
	BackoffConstant BackoffKind = "constant"
	// BackoffLinear waits Initial*n, up to Max.
	BackoffLinear BackoffKind = "linear"
	// BackoffExponential waits Initial*Multiplier^(n-1), up to Max.
	BackoffExponential BackoffKind = "exponential"
	// BackoffExponentialJitter waits a random share of the exponential delay, which spreads
	// retries of tasks that failed together.
	BackoffExponentialJitter BackoffKind = "exponential_jitter"
	// BackoffCapped grows exponentially until Max and stays there.
	BackoffCapped BackoffKind = "capped"
)

var backoffKinds = map[BackoffKind]flov1.BackoffKind{
	"":                       flov1.BackoffKind_BACKOFF_KIND_UNSPECIFIED,
	BackoffConstant:          flov1.BackoffKind_BACKOFF_KIND_CONSTANT,
	BackoffLinear:            flov1.BackoffKind_BACKOFF_KIND_LINEAR,
	BackoffExponential:       flov1.BackoffKind_BACKOFF_KIND_EXPONENTIAL,
	BackoffExponentialJitter: flov1.BackoffKind_BACKOFF_KIND_EXPONENTIAL_JITTER,
	BackoffCapped:            flov1.BackoffKind_BACKOFF_KIND_CAPPED,
}

// ParseBackoffKind returns the kind named s, or an error naming the kinds that exist.
func ParseBackoffKind(s string) (BackoffKind, error) {
	k := BackoffKind(s)
	if _, ok := backoffKinds[k]; !ok || k == "" {
		return "", fmt.Errorf("unknown backoff kind %q (want constant, linear, exponential, exponential_jitter or capped)", s)
	}
	return k, nil
}

// Backoff is how long a failed task waits before its next attempt. Zero fields take the
// server's defaults.
type Backoff struct {
	Kind       BackoffKind
	Initial    time.Duration
	Max        time.Duration
	Multiplier float64
}

// MarshalJSON writes durations as Go duration strings ("1s"), which people read more easily
// than nanoseconds.
func (b Backoff) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Kind       BackoffKind `json:"kind,omitempty"`
		Initial    string      `json:"initial_delay"`
		Max        string      `json:"max_delay"`
		Multiplier float64     `json:"multiplier,omitempty"`
	}{b.Kind, b.Initial.String(), b.Max.String(), b.Multiplier})
}

func (b *Backoff) toProto() (*flov1.Backoff, error) {
	if b == nil {
		return nil, nil
	}
	kind, ok := backoffKinds[b.Kind]
	if !ok {
		_, err := ParseBackoffKind(string(b.Kind))
		return nil, err
	}
	return &flov1.Backoff{
		Kind:           kind,
		InitialDelayMs: b.Initial.Milliseconds(),
		MaxDelayMs:     b.Max.Milliseconds(),
		Multiplier:     b.Multiplier,
	}, nil
}

func backoffFromProto(b *flov1.Backoff) *Backoff {
	if b == nil {
		return nil
	}
	out := &Backoff{
		Initial:    time.Duration(b.GetInitialDelayMs()) * time.Millisecond,
		Max:        time.Duration(b.GetMaxDelayMs()) * time.Millisecond,
		Multiplier: b.GetMultiplier(),
	}
	for name, kind := range backoffKinds {
		if kind == b.GetKind() {
			out.Kind = name
		}
	}
	return out
}

// ActionOptions are an action's settings. Zero fields take the server's defaults: a 5 minute
// timeout, 3 attempts, exponential backoff from 1 s up to 5 min.
type ActionOptions struct {
	// Timeout bounds one attempt; it is also the lease a worker gets unless it asks otherwise.
	Timeout time.Duration
	// MaxAttempts is how many attempts a task gets before it is dead-lettered.
	MaxAttempts int
	// Backoff is the delay policy between attempts.
	Backoff *Backoff
}

// Action is a registered task type.
type Action struct {
	Namespace   string
	Name        string
	Timeout     time.Duration
	MaxAttempts int
	Backoff     *Backoff
	Enabled     bool
	CreatedAt   time.Time
	UpdatedAt   time.Time
}

// MarshalJSON writes the timeout as a Go duration string, like [Backoff.MarshalJSON].
func (a Action) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Namespace   string    `json:"namespace"`
		Name        string    `json:"name"`
		Timeout     string    `json:"timeout"`
		MaxAttempts int       `json:"max_attempts"`
		Backoff     *Backoff  `json:"backoff,omitempty"`
		Enabled     bool      `json:"enabled"`
		CreatedAt   time.Time `json:"created_at,omitzero"`
		UpdatedAt   time.Time `json:"updated_at,omitzero"`
	}{a.Namespace, a.Name, a.Timeout.String(), a.MaxAttempts, a.Backoff, a.Enabled, a.CreatedAt, a.UpdatedAt})
}

func actionFromProto(a *flov1.Action) *Action {
	return &Action{
		Namespace:   a.GetNamespace(),
		Name:        a.GetName(),
		Timeout:     time.Duration(a.GetTimeoutMs()) * time.Millisecond,
		MaxAttempts: int(a.GetMaxAttempts()),
		Backoff:     backoffFromProto(a.GetBackoff()),
		Enabled:     a.GetEnabled(),
		CreatedAt:   timeFromProto(a.GetCreatedAt()),
		UpdatedAt:   timeFromProto(a.GetUpdatedAt()),
	}
}

// RegisterAction creates the action name in the client's namespace, or updates its settings
// if it exists.
func (c *Client) RegisterAction(ctx context.Context, name string, opts ActionOptions) (*Action, error) {
	backoff, err := opts.Backoff.toProto()
	if err != nil {
		return nil, fmt.Errorf("register action %s: %w", name, err)
	}
	svc, err := c.actionService()
	if err != nil {
		return nil, err
	}
	a, err := svc.RegisterAction(ctx, &flov1.RegisterActionRequest{
		Namespace:   c.namespace,
		Name:        name,
		TimeoutMs:   opts.Timeout.Milliseconds(),
		MaxAttempts: int32(opts.MaxAttempts),
		Backoff:     backoff,
	})
	if err != nil {
		return nil, fmt.Errorf("register action %s: %w", name, err)
	}
	return actionFromProto(a), nil
}

// GetAction returns the action name.
func (c *Client) GetAction(ctx context.Context, name string) (*Action, error) {
	svc, err := c.actionService()
	if err != nil {
		return nil, err
	}
	a, err := svc.GetAction(ctx, &flov1.GetActionRequest{Namespace: c.namespace, Name: name})
	if err != nil {
		return nil, fmt.Errorf("get action %s: %w", name, err)
	}
	return actionFromProto(a), nil
}

// ListActions returns every action of the client's namespace.
func (c *Client) ListActions(ctx context.Context) ([]*Action, error) {
	svc, err := c.actionService()
	if err != nil {
		return nil, err
	}
	return listPages(0, func(size int32, token string) ([]*flov1.Action, string, error) {
		resp, err := svc.ListActions(ctx, &flov1.ListActionsRequest{Namespace: c.namespace, Limit: size, PageToken: token})
		if err != nil {
			return nil, "", fmt.Errorf("list actions: %w", err)
		}
		return resp.GetActions(), resp.GetNextPageToken(), nil
	}, actionFromProto)
}

// EnableAction turns a disabled action back on.
func (c *Client) EnableAction(ctx context.Context, name string) (*Action, error) {
	svc, err := c.actionService()
	if err != nil {
		return nil, err
	}
	a, err := svc.EnableAction(ctx, &flov1.GetActionRequest{Namespace: c.namespace, Name: name})
	if err != nil {
		return nil, fmt.Errorf("enable action %s: %w", name, err)
	}
	return actionFromProto(a), nil
}

// DisableAction turns the action off until [Client.EnableAction] turns it back on.
func (c *Client) DisableAction(ctx context.Context, name string) (*Action, error) {
	svc, err := c.actionService()
	if err != nil {
		return nil, err
	}
	a, err := svc.DisableAction(ctx, &flov1.GetActionRequest{Namespace: c.namespace, Name: name})
	if err != nil {
		return nil, fmt.Errorf("disable action %s: %w", name, err)
	}
	return actionFromProto(a), nil
}

func timeFromProto(ts *timestamppb.Timestamp) time.Time {
	if ts == nil {
		return time.Time{}
	}
	return ts.AsTime()
}
