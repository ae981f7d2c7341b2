package backoff_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/services/dispatcher/internal/backoff"
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
