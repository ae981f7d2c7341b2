package backoff_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/backoff"
)

func TestDelay(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		policy  backoff.Policy
		attempt int
		want    time.Duration
	}{
		{"constant first", backoff.Policy{Kind: backoff.Constant, Initial: time.Second, Max: time.Minute}, 1, time.Second},
		{"constant later", backoff.Policy{Kind: backoff.Constant, Initial: time.Second, Max: time.Minute}, 7, time.Second},
		{"linear first", backoff.Policy{Kind: backoff.Linear, Initial: time.Second, Max: time.Minute}, 1, time.Second},
		{"linear third", backoff.Policy{Kind: backoff.Linear, Initial: time.Second, Max: time.Minute}, 3, 3 * time.Second},
		{"linear capped", backoff.Policy{Kind: backoff.Linear, Initial: time.Second, Max: 5 * time.Second}, 9, 5 * time.Second},
		{"exponential first", backoff.Policy{Kind: backoff.Exponential, Initial: time.Second, Max: time.Minute, Multiplier: 2}, 1, time.Second},
		{"exponential fourth", backoff.Policy{Kind: backoff.Exponential, Initial: time.Second, Max: time.Minute, Multiplier: 2}, 4, 8 * time.Second},
		{"exponential multiplier 3", backoff.Policy{Kind: backoff.Exponential, Initial: 100 * time.Millisecond, Max: time.Minute, Multiplier: 3}, 3, 900 * time.Millisecond},
		{"exponential capped", backoff.Policy{Kind: backoff.Exponential, Initial: time.Second, Max: 10 * time.Second, Multiplier: 2}, 5, 10 * time.Second},
		{"exponential huge attempt", backoff.Policy{Kind: backoff.Exponential, Initial: time.Second, Max: time.Hour, Multiplier: 2}, 100000, time.Hour},
		{"capped below cap", backoff.Policy{Kind: backoff.Capped, Initial: time.Second, Max: 10 * time.Second, Multiplier: 2}, 3, 4 * time.Second},
		{"capped at cap", backoff.Policy{Kind: backoff.Capped, Initial: time.Second, Max: 10 * time.Second, Multiplier: 2}, 30, 10 * time.Second},
		{"attempt zero counts as one", backoff.Policy{Kind: backoff.Linear, Initial: time.Second, Max: time.Minute}, 0, time.Second},
		{"zero initial", backoff.Policy{Kind: backoff.Exponential, Initial: 0, Max: time.Minute, Multiplier: 2}, 5, 0},
		{"default second attempt", backoff.Default(), 2, 2 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, tt.policy.Delay(tt.attempt))
		})
	}
}

