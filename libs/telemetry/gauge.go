package telemetry

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"
)

// GaugeMaxAge is how long the services reuse what a gauge's query returned:
// scrapes more frequent than this cost no extra query.
const GaugeMaxAge = 5 * time.Second

// loadTimeout bounds one load of a gauge's values, well inside a scrape's
// timeout.
const loadTimeout = 3 * time.Second

// DurationBuckets are the histogram bucket bounds, in seconds, of the
// services' latency histograms: from a millisecond (a claim answered from a
// warm queue) to five minutes (a task that waited out a backlog). The SDK's
// default bounds are meant for milliseconds and would put every sub-second
// latency in one bucket.
var DurationBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}

// Gauges are observable instruments fed from one read (a grouped query, an
// offsets request) that is reused for a max age, so a collection costs at
// most one read per max age however often /metrics is scraped and however
// many instruments share the read.
type Gauges struct {
	meter       metric.Meter
	callback    metric.Callback
	instruments []metric.Observable
}

// NewGauges returns Gauges whose callback hands observe what load returned,
// loading again when that is older than maxAge. A failed load is reused like
// a value (a database that is down is not asked on every scrape) and reports
// nothing.
func NewGauges[T any](meter metric.Meter, maxAge time.Duration, load func(context.Context) (T, error), observe func(T, metric.Observer), instruments ...metric.Observable) *Gauges {
	s := &snapshot[T]{load: load, maxAge: maxAge, now: time.Now}
	return &Gauges{
		meter: meter,
		callback: func(ctx context.Context, o metric.Observer) error {
			v, err := s.get(ctx)
			if err != nil {
				return err
			}
			observe(v, o)
			return nil
		},
		instruments: instruments,
	}
}

// Register starts reporting the gauges; unregister the result to stop.
func (g *Gauges) Register() (metric.Registration, error) {
	reg, err := g.meter.RegisterCallback(g.callback, g.instruments...)
	if err != nil {
		return nil, fmt.Errorf("register metrics callback: %w", err)
	}
	return reg, nil
}

// Run reports the gauges until ctx ends. Run it as a component of the
// service whose state they read: a stopped service's gauges leave /metrics
// with it, and nothing reads from its closed pool.
func (g *Gauges) Run(ctx context.Context) error {
	reg, err := g.Register()
	if err != nil {
		return err
	}
	<-ctx.Done()
	if err := reg.Unregister(); err != nil {
		return fmt.Errorf("unregister metrics callback: %w", err)
	}
	return nil
}

// snapshot is a value loaded at most once per maxAge; concurrent callers
// wait for one load.
type snapshot[T any] struct {
	load   func(context.Context) (T, error)
	maxAge time.Duration
	now    func() time.Time

	mu     sync.Mutex
	loaded bool
	at     time.Time
	val    T
	err    error
}

func (s *snapshot[T]) get(ctx context.Context) (T, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.loaded && s.now().Sub(s.at) < s.maxAge {
		return s.val, s.err
	}
	ctx, cancel := context.WithTimeout(ctx, loadTimeout)
	defer cancel()
	s.val, s.err = s.load(ctx)
	s.loaded, s.at = true, s.now()
	return s.val, s.err
}
