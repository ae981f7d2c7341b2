package auth

import (
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

const (
	// maxLimiters bounds the limiter map; keys idle for limiterIdle are
	// pruned when it is full (a pruned key starts again with a full bucket,
	// which an idle key would have anyway).
	maxLimiters = 100_000
	limiterIdle = time.Minute
)

// limiter is a token bucket per key, with a rate per role and a burst of
// twice the rate.
type limiter struct {
	rates map[Role]float64
	now   func() time.Time

	mu   sync.Mutex
	keys map[string]*keyLimiter
	max  int // maxLimiters; smaller in tests
}

type keyLimiter struct {
	lim  *rate.Limiter
	last time.Time
}

func newLimiter(rates map[Role]float64, now func() time.Time) *limiter {
	return &limiter{rates: rates, now: now, keys: make(map[string]*keyLimiter), max: maxLimiters}
}

// allow takes one call from p's bucket. When the bucket is empty it returns
// false and how long until a call would be allowed.
func (l *limiter) allow(p Principal) (bool, time.Duration) {
	r := l.rates[p.Role]
	if r <= 0 {
		return true, 0
	}
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	k, ok := l.keys[p.KeyID]
	if !ok {
		if len(l.keys) >= l.max {
			l.prune(now)
		}
		burst := int(math.Max(1, math.Ceil(2*r)))
		k = &keyLimiter{lim: rate.NewLimiter(rate.Limit(r), burst)}
		l.keys[p.KeyID] = k
	}
	k.last = now
	res := k.lim.ReserveN(now, 1)
	if d := res.DelayFrom(now); d > 0 {
		res.CancelAt(now)
		return false, d
	}
	return true, 0
}

// prune drops limiters idle for limiterIdle, or when none is, an arbitrary
// tenth of them.
func (l *limiter) prune(now time.Time) {
	for id, k := range l.keys {
		if now.Sub(k.last) >= limiterIdle {
			delete(l.keys, id)
		}
	}
	for id := range l.keys {
		if len(l.keys) < l.max*9/10 {
			return
		}
		delete(l.keys, id)
	}
}

// retryAfterSeconds is d rounded up to whole seconds, at least 1, as the
// retry-after header and trailer carry it.
func retryAfterSeconds(d time.Duration) int {
	return max(1, int(math.Ceil(d.Seconds())))
}