func TestDelayJitterStaysWithinExponential(t *testing.T) {
	t.Parallel()
	p := backoff.Policy{Kind: backoff.ExponentialJitter, Initial: time.Second, Max: 20 * time.Second, Multiplier: 2}
	tests := []struct {
		name    string
		attempt int
		ceiling time.Duration
	}{
		{"first", 1, time.Second},
		{"third", 3, 4 * time.Second},
		{"capped", 10, 20 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			seen := map[time.Duration]bool{}
			for range 200 {
				d := p.Delay(tt.attempt)
				require.GreaterOrEqual(t, d, time.Duration(0))
				require.LessOrEqual(t, d, tt.ceiling)
				seen[d] = true
			}
			require.Greater(t, len(seen), 1, "jitter must vary the delay")
		})
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		policy    backoff.Policy
		wantField string
	}{
		{"default is valid", backoff.Default(), ""},
		{"constant ignores multiplier", backoff.Policy{Kind: backoff.Constant, Initial: time.Second, Max: time.Second}, ""},
		{"linear ignores multiplier", backoff.Policy{Kind: backoff.Linear, Max: time.Second, Multiplier: 0.1}, ""},
		{"unknown kind", backoff.Policy{Kind: "fibonacci", Max: time.Second, Multiplier: 2}, "kind"},
		{"empty kind", backoff.Policy{Max: time.Second, Multiplier: 2}, "kind"},
		{"negative initial", backoff.Policy{Kind: backoff.Exponential, Initial: -1, Max: time.Second, Multiplier: 2}, "initial_delay_ms"},
		{"max below initial", backoff.Policy{Kind: backoff.Exponential, Initial: time.Minute, Max: time.Second, Multiplier: 2}, "max_delay_ms"},
		{"multiplier below one", backoff.Policy{Kind: backoff.Exponential, Initial: time.Second, Max: time.Minute, Multiplier: 0.5}, "multiplier"},
		{"jitter multiplier below one", backoff.Policy{Kind: backoff.ExponentialJitter, Max: time.Minute, Multiplier: 0.9}, "multiplier"},
		{"capped multiplier infinite", backoff.Policy{Kind: backoff.Capped, Max: time.Minute, Multiplier: math.Inf(1)}, "multiplier"},
		{"step jitter is valid", backoff.Policy{Kind: backoff.ExponentialJitter, Max: time.Minute, Multiplier: 2, JitterFraction: backoff.StepJitter}, ""},
		{"jitter above one", backoff.Policy{Kind: backoff.ExponentialJitter, Max: time.Minute, Multiplier: 2, JitterFraction: 1.5}, "jitter"},
		{"jitter negative", backoff.Policy{Kind: backoff.ExponentialJitter, Max: time.Minute, Multiplier: 2, JitterFraction: -0.1}, "jitter"},
		{"jitter NaN", backoff.Policy{Kind: backoff.ExponentialJitter, Max: time.Minute, Multiplier: 2, JitterFraction: math.NaN()}, "jitter"},
		{"within set", backoff.Policy{Kind: backoff.Constant, Max: time.Minute, Within: time.Hour}, ""},
		{"within negative", backoff.Policy{Kind: backoff.Constant, Max: time.Minute, Within: -time.Second}, "within_ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.policy.Validate()
			if tt.wantField == "" {
				require.NoError(t, err)
				return
			}
			var fe *backoff.FieldError
			require.ErrorAs(t, err, &fe)
			require.Equal(t, tt.wantField, fe.Field)
		})
	}
}

func TestWithDefaults(t *testing.T) {
	t.Parallel()
	got := backoff.Policy{Initial: 500 * time.Millisecond}.WithDefaults()
	require.Equal(t, backoff.Policy{Kind: backoff.Exponential, Initial: 500 * time.Millisecond, Max: backoff.DefaultMax, Multiplier: 2}, got)
	kept := backoff.Policy{Kind: backoff.Linear, Initial: time.Second, Max: time.Minute, Multiplier: 3}
	require.Equal(t, kept, kept.WithDefaults())
}

// TestReferenceFormulas checks each strategy against the workflow language's
// table, where the retry number n counts from zero (attempt = n + 1):
// constant initial, linear initial×(n+1), exponential initial×2^n capped at
// max_delay_ms.
func TestReferenceFormulas(t *testing.T) {
	t.Parallel()
	initial := 500 * time.Millisecond
	maxDelay := 30 * time.Second
	tests := []struct {
		name string
		kind backoff.Kind
		want []time.Duration // delays before retries n = 0, 1, 2, ...
	}{
		{"constant", backoff.Constant, []time.Duration{500 * time.Millisecond, 500 * time.Millisecond, 500 * time.Millisecond, 500 * time.Millisecond}},
		{"linear", backoff.Linear, []time.Duration{500 * time.Millisecond, time.Second, 1500 * time.Millisecond, 2 * time.Second}},
		{"exponential", backoff.Exponential, []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := backoff.Policy{Kind: tt.kind, Initial: initial, Max: maxDelay, Multiplier: 2}
			for n, want := range tt.want {
				require.Equal(t, want, p.Delay(n+1), "retry %d", n)
			}
		})
	}
}

