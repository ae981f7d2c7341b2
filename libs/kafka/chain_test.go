package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/libs/telemetry/telemetrytest"
)

const (
	waitFor = 20 * time.Second
	tick    = 10 * time.Millisecond
)

// produceRecords writes records, one key so they share a partition, each
// with a header of its own.
func produceRecords(t *testing.T, cl *kgo.Client, topic string, values ...string) {
	t.Helper()
	rs := make([]*kgo.Record, len(values))
	for i, v := range values {
		rs[i] = &kgo.Record{Topic: topic, Key: []byte("key-" + v), Value: []byte(v),
			Headers: []kgo.RecordHeader{{Key: "origin", Value: []byte("test-" + v)}}}
	}
	require.NoError(t, cl.ProduceSync(t.Context(), rs...).FirstErr())
}

// deadLetters waits until topic's dead-letter topic holds n records and
// returns them.
func deadLetters(t *testing.T, brokers []string, topic string, n int) []*kafka.DeadLetter {
	t.Helper()
	var got []*kafka.DeadLetter
	require.Eventually(t, func() bool {
		var err error
		got, err = kafka.ReadDeadLetters(t.Context(), config.Kafka{Brokers: brokers}, kafka.DeadLetterTopic(topic))
		return err == nil && len(got) >= n
	}, waitFor, tick)
	require.Len(t, got, n)
	return got
}

// requireNoDeadLetterTopic checks that nothing was dead-lettered from topic.
func requireNoDeadLetterTopic(t *testing.T, brokers []string, topic string) {
	t.Helper()
	_, err := kafka.ReadDeadLetters(t.Context(), config.Kafka{Brokers: brokers}, kafka.DeadLetterTopic(topic))
	require.ErrorContains(t, err, "does not exist")
}

// requireCommittedToEnd checks that group committed every partition of topic
// up to its end.
func requireCommittedToEnd(t *testing.T, cl *kgo.Client, group, topic string) {
	t.Helper()
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(t.Context(), topic)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		committed, err := adm.FetchOffsets(t.Context(), group)
		if err != nil {
			return false
		}
		ok := true
		ends.Each(func(o kadm.ListedOffset) {
			got, _ := committed.Lookup(topic, o.Partition)
			ok = ok && got.At == o.Offset
		})
		return ok
	}, waitFor, tick)
}

// storing is a handler that, like a shared transaction, fails a whole batch
// when one record of it is bad, and panics on "panic".
type storing struct {
	collector
	isolated []bool
}

func (s *storing) handle(ctx context.Context, rs []*kgo.Record) error {
	s.mu.Lock()
	s.isolated = append(s.isolated, kafka.Isolated(ctx))
	s.mu.Unlock()
	for _, r := range rs {
		switch string(r.Value) {
		case "panic":
			panic("handler bug")
		case "bad":
			return errors.New("cannot store bad")
		}
	}
	return s.collector.handle(ctx, rs)
}

// Not parallel: the consumer counts through the global meter provider,
// which this test replaces while it runs.
func TestConsumerDeadLettersWhatFailsAlone(t *testing.T) {
	metrics := telemetrytest.Global(t)
	broker := harness.NewBroker(t)
	prod := newProducer(t, broker.Addrs())
	require.NoError(t, kafka.EnsureTopics(t.Context(), prod, 1, "orders"))
	produceRecords(t, prod, "orders", "a", "b", "bad", "c", "panic", "d")

	h := &storing{}
	c, err := kafka.NewConsumer(broker.Kafka(), "shop", []string{"orders"}, h.handle, quiet)
	require.NoError(t, err)
	run(t, c.Run)

	letters := deadLetters(t, broker.Addrs(), "orders", 2)
	require.Eventually(t, func() bool { return len(h.got()) == 4 }, waitFor, tick)
	require.Equal(t, []string{"a", "b", "c", "d"}, h.got(), "the good records once each, in order")
	h.mu.Lock()
	require.False(t, h.isolated[0], "the first try is the batch as polled")
	require.True(t, h.isolated[len(h.isolated)-1], "the retries run isolated")
	h.mu.Unlock()

	bad, panicked := letters[0], letters[1]
	require.Equal(t, "bad", string(bad.Value))
	require.Equal(t, "key-bad", string(bad.Key))
	require.Equal(t, "orders", bad.SourceTopic)
	require.Equal(t, int32(0), bad.SourcePartition)
	require.Equal(t, int64(2), bad.SourceOffset)
	require.Equal(t, "shop", bad.Group)
	require.Equal(t, "cannot store bad", bad.Error)
	require.Equal(t, map[string]string{"origin": "test-bad"}, bad.Headers, "the record's own headers, without the dead-letter ones")
	require.Empty(t, bad.Replays)
	require.Equal(t, "panic", string(panicked.Value))
	require.Equal(t, int64(4), panicked.SourceOffset)
	require.Contains(t, panicked.Error, "handler panicked: handler bug")

	requireCommittedToEnd(t, prod, "shop", "orders")
	produceRecords(t, prod, "orders", "e")
	require.Eventually(t, func() bool { return slices.Contains(h.got(), "e") }, waitFor, tick, "records behind the bad ones are handled")

	n, ok := metrics.Value("flo.consumer.dead_lettered", attribute.String("topic", "orders"), attribute.String("group", "shop"))
	require.True(t, ok)
	require.EqualValues(t, 2, n)
}

