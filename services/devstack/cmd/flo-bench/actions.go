package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	flo "github.com/razorbill/flo-go"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// actionPayload is what each task carries: when it was invoked.
type actionPayload struct {
	InvokedAt int64 `json:"t"`
}

// benchActions invokes o.tasks tasks as fast as it can and, once they are
// all completed, prints tasks/s for the full cycle and the invoke-to-start
// latency; then it invokes at half that rate (or o.rate) for o.halfLoadFor
// and prints the latency again. With o.sustain it runs benchSustained.
func benchActions(ctx context.Context, p *platform, o options) error {
	if o.sustain > 0 {
		return benchSustained(ctx, p, o)
	}
	var lat latencies
	err := p.serveActions(ctx, o, map[string]actionHandler{
		"bench": func(actx *flo.ActionContext) ([]byte, error) {
			var pl actionPayload
			if err := actx.Into(&pl); err != nil {
				return nil, flo.NewNonRetryableErrorf("bad payload: %v", err)
			}
			lat.add(time.Since(time.Unix(0, pl.InvokedAt)))
			return nil, nil
		},
	})
	if err != nil {
		return err
	}

	db, err := p.openDB(ctx)
	if err != nil {
		return err
	}

	inv, err := p.newInvoker(o)
	if err != nil {
		return err
	}
	fmt.Printf("full load: %d tasks, %d invokers (%s), %d workers x %d slots, fsync=%v\n",
		o.tasks, o.invokers, inv.mode, o.workers, o.concurrency, o.fsync)
	stopProfile, err := profile(o.cpuProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	start := time.Now()
	err = chunks(o.invokers, o.tasks, inv.per, func(lo, hi int) error {
		return inv.invoke(ctx, hi-lo)
	})
	if err != nil {
		return err
	}
	invoked := time.Since(start)
	if err := waitCompleted(ctx, db, o.tasks, start); err != nil {
		return err
	}
	elapsed := time.Since(start)
	rate := perSecond(o.tasks, elapsed)
	p50, p99, _ := lat.percentiles()
	fmt.Printf("  invoked in %v (%.0f invokes/s); all completed in %v\n", invoked.Round(time.Millisecond),
		perSecond(o.tasks, invoked), elapsed.Round(time.Millisecond))
	fmt.Printf("  throughput %.0f tasks/s; invoke-to-start p50 %v p99 %v\n", rate, p50, p99)

	if o.halfLoadFor <= 0 {
		return nil
	}
	half, phase := rate/2, "half load"
	if o.rate > 0 {
		half, phase = o.rate, "paced load"
	}
	fmt.Printf("%s: %.0f tasks/s for %v\n", phase, half, o.halfLoadFor)
	lat.reset()
	n, err := paced(ctx, inv, half, o.halfLoadFor, o.invokers)
	if err != nil {
		return err
	}
	if err := waitCompleted(ctx, db, o.tasks+n, start); err != nil {
		return err
	}
	p50, p99, got := lat.percentiles()
	fmt.Printf("  %d tasks; invoke-to-start p50 %v p99 %v\n", got, p50, p99)
	return nil
}

// invoker creates tasks of the bench action the way the options say: n at a
// time through InvokeMany (-batch), one at a time through the SDK's Invoke,
// which sends overlapping calls together, or one InvokeTask RPC per task
// (-rpc), as a client without the Go SDK does.
type invoker struct {
	// mode names the way, for the printed header.
	mode string
	// per is how many tasks one call creates: n of invoke is at most per.
	per    int
	invoke func(ctx context.Context, n int) error
}

// stamped is one task's payload, stamped with the time now, encoded.
func stamped() ([]byte, error) {
	body, err := json.Marshal(actionPayload{InvokedAt: time.Now().UnixNano()})
	if err != nil {
		return nil, fmt.Errorf("encode payload: %w", err)
	}
	return body, nil
}

// newInvoker returns the invoker o asks for.
func (p *platform) newInvoker(o options) (*invoker, error) {
	switch {
	case o.batch > 0:
		return &invoker{mode: fmt.Sprintf("InvokeMany of %d", o.batch), per: o.batch, invoke: func(ctx context.Context, n int) error {
			payloads := make([]any, n)
			for i := range payloads {
				payloads[i] = actionPayload{InvokedAt: time.Now().UnixNano()}
			}
			if _, err := p.client.InvokeMany(ctx, "bench", payloads); err != nil {
				return fmt.Errorf("invoke many: %w", err)
			}
			return nil
		}}, nil
	case o.rpc:
		conn, err := grpc.NewClient(p.stack.GatewayGRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, fmt.Errorf("connect: %w", err)
		}
		p.cleanup = append(p.cleanup, func() { conn.Close() })
		tasks := flov1.NewTaskServiceClient(conn)
		auth := metadata.Pairs("authorization", "Bearer "+p.token)
		return &invoker{mode: "one InvokeTask RPC per task", per: 1, invoke: func(ctx context.Context, _ int) error {
			body, err := stamped()
			if err != nil {
				return err
			}
			req := &flov1.InvokeTaskRequest{Namespace: namespace, Action: "bench", Payload: body}
			if _, err := tasks.InvokeTask(metadata.NewOutgoingContext(ctx, auth), req); err != nil {
				return fmt.Errorf("invoke task: %w", err)
			}
			return nil
		}}, nil
	}
	return &invoker{mode: "unary Invoke", per: 1, invoke: func(ctx context.Context, _ int) error {
		body, err := stamped()
		if err != nil {
			return err
		}
		if _, err := p.client.Invoke(ctx, "bench", body); err != nil {
			return fmt.Errorf("invoke: %w", err)
		}
		return nil
	}}, nil
}

// paced invokes at a fixed rate for d, spreading the ticks over workers so a
// slow invoke does not delay the next one. Each tick is one call of inv, of
// inv.per tasks, and ticks come inv.per times less often than tasks.
func paced(ctx context.Context, inv *invoker, rate float64, d time.Duration, invokers int) (int, error) {
	per := inv.per
	interval := time.Duration(float64(time.Second) * float64(per) / rate)
	ticks := make(chan struct{}, invokers)
	var g errgroup.Group
	for range invokers {
		g.Go(func() error {
			for range ticks {
				if err := inv.invoke(ctx, per); err != nil {
					return err
				}
			}
			return nil
		})
	}
	n := 0
	deadline := time.Now().Add(d)
	next := time.Now()
	for time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(time.Until(next))
		ticks <- struct{}{}
		n += per
		next = next.Add(interval)
	}
	close(ticks)
	return n, g.Wait()
}

// waitCompleted waits until want tasks are completed, counting them in the
// task table.
func waitCompleted(ctx context.Context, db *pgx.Conn, want int, start time.Time) error {
	return waitState(ctx, db, "completed", want, start)
}

// waitState waits until want tasks are in state, counting them in the task
// table.
func waitState(ctx context.Context, db *pgx.Conn, state string, want int, start time.Time) error {
	return waitFor(ctx, start, state, func() (int, int, error) {
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM dispatcher.tasks WHERE state = $1`, state).Scan(&n); err != nil {
			return 0, 0, fmt.Errorf("count %s tasks: %w", state, err)
		}
		return n, want, nil
	})
}