func TestDelayStepJitterAddsUpToAQuarter(t *testing.T) {
	t.Parallel()
	p := backoff.Policy{Kind: backoff.ExponentialJitter, Initial: time.Second, Max: time.Minute, Multiplier: 2, JitterFraction: backoff.StepJitter}
	tests := []struct {
		name    string
		attempt int
		base    time.Duration
		ceiling time.Duration
	}{
		{"first", 1, time.Second, 1250 * time.Millisecond},
		{"third", 3, 4 * time.Second, 5 * time.Second},
		{"at cap stays at cap", 20, time.Minute, time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			seen := map[time.Duration]bool{}
			for range 200 {
				d := p.Delay(tt.attempt)
				require.GreaterOrEqual(t, d, tt.base)
				require.LessOrEqual(t, d, tt.ceiling)
				seen[d] = true
			}
			if tt.base != tt.ceiling {
				require.Greater(t, len(seen), 1, "jitter must vary the delay")
			}
		})
	}
}

func TestNextWithinBudget(t *testing.T) {
	t.Parallel()
	p := backoff.Policy{Kind: backoff.Exponential, Initial: time.Second, Max: time.Minute, Multiplier: 2, Within: 10 * time.Second}
	tests := []struct {
		name      string
		attempt   int
		elapsed   time.Duration
		wantDelay time.Duration
		wantOK    bool
	}{
		{"first retry inside budget", 1, 0, time.Second, true},
		{"retry ending exactly at budget", 3, 6 * time.Second, 4 * time.Second, true},
		{"retry would start after budget", 3, 6*time.Second + time.Millisecond, 0, false},
		{"budget already spent", 1, 11 * time.Second, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d, ok := p.Next(tt.attempt, tt.elapsed)
			require.Equal(t, tt.wantOK, ok)
			require.Equal(t, tt.wantDelay, d)
		})
	}
}

func TestNextWithoutBudgetAlwaysAllows(t *testing.T) {
	t.Parallel()
	p := backoff.Policy{Kind: backoff.Constant, Initial: time.Second, Max: time.Second}
	d, ok := p.Next(1000, 365*24*time.Hour)
	require.True(t, ok)
	require.Equal(t, time.Second, d)
}

func TestDelayWithDraw(t *testing.T) {
	t.Parallel()
	full := backoff.Policy{Kind: backoff.ExponentialJitter, Initial: time.Second, Max: time.Minute, Multiplier: 2}
	step := full
	step.JitterFraction = backoff.StepJitter
	tests := []struct {
		name    string
		policy  backoff.Policy
		attempt int
		draw    float64
		want    time.Duration
	}{
		{"full jitter no draw", full, 3, 0, 0},
		{"full jitter half", full, 3, 0.5, 2 * time.Second},
		{"full jitter draw above one is clamped", full, 3, 7, 4 * time.Second},
		{"step jitter no draw", step, 3, 0, 4 * time.Second},
		{"step jitter full draw", step, 3, 1, 5 * time.Second},
		{"step jitter half draw", step, 2, 0.5, 2250 * time.Millisecond},
		{"step jitter negative draw is clamped", step, 2, -1, 2 * time.Second},
		{"draw ignored by exponential", backoff.Policy{Kind: backoff.Exponential, Initial: time.Second, Max: time.Minute, Multiplier: 2}, 3, 0.9, 4 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, tt.policy.DelayWithDraw(tt.attempt, tt.draw))
		})
	}
}

func TestNextWithDrawCountsJitterAgainstBudget(t *testing.T) {
	t.Parallel()
	p := backoff.Policy{Kind: backoff.ExponentialJitter, Initial: 4 * time.Second, Max: time.Minute, Multiplier: 2, JitterFraction: backoff.StepJitter, Within: 10 * time.Second}
	d, ok := p.NextWithDraw(1, 6*time.Second, 0)
	require.True(t, ok)
	require.Equal(t, 4*time.Second, d)
	_, ok = p.NextWithDraw(1, 6*time.Second, 1) // 5 s of delay ends past the 10 s budget
	require.False(t, ok)
}