func TestConsumerPoisonDoesNotRedoTheBatch(t *testing.T) {
	t.Parallel()
	broker := harness.NewBroker(t)
	prod := newProducer(t, broker.Addrs())
	require.NoError(t, kafka.EnsureTopics(t.Context(), prod, 1, "cmds"))
	produceRecords(t, prod, "cmds", "x", "garbage", "y", "junk", "z")

	var (
		mu   sync.Mutex
		seen []string
	)
	c, err := kafka.NewConsumer(broker.Kafka(), "decoder", []string{"cmds"}, func(_ context.Context, rs []*kgo.Record) error {
		mu.Lock()
		defer mu.Unlock()
		var poison []error
		for _, r := range rs {
			v := string(r.Value)
			if v == "garbage" || v == "junk" {
				poison = append(poison, kafka.Poison(r, fmt.Errorf("decode %q: not a command", v)))
				continue
			}
			seen = append(seen, v)
		}
		return errors.Join(poison...)
	}, quiet)
	require.NoError(t, err)
	run(t, c.Run)

	letters := deadLetters(t, broker.Addrs(), "cmds", 2)
	require.Equal(t, `decode "garbage": not a command`, letters[0].Error)
	require.Equal(t, int64(3), letters[1].SourceOffset)
	requireCommittedToEnd(t, prod, "decoder", "cmds")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"x", "y", "z"}, seen, "the good records are handled once: the batch is not run again")
}

