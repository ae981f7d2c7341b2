package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/kafka"
)

// A real consumer group dead-letters a record it cannot handle yet; the CLI
// lists it from the broker FLO_KAFKA_BROKERS names, and once the cause is
// fixed replays it, after which the consumer handles it once and list shows
// the replay. Not parallel: it sets FLO_KAFKA_BROKERS.
func TestDLQListAndReplay(t *testing.T) {
	broker := harness.NewBroker(t)
	producer, err := kafka.NewClient(broker.Kafka())
	require.NoError(t, err)
	t.Cleanup(producer.Close)
	require.NoError(t, kafka.EnsureTopics(t.Context(), producer, 1, "orders"))

	var (
		mu      sync.Mutex
		open    = map[string]bool{"acct-1": true}
		handled = map[string]int{}
	)
	consumer, err := kafka.NewConsumer(broker.Kafka(), "billing", []string{"orders"}, func(_ context.Context, rs []*kgo.Record) error {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range rs {
			if !open[string(r.Key)] {
				return errors.New("account " + string(r.Key) + " is closed")
			}
		}
		for _, r := range rs {
			handled[string(r.Value)]++
		}
		return nil
	}, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- consumer.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	require.NoError(t, producer.ProduceSync(t.Context(),
		&kgo.Record{Topic: "orders", Key: []byte("acct-1"), Value: []byte(`{"order":1}`)},
		&kgo.Record{Topic: "orders", Key: []byte("acct-2"), Value: []byte(`{"order":2}`)}).FirstErr())
	harness.WaitDeadLetter(t, broker.Addrs(), "orders", func(*kafka.DeadLetter) bool { return true })

	t.Setenv("FLO_KAFKA_BROKERS", strings.Join(broker.Addrs(), ","))
	code, stdout, stderr := runCLI(t, "dlq", "list", "orders.dlq")
	require.Zero(t, code, stderr)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	require.Len(t, lines, 2)
	require.Regexp(t, `^OFFSET\s+SOURCE\s+GROUP\s+REPLAYED\s+KEY\s+ERROR\s+VALUE$`, lines[0])
	require.Regexp(t, `^0\s+orders/0@1\s+billing\s+-\s+"acct-2"\s+account acct-2 is closed\s+"\{\\"order\\":2\}"$`, lines[1])

	code, stdout, stderr = runCLI(t, "dlq", "list", "orders.dlq", "--json")
	require.Zero(t, code, stderr)
	var listed []deadLetterView
	require.NoError(t, json.Unmarshal([]byte(stdout), &listed))
	require.Len(t, listed, 1)
	require.Equal(t, deadLetterView{
		Offset: 0, DeadAt: listed[0].DeadAt, SourceTopic: "orders", SourcePartition: 0, SourceOffset: 1, Group: "billing",
		Error: "account acct-2 is closed", Key: "acct-2", Value: []byte(`{"order":2}`),
	}, listed[0])

	// The cause is fixed; the record goes back once.
	mu.Lock()
	open["acct-2"] = true
	mu.Unlock()
	code, stdout, stderr = runCLI(t, "dlq", "replay", "orders.dlq", "--offset", "0")
	require.Zero(t, code, stderr)
	require.JSONEq(t, `{"replayed":[{"offset":0,"topic":"orders","key":"acct-2"}]}`, stdout)
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return handled[`{"order":2}`] == 1 }, 20*time.Second, 10*time.Millisecond)

	code, _, stderr = runCLI(t, "dlq", "replay", "orders.dlq", "--offset", "0")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "was replayed at", "replaying twice by mistake is refused")
	code, stdout, stderr = runCLI(t, "dlq", "list", "orders.dlq", "--brokers", strings.Join(broker.Addrs(), ","))
	require.Zero(t, code, stderr)
	require.Regexp(t, `\sbilling\s+\d{4}-\d\d-\d\dT[0-9:]+Z\s`, stdout, "list shows the replay")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, map[string]int{`{"order":1}`: 1, `{"order":2}`: 1}, handled)
}

func TestDLQArguments(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"replay picks nothing", []string{"dlq", "replay", "orders.dlq", "--brokers", "127.0.0.1:1"}, "at least one of the flags in the group [offset all] is required"},
		{"replay picks twice", []string{"dlq", "replay", "orders.dlq", "--all", "--offset", "1", "--brokers", "127.0.0.1:1"}, "none of the others can be"},
		{"not a dead-letter topic", []string{"dlq", "list", "orders", "--brokers", "127.0.0.1:1"}, "orders is not a dead-letter topic"},
		{"bad limit", []string{"dlq", "list", "orders.dlq", "--limit", "0", "--brokers", "127.0.0.1:1"}, "--limit must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, _, stderr := runCLI(t, tc.args...)
			require.Equal(t, 1, code)
			require.Contains(t, stderr, tc.wantErr)
		})
	}
}
