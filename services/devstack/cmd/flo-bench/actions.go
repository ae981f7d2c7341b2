package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"

	flo "github.com/razorbill/flo-go"
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
	client := p.client
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

	db, err := pgx.Connect(ctx, p.stack.DatabaseURL())
	if err != nil {
		return fmt.Errorf("connect to postgres: %w", err)
	}
	defer db.Close(ctx)

	mode := "unary Invoke"
	if o.batch > 0 {
		mode = fmt.Sprintf("InvokeMany of %d", o.batch)
	}
	fmt.Printf("full load: %d tasks, %d invokers (%s), %d workers x %d slots, fsync=%v\n",
		o.tasks, o.invokers, mode, o.workers, o.concurrency, o.fsync)
	stopProfile, err := profile(o.cpuProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	start := time.Now()
	err = chunks(o.invokers, o.tasks, max(o.batch, 1), func(lo, hi int) error {
		return invoke(ctx, client, o.batch, hi-lo)
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
	n, err := paced(ctx, client, half, o.halfLoadFor, o.invokers, o.batch)
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

// invoke creates n tasks stamped with the time now: one unary Invoke when
// batch is 0, else one InvokeMany call.
func invoke(ctx context.Context, client *flo.Client, batch, n int) error {
	if batch == 0 {
		body, err := json.Marshal(actionPayload{InvokedAt: time.Now().UnixNano()})
		if err != nil {
			return fmt.Errorf("encode payload: %w", err)
		}
		if _, err := client.Invoke(ctx, "bench", body); err != nil {
			return fmt.Errorf("invoke: %w", err)
		}
		return nil
	}
	payloads := make([]any, n)
	for i := range payloads {
		payloads[i] = actionPayload{InvokedAt: time.Now().UnixNano()}
	}
	if _, err := client.InvokeMany(ctx, "bench", payloads); err != nil {
		return fmt.Errorf("invoke many: %w", err)
	}
	return nil
}

// paced invokes at a fixed rate for d, spreading the ticks over workers so a
// slow invoke does not delay the next one. With batch > 0 each tick invokes
// a batch, and ticks come batch times less often.
func paced(ctx context.Context, client *flo.Client, rate float64, d time.Duration, invokers, batch int) (int, error) {
	per := max(batch, 1)
	interval := time.Duration(float64(time.Second) * float64(per) / rate)
	ticks := make(chan struct{}, invokers)
	var g errgroup.Group
	for range invokers {
		g.Go(func() error {
			for range ticks {
				if err := invoke(ctx, client, batch, per); err != nil {
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
	return waitFor(ctx, start, "completed", func() (int, int, error) {
		var done int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM dispatcher.tasks WHERE state = 'completed'`).Scan(&done); err != nil {
			return 0, 0, fmt.Errorf("count completed tasks: %w", err)
		}
		return done, want, nil
	})
}