func TestConsumerRetriesTransientFailuresWithoutDeadLettering(t *testing.T) {
	t.Parallel()
	broker := harness.NewBroker(t)
	prod := newProducer(t, broker.Addrs())
	require.NoError(t, kafka.EnsureTopics(t.Context(), prod, 1, "flaky"))
	produceRecords(t, prod, "flaky", "p", "q")

	var calls int
	var mu sync.Mutex
	col := &collector{}
	c, err := kafka.NewConsumer(broker.Kafka(), "patient", []string{"flaky"}, func(ctx context.Context, rs []*kgo.Record) error {
		mu.Lock()
		calls++
		n := calls
		mu.Unlock()
		switch n {
		case 1:
			return fmt.Errorf("begin: %w", &pgconn.PgError{Code: "40001", Message: "could not serialize access"})
		case 2:
			return fmt.Errorf("store: %w", &pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"})
		}
		require.False(t, kafka.Isolated(ctx), "transient failures retry the batch as it was")
		return col.handle(ctx, rs)
	}, quiet)
	require.NoError(t, err)
	run(t, c.Run)

	require.Eventually(t, func() bool { return len(col.got()) == 2 }, waitFor, tick)
	requireCommittedToEnd(t, prod, "patient", "flaky")
	require.Equal(t, []string{"p", "q"}, col.got())
	requireNoDeadLetterTopic(t, broker.Addrs(), "flaky")
}

func TestTailSkipsWhatFailsAlone(t *testing.T) {
	t.Parallel()
	broker := harness.NewBroker(t)
	prod := newProducer(t, broker.Addrs())
	require.NoError(t, kafka.EnsureTopics(t.Context(), prod, 1, "wakeups"))

	h := &storing{}
	startTail(t, broker.Addrs(), "wakeups", h.handle)
	produceRecords(t, prod, "wakeups", "a", "bad", "b", "panic", "c")
	require.Eventually(t, func() bool { return len(h.got()) == 3 }, waitFor, tick)
	require.Equal(t, []string{"a", "b", "c"}, h.got())
	produceRecords(t, prod, "wakeups", "d")
	require.Eventually(t, func() bool { return slices.Contains(h.got(), "d") }, waitFor, tick)
	requireNoDeadLetterTopic(t, broker.Addrs(), "wakeups")
}

func TestReplayPutsAFixedRecordBackOnce(t *testing.T) {
	t.Parallel()
	broker := harness.NewBroker(t)
	prod := newProducer(t, broker.Addrs())
	require.NoError(t, kafka.EnsureTopics(t.Context(), prod, 2, "payments"))

	var (
		mu       sync.Mutex
		known    = map[string]bool{"key-r1": true, "key-r3": true}
		handled  = map[string]int{}
		replayed map[string]string
	)
	c, err := kafka.NewConsumer(broker.Kafka(), "ledger", []string{"payments"}, func(_ context.Context, rs []*kgo.Record) error {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range rs {
			if !known[string(r.Key)] {
				return fmt.Errorf("account %s does not exist", r.Key)
			}
		}
		for _, r := range rs {
			handled[string(r.Value)]++
			if string(r.Value) == "r2" {
				replayed = map[string]string{}
				for _, h := range r.Headers {
					replayed[h.Key] = string(h.Value)
				}
			}
		}
		return nil
	}, quiet)
	require.NoError(t, err)
	run(t, c.Run)
	produceRecords(t, prod, "payments", "r1", "r2", "r3")

	letters := deadLetters(t, broker.Addrs(), "payments", 1)
	require.Equal(t, "r2", string(letters[0].Value))
	require.Equal(t, "account key-r2 does not exist", letters[0].Error)

	// The cause is fixed, then the record replayed.
	mu.Lock()
	known["key-r2"] = true
	mu.Unlock()
	dlq := kafka.DeadLetterTopic("payments")
	_, err = kafka.ReplayDeadLetters(t.Context(), broker.Kafka(), dlq, kafka.Selection{})
	require.ErrorContains(t, err, "name the offsets")
	_, err = kafka.ReplayDeadLetters(t.Context(), broker.Kafka(), dlq, kafka.Selection{Offsets: []int64{99}})
	require.ErrorContains(t, err, "no record at offset 99")
	done, err := kafka.ReplayDeadLetters(t.Context(), broker.Kafka(), dlq, kafka.Selection{Offsets: []int64{letters[0].Offset}})
	require.NoError(t, err)
	require.Len(t, done, 1)
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return handled["r2"] == 1 }, waitFor, tick)
	requireCommittedToEnd(t, prod, "ledger", "payments")

	after, err := kafka.ReadDeadLetters(t.Context(), broker.Kafka(), dlq)
	require.NoError(t, err)
	require.Len(t, after, 1, "the replay note is not a dead letter")
	require.Len(t, after[0].Replays, 1, "the replay shows")
	_, err = kafka.ReplayDeadLetters(t.Context(), broker.Kafka(), dlq, kafka.Selection{Offsets: []int64{letters[0].Offset}})
	require.ErrorContains(t, err, "was replayed at", "a second replay takes a deliberate flag")
	none, err := kafka.ReplayDeadLetters(t.Context(), broker.Kafka(), dlq, kafka.Selection{All: true})
	require.NoError(t, err)
	require.Empty(t, none, "all means all not replayed yet")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, map[string]int{"r1": 1, "r2": 1, "r3": 1}, handled)
	require.Equal(t, map[string]string{
		"origin":                 "test-r2", // the record's own headers go back, the dead-letter ones do not
		kafka.HeaderReplayedFrom: dlq + "/0/" + strconv.FormatInt(letters[0].Offset, 10),
	}, replayed)
}

func TestIsTransient(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"serialization failure", &pgconn.PgError{Code: "40001"}, true},
		{"deadlock", fmt.Errorf("tx: %w", &pgconn.PgError{Code: "40P01"}), true},
		{"connection exception", &pgconn.PgError{Code: "08006"}, true},
		{"admin shutdown", &pgconn.PgError{Code: "57P01"}, true},
		{"cannot connect now", &pgconn.PgError{Code: "57P03"}, true},
		{"too many connections", &pgconn.PgError{Code: "53300"}, true},
		{"disk full", &pgconn.PgError{Code: "53100"}, true},
		{"statement timeout", &pgconn.PgError{Code: "57014"}, true},
		{"connect failed", &pgconn.ConnectError{Config: &pgconn.Config{}}, true},
		{"connection reset", lost, true},
		{"attempt timed out", fmt.Errorf("exec: %w", ctx.Err()), true},
		{"retriable broker error", kerr.NotLeaderForPartition, true},
		{"nul in text", &pgconn.PgError{Code: "22021", Message: "invalid byte sequence for encoding \"UTF8\": 0x00"}, false},
		{"unique violation", &pgconn.PgError{Code: "23505"}, false},
		{"record too large", kerr.MessageTooLarge, false},
		{"anything else", errors.New("bad input"), false},
		{"nil", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, kafka.IsTransient(tc.err))
		})
	}
}
