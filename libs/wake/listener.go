package wake

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/razorbill/flo/libs/retry"
)

// Listener holds one dedicated Postgres connection that LISTENs on channels
// and hands each notification's payload to that channel's handler. It
// reconnects on failure and then calls OnReconnect, because notifications
// sent while it was away are gone.
type Listener struct {
	connect     func(ctx context.Context) (*pgx.Conn, error)
	handlers    map[string]func(payload string)
	onReconnect func()
	log         *slog.Logger
}

// NewListener returns a Listener; connect opens its connection, handlers maps
// channel names to handlers, and onReconnect runs after every reconnection.
func NewListener(connect func(ctx context.Context) (*pgx.Conn, error), handlers map[string]func(payload string), onReconnect func(), log *slog.Logger) *Listener {
	return &Listener{connect: connect, handlers: handlers, onReconnect: onReconnect, log: log}
}

// Run listens until ctx ends.
func (l *Listener) Run(ctx context.Context) error {
	b := reconnectRetry.Backoff()
	for first := true; ; first = false {
		started := time.Now()
		err := l.listen(ctx, !first)
		if ctx.Err() != nil {
			return nil
		}
		// A connection that held for a while was a success: the next
		// loss starts the delays over.
		if time.Since(started) > time.Minute {
			b.Reset()
		}
		delay := b.NextBackOff()
		l.log.WarnContext(ctx, "notification listener lost its connection", "error", err, "retry_in", delay)
		if !retry.Sleep(ctx, delay) {
			return nil
		}
	}
}

// reconnectRetry is how Run waits between connections.
var reconnectRetry = retry.Policy{Initial: 100 * time.Millisecond, Max: 5 * time.Second}

func (l *Listener) listen(ctx context.Context, reconnected bool) error {
	conn, err := l.connect(ctx)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for ch := range l.handlers {
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			return fmt.Errorf("listen %s: %w", ch, err)
		}
	}
	if reconnected && l.onReconnect != nil {
		l.onReconnect()
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return fmt.Errorf("wait for notification: %w", err)
		}
		if h := l.handlers[n.Channel]; h != nil {
			h(n.Payload)
		}
	}
}
